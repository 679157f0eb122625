"""Quantisers and dequantisers for DeepSeek-style blockwise FP8.

Activations use 1x128 groups along K (one scale per row per K block); weights
use 128x128 blocks. A scale multiplies: value = q * scale. The scale of a group
is amax / 448 (448 is the largest finite float8_e4m3fn), so the group's largest
element maps to +-448 exactly.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_fp8.backends import BackendUnavailableError
from jax_fp8.pallas import device

BLOCK = 128
E4M3_MAX = 448.0
FP8 = jnp.float8_e4m3fn


def num_blocks(n: int) -> int:
  return -(-n // BLOCK)


def _pad_to_block(x: jax.Array, axis: int) -> jax.Array:
  pad = num_blocks(x.shape[axis]) * BLOCK - x.shape[axis]
  if pad == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)


def _scale_from_amax(amax: jax.Array, power_of_two: bool) -> jax.Array:
  scale = amax / E4M3_MAX
  # An all-zero (or all-underflowing) group gets scale 1: finite, and q = 0.
  scale = jnp.where(scale > 0, scale, jnp.ones_like(scale))
  if power_of_two:
    # Round up so that amax / scale stays <= 448 (UE8M0-compatible scales).
    scale = jnp.exp2(jnp.ceil(jnp.log2(scale)))
  return scale


def _check_float(x, name: str):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")


def quantize_1x128(x: jax.Array, *, power_of_two_scales: bool = False):
  """x [..., K] -> (q [..., K] float8_e4m3fn, scale [..., ceil(K/128)] float32)."""
  x = jnp.asarray(x)
  _check_float(x, "x")
  if x.ndim < 1:
    raise ValueError(f"x must have at least 1 dimension (the K axis), got shape {x.shape}")
  k = x.shape[-1]
  xf = _pad_to_block(x.astype(jnp.float32), -1)
  groups = xf.reshape(*x.shape[:-1], num_blocks(k), BLOCK)
  amax = jnp.max(jnp.abs(groups), axis=-1)
  scale = _scale_from_amax(amax, power_of_two_scales)
  q = jnp.clip(groups / scale[..., None], -E4M3_MAX, E4M3_MAX).astype(FP8)
  return q.reshape(xf.shape)[..., :k], scale


def quantize_128x128(w: jax.Array, *, power_of_two_scales: bool = False):
  """w [N, K] -> (q [N, K] float8_e4m3fn, scale [ceil(N/128), ceil(K/128)] float32)."""
  w = jnp.asarray(w)
  _check_float(w, "w")
  if w.ndim != 2:
    raise ValueError(f"w must be 2-D [N, K], got shape {w.shape}")
  n, k = w.shape
  wf = _pad_to_block(_pad_to_block(w.astype(jnp.float32), 0), 1)
  nb, kb = num_blocks(n), num_blocks(k)
  blocks = wf.reshape(nb, BLOCK, kb, BLOCK)
  amax = jnp.max(jnp.abs(blocks), axis=(1, 3))
  scale = _scale_from_amax(amax, power_of_two_scales)
  q = jnp.clip(blocks / scale[:, None, :, None], -E4M3_MAX, E4M3_MAX).astype(FP8)
  return q.reshape(wf.shape)[:n, :k], scale


def expand_1x128_scale(scale: jax.Array, k: int) -> jax.Array:
  """[..., ceil(K/128)] -> [..., K]: each group's scale repeated over its columns."""
  return jnp.repeat(scale, BLOCK, axis=-1)[..., :k]


def expand_128x128_scale(scale: jax.Array, n: int, k: int) -> jax.Array:
  """[ceil(N/128), ceil(K/128)] -> [N, K]."""
  return jnp.repeat(jnp.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]


def dequantize_1x128(q: jax.Array, scale: jax.Array, dtype=jnp.float32) -> jax.Array:
  k = q.shape[-1]
  if scale.shape != (*q.shape[:-1], num_blocks(k)):
    raise ValueError(
        f"scale must have shape q.shape[:-1] + (ceil(K/128),) = "
        f"{(*q.shape[:-1], num_blocks(k))}, got {scale.shape}")
  return (q.astype(jnp.float32) * expand_1x128_scale(scale.astype(jnp.float32), k)).astype(dtype)


def dequantize_128x128(q: jax.Array, scale: jax.Array, dtype=jnp.float32) -> jax.Array:
  if q.ndim != 2:
    raise ValueError(f"q must be 2-D [N, K], got shape {q.shape}")
  n, k = q.shape
  if scale.shape != (num_blocks(n), num_blocks(k)):
    raise ValueError(
        f"scale must have shape (ceil(N/128), ceil(K/128)) = "
        f"{(num_blocks(n), num_blocks(k))}, got {scale.shape}")
  return (q.astype(jnp.float32) * expand_128x128_scale(scale.astype(jnp.float32), n, k)).astype(dtype)


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


def _pallas_unavailable(op: str, x, shape) -> str | None:
  """Why the Pallas kernel cannot run `op` on x (as a 2-D array of `shape`) here, or None."""
  try:
    from jax_fp8.pallas import quantize as kernels
  except ImportError as e:
    return f"its module jax_fp8.pallas.quantize could not be imported ({e})"
  reason = kernels.unsupported_reason(op, shape, x.dtype)
  if reason is not None:
    return reason
  mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
  if mesh is not None and not mesh.empty and mesh.explicit_axes:
    return "x is sharded over Explicit mesh axes; the kernel takes whole arrays"
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
  # The kernel where the computation is lowered for the GPU, jnp elsewhere.
  return lax.platform_dependent(x, cuda=kernel_fn, default=jnp_fn)


def _kernels():
  from jax_fp8.pallas import quantize as kernels  # imported where it can run
  return kernels


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
    q, s = _kernels().quantize_1x128(x.reshape(-1, k), power_of_two_scales=pow2)
    return q.reshape(x.shape), s.reshape(*lead, s.shape[-1])

  return _dispatch("quantize_1x128", x, (x.size // max(k, 1), k), backend,
                   functools.partial(_jnp_quantize_1x128, power_of_two_scales=pow2), kernel)


def quantize_1x128_with_transpose(x: jax.Array, *, power_of_two_scales: bool = False,
                                  backend: str = "auto"):
  """x [T, K] -> (q [T, K], s [T, ceil(K/128)], q_t [K, T], s_t [K, ceil(T/128)]).

  q, s: 128-element groups along each row (as quantize_1x128(x)); q_t, s_t:
  128-element groups along each column (128 tokens of one feature), stored
  transposed (as quantize_1x128(x.T)), for the weight-gradient GEMM. The Pallas
  kernel reads x once. backend: as quantize_1x128.
  """
  x = jnp.asarray(x)
  _check_float(x, "x")
  if x.ndim != 2:
    raise ValueError(f"x must be 2-D [T, K], got shape {x.shape}")
  pow2 = power_of_two_scales
  return _dispatch(
      "quantize_1x128_with_transpose", x, x.shape, backend,
      functools.partial(_jnp_quantize_1x128_with_transpose, power_of_two_scales=pow2),
      lambda x: _kernels().quantize_1x128_with_transpose(x, power_of_two_scales=pow2))


def quantize_128x128(w: jax.Array, *, power_of_two_scales: bool = False, backend: str = "auto"):
  """w [N, K] -> (q [N, K] float8_e4m3fn, scale [ceil(N/128), ceil(K/128)] float32).

  backend: as quantize_1x128.
  """
  w = jnp.asarray(w)
  _check_float(w, "w")
  if w.ndim != 2:
    raise ValueError(f"w must be 2-D [N, K], got shape {w.shape}")
  pow2 = power_of_two_scales
  return _dispatch("quantize_128x128", w, w.shape, backend,
                   functools.partial(_jnp_quantize_128x128, power_of_two_scales=pow2),
                   lambda w: _kernels().quantize_128x128(w, power_of_two_scales=pow2))
