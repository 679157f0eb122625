"""Quantisers and dequantisers for DeepSeek-style blockwise FP8.

Activations use 1x128 groups along K (one scale per row per K block); weights
use 128x128 blocks. A scale multiplies: value = q * scale. The scale of a group
is amax / 448 (448 is the largest finite float8_e4m3fn), so the group's largest
element maps to +-448 exactly.

The rules, which every quantiser of the project (these jnp ones are the
reference; fused kernels must agree bitwise on scales) follows:
- amax = max |x| over the group, NaN-propagating (`group_amax`).
- scale = amax / 448 in float32 (a true division); a scale below float32's
  normal range (an all-zero group, or amax / 448 < 2^-126, which XLA on the CPU
  flushes to zero anyway) is 1.
- power_of_two_scales: the smallest power of two 2^e >= 2^-126 with
  amax <= 448 * 2^e, built from amax's exponent bits (exact); an all-zero group
  gets 1. Being normal, such a scale's float32 exponent field is its UE8M0 code.
- q = clip(x / scale, -448, 448) as float8_e4m3fn (round to nearest even).
- Non-finite input: a group holding a NaN gets scale NaN (its q are NaN); one
  holding +-Inf but no NaN gets scale +Inf (its finite q are 0, the Inf ones
  NaN). A non-finite input always shows in its group's scale.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_fp8 import quantize_sharding
from jax_fp8.backends import BackendUnavailableError
from jax_fp8.blocks import BLOCK, FP8, num_blocks  # noqa: F401 (num_blocks: part of this API)
from jax_fp8.pallas import device

E4M3_MAX = 448.0
MIN_NORMAL = float(np.finfo(np.float32).tiny)  # 2^-126

_ABS_BITS = 0x7FFFFFFF       # float32 without its sign bit
_MANTISSA_BITS = 0x7FFFFF
_MANTISSA_OF_1_75 = 0x600000  # 448 = 1.75 * 2^8


def _pad_to_block(x: jax.Array, axis: int) -> jax.Array:
  pad = num_blocks(x.shape[axis]) * BLOCK - x.shape[axis]
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def _divide(x: jax.Array, divisor) -> jax.Array:
  """x / divisor, a true (correctly rounded) float32 division.

  XLA rewrites a division by a constant or a broadcast as a multiplication by
  the rounded reciprocal, which rounds twice. A select of the divisor is
  neither, fuses the same, and changes no value (a NaN x gives NaN anyway).
  """
  return x / jnp.where(jnp.isnan(x), jnp.float32(jnp.nan), divisor)


def group_amax(x: jax.Array, axis) -> jax.Array:
  """max |x| over `axis` of float32 x; NaN if any element is NaN, else Inf if any is +-Inf.

  Compared as integers: float32 magnitudes order like their bit patterns, and
  every NaN pattern lies above +Inf's. Unlike a float max this propagates NaN
  on every platform and sees subnormals where XLA on the CPU treats them as 0.
  """
  bits = lax.bitcast_convert_type(x, jnp.int32) & _ABS_BITS
  amax = lax.bitcast_convert_type(jnp.max(bits, axis=axis), jnp.float32)
  return jnp.where(jnp.isnan(amax), jnp.float32(jnp.nan), amax)  # one canonical NaN


def scale_from_amax(amax: jax.Array, power_of_two: bool) -> jax.Array:
  """The float32 scale of groups with float32 `amax` (the rules in the module docstring)."""
  if not power_of_two:
    scale = _divide(amax, jnp.float32(E4M3_MAX))
    # Zero or subnormal: 1 (NaN < x is false: NaN and Inf stay).
    return jnp.where(scale < MIN_NORMAL, jnp.float32(1.0), scale)
  bits = lax.bitcast_convert_type(amax, jnp.int32)
  exponent = bits >> 23                      # biased; amax >= 0, so no sign bit
  mantissa = bits & _MANTISSA_BITS
  # amax = 1.m * 2^E <= 1.75 * 2^(e + 8) exactly when e >= E - 8 (1.m <= 1.75)
  # or e >= E - 7; the same in biased exponents. Subnormal amax: the clamp.
  biased = exponent - 8 + (mantissa > _MANTISSA_OF_1_75).astype(jnp.int32)
  biased = jnp.maximum(biased, 1)            # 2^-126 at least: a normal float32
  scale = lax.bitcast_convert_type(biased << 23, jnp.float32)
  scale = jnp.where(bits == 0, jnp.float32(1.0), scale)
  return jnp.where(jnp.isfinite(amax), scale, amax)   # Inf -> Inf, NaN -> NaN


def _to_e4m3(x: jax.Array, scale: jax.Array) -> jax.Array:
  """clip(x / scale, -448, 448) as e4m3, scale broadcast against x."""
  return jnp.clip(_divide(x, scale), -E4M3_MAX, E4M3_MAX).astype(FP8)


def _check_float(x, name: str):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")


def _as_array(x, name: str) -> jax.Array:
  try:
    return x if isinstance(x, jax.Array) else jnp.asarray(x)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{name} must be an array (or array-like), got {type(x).__name__}: {e}")


# ----------------------------------------------------- sharded inputs (Explicit axes)

def _explicit_axes(x) -> list[tuple[str, ...]] | None:
  """The mesh axes of each dimension of x if any is an Explicit one, else None."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  if mesh is None or mesh.empty or not mesh.explicit_axes:
    return None
  spec = list(sharding.spec) + [None] * (x.ndim - len(sharding.spec))
  axes = [tuple(e) if isinstance(e, (tuple, list)) else (() if e is None else (e,))
          for e in spec]
  explicit = set(mesh.explicit_axes)
  return axes if any(ax in explicit for entry in axes for ax in entry) else None


def _spec(axes) -> jax.sharding.PartitionSpec:
  return jax.sharding.PartitionSpec(
      *(None if not e else (e[0] if len(e) == 1 else e) for e in axes))


def _on_explicit_mesh(fn, x, blocked_dims, scale_shape):
  """fn(x) -> (q, scale). Under Explicit mesh axes, computed with those axes
  made Auto (the group reshapes cut shards apart): q sharded like x, the scale
  keeping a dimension's axes where its blocks divide evenly over them (a shard
  of 2816 rows over 4 devices holds 5.5 blocks: replicated)."""
  axes = _explicit_axes(x)
  if axes is None:
    return fn(x)
  sizes = dict(jax.typeof(x).sharding.mesh.shape)
  scale_axes = [() if d in blocked_dims and scale_shape[d] % math.prod(sizes[a] for a in e)
                else e for d, e in enumerate(axes)]
  return jax.sharding.auto_axes(fn, out_sharding=(_spec(axes), _spec(scale_axes)))(x)


def _dequantize_on_explicit_mesh(fn, q, scale):
  """fn(q, scale) -> out, sharded like q under Explicit mesh axes (the scale's
  repeat cannot follow a sharded block dimension)."""
  if _explicit_axes(q) is None and _explicit_axes(scale) is None:
    return fn(q, scale)
  axes = _explicit_axes(q) or [()] * q.ndim
  return jax.sharding.auto_axes(fn, out_sharding=_spec(axes))(q, scale)


# ----------------------------------------------------------------- quantisers

def quantize_1x128(x: jax.Array, *, power_of_two_scales: bool = False):
  """x [..., K] -> (q [..., K] float8_e4m3fn, scale [..., ceil(K/128)] float32)."""
  x = _as_array(x, "x")
  _check_float(x, "x")
  if x.ndim < 1:
    raise ValueError(f"x must have at least 1 dimension (the K axis), got shape {x.shape}")
  k = x.shape[-1]

  def quantize(x):
    xf = _pad_to_block(x.astype(jnp.float32), -1)
    groups = xf.reshape(*x.shape[:-1], num_blocks(k), BLOCK)
    scale = scale_from_amax(group_amax(groups, -1), power_of_two_scales)
    q = _to_e4m3(groups, scale[..., None])
    return q.reshape(xf.shape)[..., :k], scale

  return _on_explicit_mesh(quantize, x, {x.ndim - 1}, (*x.shape[:-1], num_blocks(k)))


def quantize_128x128(w: jax.Array, *, power_of_two_scales: bool = False):
  """w [N, K] -> (q [N, K] float8_e4m3fn, scale [ceil(N/128), ceil(K/128)] float32)."""
  w = _as_array(w, "w")
  _check_float(w, "w")
  if w.ndim != 2:
    raise ValueError(f"w must be 2-D [N, K], got shape {w.shape}")
  n, k = w.shape
  nb, kb = num_blocks(n), num_blocks(k)

  def quantize(w):
    wf = _pad_to_block(_pad_to_block(w.astype(jnp.float32), 0), 1)
    blocks = wf.reshape(nb, BLOCK, kb, BLOCK)
    scale = scale_from_amax(group_amax(blocks, (1, 3)), power_of_two_scales)
    q = _to_e4m3(blocks, scale[:, None, :, None])
    return q.reshape(wf.shape)[:n, :k], scale

  return _on_explicit_mesh(quantize, w, {0, 1}, (nb, kb))


def expand_1x128_scale(scale: jax.Array, k: int) -> jax.Array:
  """[..., ceil(K/128)] -> [..., K]: each group's scale repeated over its columns."""
  return jnp.repeat(scale, BLOCK, axis=-1)[..., :k]


def expand_128x128_scale(scale: jax.Array, n: int, k: int) -> jax.Array:
  """[ceil(N/128), ceil(K/128)] -> [N, K]."""
  return jnp.repeat(jnp.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]


def _check_dequantize_args(q, scale, dtype):
  q, scale = _as_array(q, "q"), _as_array(scale, "scale")
  _check_float(q, "q")
  _check_float(scale, "scale")
  try:
    ok = jnp.issubdtype(np.dtype(dtype), jnp.floating)
  except TypeError:
    ok = False
  if not ok:
    raise TypeError(f"dtype must be a floating-point dtype, got {dtype!r}")
  return q, scale


def dequantize_1x128(q: jax.Array, scale: jax.Array, dtype=jnp.float32) -> jax.Array:
  """q [..., K], scale [..., ceil(K/128)] -> q * scale as dtype [..., K]."""
  q, scale = _check_dequantize_args(q, scale, dtype)
  if q.ndim < 1:
    raise ValueError(f"q must have at least 1 dimension (the K axis), got shape {q.shape}")
  k = q.shape[-1]
  if scale.shape != (*q.shape[:-1], num_blocks(k)):
    raise ValueError(
        f"scale must have shape q.shape[:-1] + (ceil(K/128),) = "
        f"{(*q.shape[:-1], num_blocks(k))}, got {scale.shape}")
  return _dequantize_on_explicit_mesh(lambda q, scale: (
      q.astype(jnp.float32) * expand_1x128_scale(scale.astype(jnp.float32), k)).astype(dtype),
      q, scale)


def dequantize_128x128(q: jax.Array, scale: jax.Array, dtype=jnp.float32) -> jax.Array:
  """q [N, K], scale [ceil(N/128), ceil(K/128)] -> q * scale as dtype [N, K]."""
  q, scale = _check_dequantize_args(q, scale, dtype)
  if q.ndim != 2:
    raise ValueError(f"q must be 2-D [N, K], got shape {q.shape}")
  n, k = q.shape
  if scale.shape != (num_blocks(n), num_blocks(k)):
    raise ValueError(
        f"scale must have shape (ceil(N/128), ceil(K/128)) = "
        f"{(num_blocks(n), num_blocks(k))}, got {scale.shape}")
  return _dequantize_on_explicit_mesh(lambda q, scale: (
      q.astype(jnp.float32) * expand_128x128_scale(scale.astype(jnp.float32), n, k)
  ).astype(dtype), q, scale)


# ---- backends ----------------------------------------------------------------------
# The jnp versions above are the reference. On a Hopper or Blackwell GPU the fused
# Pallas kernels (jax_fp8.pallas.quantize: one read of the input, the same bits)
# take their place; backend="jnp" / "pallas" chooses explicitly.

QUANTIZE_BACKENDS = ("auto", "pallas", "jnp")
_jnp_quantize_1x128 = quantize_1x128
_jnp_quantize_128x128 = quantize_128x128


def _jnp_quantize_1x128_with_transpose(x, *, power_of_two_scales: bool = False):
  q, s = _jnp_quantize_1x128(x, power_of_two_scales=power_of_two_scales)
  q_t, s_t = _jnp_quantize_1x128(x.T, power_of_two_scales=power_of_two_scales)
  return q, s, q_t, s_t


def _jnp_quantize_128x128_with_transpose(w, *, power_of_two_scales: bool = False):
  q, s = _jnp_quantize_128x128(w, power_of_two_scales=power_of_two_scales)
  return q, s, q.T, s.T  # a 128x128 block grid is transpose-invariant


# Tests only (jax_fp8.testing.jnp_quantize_kernels): an object standing in for
# jax_fp8.pallas.quantize, taken by backend="pallas" and "auto" on any platform.
_stand_in_kernels = None


def _pallas_unavailable(op: str, x, shape) -> str | None:
  """Why the Pallas kernel cannot run `op` on x (as a 2-D array of `shape`) here, or None."""
  try:
    kernels = _kernels()
  except ImportError as e:
    return f"its module jax_fp8.pallas.quantize could not be imported ({e})"
  reason = kernels.unsupported_reason(op, shape, x.dtype)
  if reason is not None:
    return reason
  mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
  if mesh is not None and not mesh.empty and mesh.explicit_axes:
    return "x is sharded over Explicit mesh axes; the kernel takes whole arrays"
  if _stand_in_kernels is not None:
    return None
  cc = device.compute_capability()
  if cc is None and device.interpret_mode_active():
    return None
  if cc is None or cc[0] not in (9, 10):
    found = "no GPU" if cc is None else f"a GPU of compute capability {cc[0]}.{cc[1]}"
    return ("it needs an NVIDIA Hopper or Blackwell GPU (compute capability 9.x or 10.x), or "
            f"Pallas GPU interpret mode on the CPU; found {found}")
  return None


def _dispatch(op: str, x, shape, backend: str, jnp_fn, kernel_fn):
  """jnp_fn(x) or kernel_fn(x) (the Pallas kernel on x as a 2-D array of `shape`), as
  `backend` says."""
  if backend not in QUANTIZE_BACKENDS:
    raise ValueError(f"backend must be one of {QUANTIZE_BACKENDS}, got {backend!r}")
  if backend == "jnp" or x.size == 0:  # empty: nothing to launch
    return jnp_fn(x)
  reason = _pallas_unavailable(op, x, shape)
  if backend == "pallas" and reason is not None:
    raise BackendUnavailableError(f"backend='pallas' cannot run {op}: {reason}")
  if backend == "pallas":
    return kernel_fn(x)
  if reason is not None or device.interpret_mode_active():
    return jnp_fn(x)  # "auto" off the GPU: interpret mode is for explicit kernels
  if _stand_in_kernels is not None:
    return kernel_fn(x)  # tests: where the kernel would run, on any platform
  # The kernel where the computation is lowered for the GPU, jnp elsewhere.
  return lax.platform_dependent(x, cuda=kernel_fn, default=jnp_fn)


def _kernels():
  if _stand_in_kernels is not None:
    return _stand_in_kernels
  from jax_fp8.pallas import quantize as kernels  # imported where it can run
  return kernels


def _kernel(op: str, pow2: bool):
  """The kernel `op` on a 2-D x, partitioned over a device mesh shard by shard
  where the 128-groups allow (jax_fp8.quantize_sharding)."""
  def kernel(x):
    if _stand_in_kernels is None and device.interpret_mode_active():
      # Interpret mode traces the kernel with ordered effects (its callbacks), which
      # a primitive's lowering cannot thread: it runs whole, as a plain call.
      return quantize_sharding.call_kernel(_kernels(), op, pow2, x)
    return quantize_sharding.quantize(op, x, pow2=pow2, kernels=_kernels())
  return kernel


def quantize_1x128(x: jax.Array, *, power_of_two_scales: bool = False, backend: str = "auto"):
  """x [..., K] -> (q [..., K] float8_e4m3fn, scale [..., ceil(K/128)] float32).

  backend: "auto" (the Pallas kernel on a Hopper or Blackwell GPU, else jnp),
  "pallas" (BackendUnavailableError where it cannot run; on the CPU it runs in
  Pallas GPU interpret mode when that mode is on) or "jnp".
  """
  x = jnp.asarray(x)
  _check_float(x, "x")
  if x.ndim < 1:
    raise ValueError(f"x must have at least 1 dimension (the K axis), got shape {x.shape}")
  *lead, k = x.shape
  pow2 = power_of_two_scales

  def kernel(x):  # leading dims fold into the kernel's rows
    q, s = _kernel("quantize_1x128", pow2)(x.reshape(-1, k))
    return q.reshape(x.shape), s.reshape(*lead, s.shape[-1])

  return _dispatch("quantize_1x128", x, (x.size // max(k, 1), k), backend,
                   functools.partial(_jnp_quantize_1x128, power_of_two_scales=pow2), kernel)


def _quantize_2d(op: str, x, name: str, layout: str, backend: str, pow2: bool, jnp_fn,
                 kernel_check: str | None = None):
  """A 2-D quantiser: the input checked, then the jnp version or the kernel `op`
  (`kernel_check`: the kernel op whose limits apply, if not `op`'s own)."""
  x = jnp.asarray(x)
  _check_float(x, name)
  if x.ndim != 2:
    raise ValueError(f"{name} must be 2-D {layout}, got shape {x.shape}")
  return _dispatch(kernel_check or op, x, x.shape, backend,
                   functools.partial(jnp_fn, power_of_two_scales=pow2), _kernel(op, pow2))


def quantize_1x128_with_transpose(x: jax.Array, *, power_of_two_scales: bool = False,
                                  backend: str = "auto"):
  """x [T, K] -> (q [T, K], s [T, ceil(K/128)], q_t [K, T], s_t [K, ceil(T/128)]).

  q, s: 128-element groups along each row (as quantize_1x128(x)); q_t, s_t:
  128-element groups along each column (128 tokens of one feature), stored
  transposed (as quantize_1x128(x.T)), for the weight-gradient GEMM. The Pallas
  kernel reads x once. backend: as quantize_1x128.
  """
  return _quantize_2d("quantize_1x128_with_transpose", x, "x", "[T, K]", backend,
                      power_of_two_scales, _jnp_quantize_1x128_with_transpose)


def quantize_128x128(w: jax.Array, *, power_of_two_scales: bool = False, backend: str = "auto"):
  """w [N, K] -> (q [N, K] float8_e4m3fn, scale [ceil(N/128), ceil(K/128)] float32).

  backend: as quantize_1x128.
  """
  return _quantize_2d("quantize_128x128", w, "w", "[N, K]", backend, power_of_two_scales,
                      _jnp_quantize_128x128)


def quantize_128x128_with_transpose(w: jax.Array, *, power_of_two_scales: bool = False,
                                    backend: str = "auto"):
  """w [N, K] -> (q [N, K], s [ceil(N/128), ceil(K/128)], q_t [K, N], s_t = s.T).

  quantize_128x128(w) and its transpose (exact: a 128x128 block grid is
  transpose-invariant), both FP8 copies written from one read of w by the
  Pallas kernel; jax_fp8.dense's forward (b = q_t, K-major) and dgrad (b = q)
  take one each. backend: as quantize_1x128.
  """
  return _quantize_2d("quantize_128x128_with_transpose", w, "w", "[N, K]", backend,
                      power_of_two_scales, _jnp_quantize_128x128_with_transpose,
                      kernel_check="quantize_128x128")
