"""Which implementation runs a `blockwise_fp8_dot`, per platform and shape.

Every kernel module exposes the same two functions on 2-D operands:

    unsupported_reason(m, n, k, *, out_dtype, has_c) -> str | None
    blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype) -> [M, N]

"auto" takes the first backend of its platform's list that supports the device
and the shape; an explicit backend that cannot run raises BackendUnavailableError
saying why (never a silent substitution).
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

import jax
from jax._src import config as jax_config

from jax_fp8 import reference

NAMES = ("auto", "reference", "pallas_sm90", "pallas_sm100", "ffi")

_KERNEL_MODULES = {
    "pallas_sm90": "jax_fp8.pallas.hopper",
    "pallas_sm100": "jax_fp8.pallas.blackwell",
    "ffi": "jax_fp8.ffi",
}
# Compute capabilities each backend's code is built for.
_ARCH_RULE = {
    "pallas_sm90": (lambda cc: cc[0] == 9, "an NVIDIA Hopper GPU (compute capability 9.x, sm_90a)"),
    "pallas_sm100": (lambda cc: cc[0] == 10, "an NVIDIA Blackwell GPU (compute capability 10.x, sm_100a)"),
    "ffi": (lambda cc: cc >= (8, 9), "an NVIDIA GPU with FP8 tensor cores (compute capability >= 8.9)"),
}


class BackendUnavailableError(ValueError):
  """An explicitly requested backend cannot run this call; the message says why."""


def gpu_interpret_mode_active() -> bool:
  """True inside plgpu.force_gpu_interpret_mode(...) (Pallas GPU kernels run on the CPU)."""
  params = jax_config.pallas_tpu_interpret_mode_context_manager.value
  return type(params).__name__ == "InterpretGPUParams"


def device_compute_capability() -> tuple[int, int]:
  """The first local CUDA device's compute capability; (9, 0) when none is attached.

  Lowering for "cuda" on a machine without a GPU (a CI smoke test) assumes
  Hopper, as Mosaic GPU itself does.
  """
  try:
    devices = jax.local_devices(backend="gpu")
  except RuntimeError:
    devices = []
  if not devices:
    return (9, 0)
  major, minor = str(devices[0].compute_capability).split(".")
  return int(major), int(minor)


@functools.cache
def _kernel_module(name: str):
  """The kernel module, or the reason it cannot be imported (e.g. no Mosaic GPU)."""
  try:
    return importlib.import_module(_KERNEL_MODULES[name]), None
  except ImportError as e:
    return None, f"its module {_KERNEL_MODULES[name]} could not be imported ({e})"


def _reason_unavailable(name, platform, m, n, k, out_dtype, has_c) -> str | None:
  """None if `name` can run here, else why not."""
  if name == "reference":
    return None
  if name in ("pallas_sm90", "pallas_sm100"):
    if platform == "cpu" and not gpu_interpret_mode_active():
      return (f"backend={name!r} needs {_ARCH_RULE[name][1]}, or Pallas GPU interpret mode "
              "on the CPU (plgpu.force_gpu_interpret_mode(...)); this call is lowered for the CPU")
  elif platform == "cpu":
    return f"backend={name!r} needs {_ARCH_RULE[name][1]}; this call is lowered for the CPU"
  if platform == "cuda":
    arch_ok, arch_text = _ARCH_RULE[name]
    cc = device_compute_capability()
    if not arch_ok(cc):
      return f"backend={name!r} needs {arch_text}, but the GPU has compute capability {cc[0]}.{cc[1]}"
  elif platform != "cpu":
    return f"backend={name!r} does not support platform {platform!r}"
  module, import_error = _kernel_module(name)
  if module is None:
    return f"backend={name!r} is unavailable: {import_error}"
  reason = module.unsupported_reason(m, n, k, out_dtype=out_dtype, has_c=has_c)
  return None if reason is None else f"backend={name!r} cannot run this call: {reason}"


def _auto_order(platform: str) -> tuple[str, ...]:
  if platform != "cuda":
    return ("reference",)
  major = device_compute_capability()[0]
  pallas = {9: ("pallas_sm90",), 10: ("pallas_sm100",)}.get(major, ())
  return (*pallas, "ffi", "reference")


def select(platform: str, backend: str, m: int, n: int, k: int, *, out_dtype,
           has_c: bool) -> tuple[str, Callable]:
  """(name, 2-D implementation) of the backend that runs this call."""
  if min(m, n, k) == 0:  # Empty problems have nothing to launch.
    return "reference", reference.blockwise_fp8_dot
  candidates = _auto_order(platform) if backend == "auto" else (backend,)
  for name in candidates:
    reason = _reason_unavailable(name, platform, m, n, k, out_dtype, has_c)
    if reason is None:
      if name == "reference":
        return name, reference.blockwise_fp8_dot
      return name, _kernel_module(name)[0].blockwise_fp8_dot
    if backend != "auto":
      raise BackendUnavailableError(reason)
  raise AssertionError("the reference backend is always available")
