"""The reference computation in jnp: the CPU implementation and the fallback.

Dequantising first and then taking one float32 dot is the same sum as the
per-block contract: q * scale is exact in float32 for e4m3 values with any
float32 scale short of overflow, up to one rounding of the scale product.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_fp8 import quantize


def b_scale_per_row(b_scale, n: int, b_scale_rows: int = 128) -> jax.Array:
  """b's scales as one row of K-group scales per row of b: [N, ceil(K/128)].

  b_scale_rows=128: b_scale is [ceil(N/128), ceil(K/128)] (128x128 blocks),
  each block row repeated over its 128 rows of b; 1: b_scale already is [N, kb].
  """
  if b_scale_rows == 1:
    return b_scale
  return jnp.repeat(b_scale, quantize.BLOCK, axis=0)[:n]


def blockwise_fp8_dot(a, a_scale, b, b_scale, c=None, *, beta: float = 1.0,
                      out_dtype=jnp.bfloat16, b_scale_rows: int = 128) -> jax.Array:
  """a [..., M, K], b [N, K] -> [..., M, N]; see jax_fp8.blockwise_fp8_dot.

  b_scale_rows: 128 for 128x128 b scales, 1 for per-row b scales [N, ceil(K/128)].
  """
  n, k = b.shape
  a32 = a.astype(jnp.float32) * quantize.expand_1x128_scale(a_scale, k)
  b32 = b.astype(jnp.float32) * quantize.expand_1x128_scale(
      b_scale_per_row(b_scale, n, b_scale_rows), k)
  acc = lax.dot_general(
      a32, b32, (((a32.ndim - 1,), (1,)), ((), ())),
      precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  if c is not None:
    acc = acc + jnp.float32(beta) * c.astype(jnp.float32)
  return acc.astype(out_dtype)


def unsupported_reason(op, m, n, k, **problem):
  """The reference runs every operation on any platform (jax_fp8.backends' protocol)."""
  del op, m, n, k, problem
  return None
