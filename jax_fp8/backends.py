"""Which implementation runs an operation, per platform and problem.

Each backend is one `Backend` record: the module that implements it and the
GPUs its code is built for. A backend module implements an operation as a
function of the operation's name on 2-D (folded) operands, e.g.

    blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype, b_scale_rows=128)
        -> [M, N]

and says whether it can take a problem:

    unsupported_reason(op, m, n, k, *, out_dtype, has_c, **problem) -> str | None

Problem keywords of blockwise_fp8_dot beyond m, n, k, out_dtype, has_c:
- b_scale_rows: 128 (b_scale [ceil(N/128), ceil(K/128)], 128x128 blocks) or 1
  (b_scale [N, ceil(K/128)], per-row scales). The op passes it to the kernel
  function as a keyword only where it is not the default, and a kernel
  function without that keyword is refused for it (below), so a kernel module
  that predates a keyword keeps running the default problems.

"auto" takes the first backend of `BACKENDS` that supports the device and the
problem; an explicit backend that cannot run raises BackendUnavailableError
saying why (never a silent substitution).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from typing import Callable

import numpy as np

from jax_fp8.pallas import device


class BackendUnavailableError(ValueError):
  """An explicitly requested backend cannot run this call; the message says why."""


@dataclasses.dataclass(frozen=True)
class Backend:
  """One implementation of jax_fp8's operations."""
  name: str
  module: str                                  # implements the ops and unsupported_reason
  arch: Callable[[tuple[int, int]], bool] | None = None   # None: any platform
  needs: str = ""                              # what `arch` asks for, in words
  interpretable: bool = False                  # runs on the CPU in Pallas GPU interpret mode
  symbolic_shapes: bool = False                # takes symbolic M (jax.export shape polymorphism)

  def reason_unavailable(self, platform: str, explicit: bool = True) -> str | None:
    """Why this backend cannot run on `platform` here (device and mode), or None.
    explicit: the call names it. Pallas GPU interpret mode runs a named kernel on the
    host whatever the platform (a Blackwell kernel on a Hopper machine too); "auto"
    still picks by the GPU's generation there."""
    if self.arch is None:
      return None
    if (self.interpretable and explicit and platform in ("cpu", "cuda")
        and device.interpret_mode_active()):
      return None
    if platform == "cpu":
      also = (", or Pallas GPU interpret mode on the CPU (plgpu.force_gpu_interpret_mode(...))"
              if self.interpretable else "")
      return f"backend={self.name!r} needs {self.needs}{also}; this call is lowered for the CPU"
    if platform != "cuda":
      return f"backend={self.name!r} does not support platform {platform!r}"
    cc = device.target_compute_capability()
    if not self.arch(cc):
      return (f"backend={self.name!r} needs {self.needs}, but the GPU has compute capability "
              f"{cc[0]}.{cc[1]}")
    return None


# In the order "auto" tries them: the Pallas kernel of the GPU's generation,
# then the CUDA fallback, then the reference, which runs anywhere.
BACKENDS = {b.name: b for b in (
    Backend("pallas_sm90", "jax_fp8.pallas.sm90", lambda cc: cc[0] == 9,
            "an NVIDIA Hopper GPU (compute capability 9.x, sm_90a)", interpretable=True),
    Backend("pallas_sm100", "jax_fp8.pallas.sm100", lambda cc: cc[0] == 10,
            "an NVIDIA Blackwell GPU (compute capability 10.x, sm_100a)", interpretable=True),
    Backend("ffi", "jax_fp8.ffi", lambda cc: cc >= (8, 9),
            "an NVIDIA GPU with FP8 tensor cores (compute capability >= 8.9)"),
    Backend("reference", "jax_fp8.reference", symbolic_shapes=True),
)}
NAMES = ("auto", *BACKENDS)
# Problem keywords that an op's kernel function also receives, with the value
# a kernel that does not name them implements.
KERNEL_KEYWORDS = {"blockwise_fp8_dot": {"b_scale_rows": 128}}
PALLAS = tuple(name for name, b in BACKENDS.items() if b.interpretable)


@functools.cache
def _module(name: str):
  """The backend's module, or the reason it cannot be imported (e.g. no Mosaic GPU)."""
  path = BACKENDS[name].module
  try:
    return importlib.import_module(path), None
  except ImportError as e:
    return None, f"its module {path} could not be imported ({e})"


def _reason_unavailable(backend: Backend, platform: str, op: str, problem: dict,
                        explicit: bool) -> str | None:
  """None if `backend` can run this problem here, else why not."""
  reason = backend.reason_unavailable(platform, explicit)
  if reason is not None:
    return reason
  symbolic = [f"{d.upper()} = {problem[d]}" for d in ("m", "n", "k") if not is_static(problem[d])]
  if symbolic and not backend.symbolic_shapes:
    return (f"backend={backend.name!r} needs static shapes, but {', '.join(symbolic)} is "
            "symbolic (jax.export shape polymorphism); export one static shape per size, or "
            "use backend='reference'")
  module, import_error = _module(backend.name)
  if module is None:
    return f"backend={backend.name!r} is unavailable: {import_error}"
  if not hasattr(module, op):
    return f"backend={backend.name!r} has no {op} kernel"
  reason = module.unsupported_reason(op, **problem)
  missing = _missing_keywords(getattr(module, op), op, problem)
  if reason is None and missing:
    reason = f"its {op} kernel does not take " + ", ".join(
        f"{key}={problem[key]!r}" for key in missing)
  return None if reason is None else f"backend={backend.name!r} cannot run this call: {reason}"


def is_static(dim) -> bool:
  """False for a symbolic dimension (jax.export), which only the reference can take."""
  return isinstance(dim, (int, np.integer))


def _missing_keywords(fn, op: str, problem: dict) -> list[str]:
  """Kernel keywords of `problem` with a non-default value that `fn` has no parameter for."""
  wanted = [key for key, default in KERNEL_KEYWORDS.get(op, {}).items()
            if problem.get(key, default) != default]
  if not wanted:
    return []
  params = inspect.signature(fn).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    return []
  return [key for key in wanted if key not in params]


def select(platform: str, backend: str, op: str = "blockwise_fp8_dot", **problem
           ) -> tuple[str, Callable]:
  """(name, 2-D implementation of `op`) of the backend that runs this call.

  problem: m, n, k, out_dtype, has_c and what else the op's kernels need to
  decide (every backend module's unsupported_reason takes them by keyword).
  """
  if any(is_static(problem[d]) and problem[d] == 0 for d in ("m", "n", "k")):
    backend = "reference"  # Empty problems have nothing to launch.
  if backend == "auto":
    # Off the GPU only what runs natively there: interpret mode is for explicit kernels.
    names = tuple(n for n, b in BACKENDS.items() if platform == "cuda" or b.arch is None)
  else:
    names = (backend,)
  for name in names:
    reason = _reason_unavailable(BACKENDS[name], platform, op, problem, backend != "auto")
    if reason is None:
      return name, getattr(_module(name)[0], op)
    if backend != "auto":
      raise BackendUnavailableError(reason)
  raise AssertionError("the reference backend is always available")
