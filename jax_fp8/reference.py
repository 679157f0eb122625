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


def _block_dot(a_blk, b_blk):
  """[M, 128] x [N, 128] -> [M, N] in float32 (e4m3 products are exact in float32)."""
  return lax.dot_general(a_blk.astype(jnp.float32), b_blk.astype(jnp.float32),
                         (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                         preferred_element_type=jnp.float32)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c=None, *, beta: float = 1.0,
                      out_dtype=jnp.bfloat16) -> jax.Array:
  """a [..., M, K], b [N, K] -> [..., M, N]; see jax_fp8.blockwise_fp8_dot.

  M and the batch dims may be symbolic (jax.export); N and K are static.
  """
  *batch, m, k = a.shape
  n = b.shape[0]
  kb = quantize.num_blocks(k)
  a = a.reshape(-1, k)
  a_scale = a_scale.reshape(-1, kb).astype(jnp.float32)
  # Per output column, the scale of its 128-row block of b: [N, kb].
  b_scale_rows = jnp.repeat(b_scale.astype(jnp.float32), BLOCK, axis=0)[:n]
  if kb == 1:
    acc = _block_dot(a, b) * (a_scale[:, :1] * b_scale_rows[:, 0][None, :])
  else:
    a = quantize._pad_to_block(a, 1)  # zeros past K add nothing to the last block
    b = quantize._pad_to_block(b, 1)

    def step(j, acc):
      a_blk = lax.dynamic_slice_in_dim(a, j * BLOCK, BLOCK, axis=1)
      b_blk = lax.dynamic_slice_in_dim(b, j * BLOCK, BLOCK, axis=1)
      sa = lax.dynamic_slice_in_dim(a_scale, j, 1, axis=1)            # [M, 1]
      sb = lax.dynamic_slice_in_dim(b_scale_rows, j, 1, axis=1)[:, 0]  # [N]
      return acc + _block_dot(a_blk, b_blk) * (sa * sb[None, :])

    acc = lax.fori_loop(0, kb, step, jnp.zeros((a.shape[0], n), jnp.float32))
  if c is not None:
    acc = acc + jnp.float32(beta) * c.reshape(-1, n).astype(jnp.float32)
  return acc.astype(out_dtype).reshape(*batch, m, n)


def unsupported_reason(op, m, n, k, **problem):
  """The reference runs every operation on any platform (jax_fp8.backends' protocol)."""
  del op, m, n, k, problem
  return None
