"""The machine a benchmark runs on: the GPU if there is one, and what to call it."""
from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform as _platform
import sys

import jax

# What lowering for CUDA assumes without a GPU (so the Pallas kernel run in GPU
# interpret mode on the CPU is the Hopper one), as Mosaic GPU does.
ASSUMED_COMPUTE_CAPABILITY = (9, 0)


def gpu_devices() -> list:
  """The local CUDA devices jax sees (empty on a CPU-only machine)."""
  try:
    return [d for d in jax.local_devices(backend="gpu") if d.platform == "gpu"]
  except RuntimeError:
    return []


@dataclasses.dataclass(frozen=True)
class Env:
  """The device under test: the first GPU, or None (the CPU)."""
  gpu: object = None

  @property
  def on_gpu(self) -> bool:
    return self.gpu is not None

  @property
  def platform(self) -> str:
    """The lowering platform, as jax_fp8.backends.select names it."""
    return "cuda" if self.on_gpu else "cpu"

  @property
  def compute_capability(self) -> tuple[int, int] | None:
    if self.gpu is None:
      return None
    major, minor = str(getattr(self.gpu, "compute_capability", "0.0")).split(".")[:2]
    return int(major), int(minor)

  @property
  def target_compute_capability(self) -> tuple[int, int]:
    """The GPU's compute capability, else the one code for CUDA is built for."""
    return self.compute_capability or ASSUMED_COMPUTE_CAPABILITY

  @property
  def sm_count(self) -> int | None:
    return getattr(self.gpu, "core_count", None) if self.gpu is not None else None

  def description(self) -> str:
    if self.gpu is None:
      cpu = _platform.processor() or _platform.machine()
      return f"CPU ({cpu}, {os.cpu_count()} cores), no GPU"
    cc = getattr(self.gpu, "compute_capability", "?")
    sms = getattr(self.gpu, "core_count", "?")
    return f"{self.gpu.device_kind} (compute capability {cc}, {sms} SMs)"


def detect() -> Env:
  devices = gpu_devices()
  return Env(devices[0] if devices else None)


def package_version(name: str) -> str | None:
  """The version of an installed package (without importing it), or None."""
  module = sys.modules.get(name)
  if module is not None and hasattr(module, "__version__"):
    return str(module.__version__)
  try:
    return importlib.metadata.version(name)
  except Exception:  # noqa: BLE001 (not installed, or broken metadata)
    return None
