"""Every question jax_fp8 asks of the device, in one place.

The kernels, the backend choice (jax_fp8.backends), the FFI fallback, the
tests and the benchmarks all ask here: which GPU is attached, its compute
capability and SM count, and whether Pallas GPU kernels run on the CPU in GPU
interpret mode. Nothing here imports Mosaic GPU, so the answer is available
where Pallas GPU is not.
"""
from __future__ import annotations

import jax
from jax._src import config as jax_config

# What lowering for CUDA assumes without a GPU (a CI smoke test), as Mosaic GPU does.
ASSUMED_COMPUTE_CAPABILITY = (9, 0)


def gpus() -> list:
  """The local CUDA devices jax sees (empty on a CPU-only machine)."""
  try:
    return [d for d in jax.local_devices(backend="gpu") if d.platform == "gpu"]
  except RuntimeError:
    return []


def compute_capability() -> tuple[int, int] | None:
  """(major, minor) of the first local GPU, or None without one."""
  devices = gpus()
  if not devices:
    return None
  major, minor = str(devices[0].compute_capability).split(".")
  return int(major), int(minor)


def target_compute_capability() -> tuple[int, int]:
  """The compute capability code is built for: the GPU's, else what lowering assumes."""
  return compute_capability() or ASSUMED_COMPUTE_CAPABILITY


def num_sms(default: int) -> int:
  """SMs of the first GPU; `default` where there is none (lowering on a CPU)."""
  devices = gpus()
  if devices and getattr(devices[0], "core_count", None):
    return int(devices[0].core_count)
  return default


def interpret_mode_active() -> bool:
  """True inside plgpu.force_gpu_interpret_mode(...) (Pallas GPU kernels run on the CPU)."""
  params = jax_config.pallas_tpu_interpret_mode_context_manager.value
  return type(params).__name__ == "InterpretGPUParams"


def device_name() -> str:
  """What kernel timings depend on: the GPU model, or the CPU in interpret mode."""
  devices = gpus()
  if devices and not interpret_mode_active():
    return devices[0].device_kind
  return "cpu (GPU interpret mode)"
