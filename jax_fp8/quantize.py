"""Quantisers and dequantisers for DeepSeek-style blockwise FP8.

Activations use 1x128 groups along K (one scale per row per K block); weights
use 128x128 blocks. A scale multiplies: value = q * scale. The scale of a group
is amax / 448 (448 is the largest finite float8_e4m3fn), so the group's largest
element maps to +-448 exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

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


def quantize_1x128_with_transpose(x: jax.Array, *, power_of_two_scales: bool = False):
  """Row-wise and column-wise 1x128 quantisation of a 2-D x [T, K] (the training recipe).

  Returns (q, s, q_t, s_t):
    q [T, K] float8_e4m3fn, s [T, ceil(K/128)] float32: 1x128 groups along K
      (what `quantize_1x128(x)` returns);
    q_t [K, T] float8_e4m3fn, s_t [K, ceil(T/128)] float32: 1x128 groups along
      the token axis T, stored transposed (what `quantize_1x128(x.T)` returns),
      the K-major layout the weight-gradient GEMM contracts over tokens with.
  Both follow quantize_1x128's scale rules exactly. This is the jnp reference;
  a fused kernel reads x once for both.
  """
  x = jnp.asarray(x)
  _check_float(x, "x")
  if x.ndim != 2:
    raise ValueError(f"x must be 2-D [T, K], got shape {x.shape}")
  q, s = quantize_1x128(x, power_of_two_scales=power_of_two_scales)
  q_t, s_t = quantize_1x128(x.T, power_of_two_scales=power_of_two_scales)
  return q, s, q_t, s_t
