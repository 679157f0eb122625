"""Shared pytest set-up.

Eight virtual CPU devices are configured before jax initialises, so that the
sharding tests can build a (2, 4) mesh; single-device tests are unaffected.
GPU-only tests use the `requires_gpu(...)` marker helpers below and skip
elsewhere (CI has no GPU).
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", False)

from jax_fp8.pallas.device import compute_capability as gpu_compute_capability  # noqa: E402


def requires_gpu(min_cc=(8, 9), major=None):
  cc = gpu_compute_capability()
  ok = cc is not None and cc >= tuple(min_cc) and (major is None or cc[0] == major)
  what = f"compute capability {major}.x" if major is not None else f">= {min_cc}"
  return pytest.mark.skipif(not ok, reason=f"needs an NVIDIA GPU with {what} (found {cc})")


@pytest.fixture
def autotune_cache(tmp_path, monkeypatch):
  """A fresh autotune cache file (its path), tuning off, and no cached entries in
  memory before or after the test."""
  from jax_fp8.pallas import autotune
  path = tmp_path / "autotune.json"
  monkeypatch.setenv("JAX_FP8_AUTOTUNE_CACHE", str(path))
  monkeypatch.delenv("JAX_FP8_AUTOTUNE", raising=False)
  autotune.clear_memory()
  yield path
  autotune.clear_memory()
