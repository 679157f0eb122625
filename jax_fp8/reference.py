"""The reference computation in jnp: the CPU implementation and the fallback.

It follows the contract literally, one K block at a time: the block's dot
product in float32, times the product of the two scales, added to a float32
[M, N] accumulator. Scales are never multiplied into the operands first, so
a_scale * b_scale = 2^-120 * 2^120 is exactly 1, and an infinite scale times a
negative block sum is -inf, as in the kernels.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_fp8 import quantize

BLOCK = quantize.BLOCK


def _by_block(x: jax.Array, k: int) -> jax.Array:
  """[R, K] -> [ceil(K/128), R, 128]: K blocks first (zeros past K add nothing)."""
  kb = quantize.num_blocks(k)
  x = quantize._pad_to_block(x, 1)
  return x.reshape(x.shape[0], kb, BLOCK).transpose(1, 0, 2)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c=None, *, beta: float = 1.0,
                      out_dtype=jnp.bfloat16) -> jax.Array:
  """a [..., M, K], b [N, K] -> [..., M, N]; see jax_fp8.blockwise_fp8_dot.

  M and the batch dims may be symbolic (jax.export); N and K are static.
  """
  *batch, m, k = a.shape
  n = b.shape[0]
  kb = quantize.num_blocks(k)
  a_scale = a_scale.reshape(-1, kb).astype(jnp.float32).T               # [kb, M]
  # Per output column, the scale of its 128-row block of b: [kb, N].
  b_scale = jnp.repeat(b_scale.astype(jnp.float32), BLOCK, axis=0)[:n].T

  def step(acc, block):
    a_blk, b_blk, sa, sb = block
    block_sum = lax.dot_general(  # e4m3 products are exact in float32
        a_blk.astype(jnp.float32), b_blk.astype(jnp.float32), (((1,), (1,)), ((), ())),
        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return acc + block_sum * (sa[:, None] * sb[None, :]), None

  blocks = (_by_block(a.reshape(-1, k), k), _by_block(b, k), a_scale, b_scale)
  acc, _ = lax.scan(step, jnp.zeros((a_scale.shape[1], n), jnp.float32), blocks)
  if c is not None:
    acc = acc + jnp.float32(beta) * c.reshape(-1, n).astype(jnp.float32)
  return acc.astype(out_dtype).reshape(*batch, m, n)


def unsupported_reason(op, m, n, k, **problem):
  """The reference runs every operation on any platform (jax_fp8.backends' protocol)."""
  del op, m, n, k, problem
  return None
