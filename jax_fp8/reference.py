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


def blockwise_fp8_dot(a, a_scale, b, b_scale, c=None, *, beta: float = 1.0,
                      out_dtype=jnp.bfloat16) -> jax.Array:
  """a [..., M, K], b [N, K] -> [..., M, N]; see jax_fp8.blockwise_fp8_dot."""
  n, k = b.shape
  a32 = a.astype(jnp.float32) * quantize.expand_1x128_scale(a_scale, k)
  b32 = b.astype(jnp.float32) * quantize.expand_128x128_scale(b_scale, n, k)
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
