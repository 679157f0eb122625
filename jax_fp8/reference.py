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


def b_scale_per_row(b_scale, n: int, b_scale_rows: int = 128) -> jax.Array:
  """b's scales as one row of K-group scales per row of b: [N, ceil(K/128)].

  b_scale_rows=128: b_scale is [ceil(N/128), ceil(K/128)] (128x128 blocks),
  each block row repeated over its 128 rows of b; 1: b_scale already is [N, kb].
  """
  if b_scale_rows == 1:
    return b_scale
  return jnp.repeat(b_scale, quantize.BLOCK, axis=0)[:n]


def blockwise_fp8_dot(a, a_scale, b, b_scale, c=None, *, beta: float = 1.0,
                      out_dtype=jnp.bfloat16, b_scale_rows: int = 128,
                      power_of_two_scales: bool = False) -> jax.Array:
  """a [..., M, K], b [N, K] -> [..., M, N]; see jax_fp8.blockwise_fp8_dot.

  b_scale_rows: 128 for 128x128 b scales, 1 for per-row b scales [N, ceil(K/128)].
  out_dtype float8_e4m3fn: (q, scale), the float32 result quantised 1x128.
  M and the batch dims may be symbolic (jax.export); N and K are static.
  """
  *batch, m, k = a.shape
  n = b.shape[0]
  kb = quantize.num_blocks(k)
  a_scale = a_scale.reshape(-1, kb).astype(jnp.float32).T               # [kb, M]
  # Per output column, the scale of its row of b: [kb, N].
  b_scale = b_scale_per_row(b_scale.astype(jnp.float32), n, b_scale_rows).T

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
  if jnp.dtype(out_dtype) == jnp.dtype(quantize.FP8):
    q, scale = quantize.quantize_1x128(acc, power_of_two_scales=power_of_two_scales)
    return q.reshape(*batch, m, n), scale.reshape(*batch, m, scale.shape[-1])
  return acc.astype(out_dtype).reshape(*batch, m, n)


def unsupported_reason(op, m, n, k, **problem):
  """The reference runs every operation on any platform (jax_fp8.backends' protocol)."""
  del op, m, n, k, problem
  return None


# ---- grouped (MoE) GEMMs --------------------------------------------------------------
#
# Both grouped ops reduce to one loop: row tiles of `a`, each multiplied by the
# weights of the group it belongs to. A tile starts at its group's first row (or
# T rows after the previous tile of that group), so the work is
# sum_g ceil(rows_g / T) tiles of T rows: the rows that exist plus at most one
# partial tile per group, and it follows the group sizes on the device (a loop
# with a dynamic trip count: no recompilation, no host sync). jax.lax.ragged_dot
# would do G times the work instead (on the CPU and the GPU it multiplies every
# row by every expert under a mask), and a masked dense product for the masked
# layout would follow M rather than masked_m.
#
# Within a tile the contract is kept literally: the 128-deep block sums come
# from one dot batched over the K blocks (e4m3 values are exact in bfloat16 and
# their products exact in float32, accumulated in float32), then each is
# multiplied by its scale product a_scale * b_scale, then the blocks are summed.
# The batched block sums take T * N * ceil(K/128) floats, which bounds T.

_TILE_FLOATS = 1 << 25  # 128 MiB of float32 block sums per tile at most


def ragged_group_bounds(group_sizes: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
  """(starts, ends) [G] int32 of the ragged layout's groups.

  Groups lie contiguously from row 0 in order; a negative size counts as 0 and
  a group is cut at row M (so every end is <= M). Requires M < 2**30.
  """
  sizes = jnp.clip(group_sizes.astype(jnp.int32), 0, m)
  # Saturating at M keeps the running sum in int32 whatever the sizes are
  # (min(x + y, M) for x, y in [0, M] is associative).
  ends = lax.associative_scan(lambda x, y: jnp.minimum(x + y, m), sizes)
  starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
  return starts, ends


def _tile_rows(rows: int, n: int, k_blocks: int) -> int:
  t = 128
  while t > 8 and t * max(n, 1) * k_blocks > _TILE_FLOATS:
    t //= 2
  return max(8, min(t, -(-max(rows, 1) // 8) * 8))


def _scaled_tile(a_t, sa_t, b_g, sb_g, n: int):
  """The contract for one tile of rows and one expert, in float32.

  a_t [T, Kp], sa_t [T, kb], b_g [N, Kp], sb_g [nb, kb] -> [T, N] (Kp = 128 * kb).
  """
  t, kp = a_t.shape
  kb = kp // quantize.BLOCK
  sums = lax.dot_general(  # [kb, T, N]: one 128-deep block sum per K block
      a_t.astype(jnp.bfloat16).reshape(t, kb, quantize.BLOCK),
      b_g.astype(jnp.bfloat16).reshape(n, kb, quantize.BLOCK),
      (((2,), (2,)), ((1,), (1,))), preferred_element_type=jnp.float32)
  sb_cols = jnp.repeat(sb_g, quantize.BLOCK, axis=0)[:n]              # [N, kb]
  scale = sa_t.T[:, :, None] * sb_cols.T[:, None, :]                   # [kb, T, N]
  return jnp.sum(sums * scale, axis=0)


def _rows_by_group(a, a_scale, b, b_scale, starts, ends, *, tile_rows: int):
  """out[r] = row r of a times b[g]^T (the contract) for r in [starts[g], ends[g]), in
  float32; every other row 0. a [R, K], b [G, N, K]; the ranges are disjoint in [0, R)."""
  rows, k = a.shape
  n = b.shape[1]
  kb = quantize.num_blocks(k)
  kp = kb * quantize.BLOCK
  t = tile_rows
  # Padding: a tile may start up to T - 1 rows before R, and K to whole blocks
  # (zeros add nothing to a block sum).
  a = jnp.pad(a, ((0, t), (0, kp - k)))
  a_scale = jnp.pad(a_scale, ((0, t), (0, 0)))
  if kp != k:
    b = jnp.pad(b, ((0, 0), (0, 0), (0, kp - k)))
  tiles = (ends - starts + t - 1) // t              # [G] tiles per group
  tile_ends = jnp.cumsum(tiles)
  count = tile_ends[-1]

  def tile(i, out):
    g = jnp.sum(tile_ends <= i).astype(jnp.int32)  # the group of the i-th tile
    row0 = starts[g] + (i - (tile_ends[g] - tiles[g])) * t
    a_t = lax.dynamic_slice_in_dim(a, row0, t)
    sa_t = lax.dynamic_slice_in_dim(a_scale, row0, t)
    b_g = lax.dynamic_index_in_dim(b, g, keepdims=False)
    sb_g = lax.dynamic_index_in_dim(b_scale, g, keepdims=False)
    val = _scaled_tile(a_t, sa_t, b_g, sb_g, n)
    # Rows of the tile past its group belong to the next group or to none:
    # keep what is there (select, so a NaN computed for them never leaks).
    own = (row0 + lax.iota(jnp.int32, t) < ends[g])[:, None]
    cur = lax.dynamic_slice_in_dim(out, row0, t)
    return lax.dynamic_update_slice_in_dim(out, jnp.where(own, val, cur), row0, 0)

  out = lax.fori_loop(0, count, tile, jnp.zeros((rows + t, n), jnp.float32))
  return out[:rows]


def ragged_dot(a, a_scale, b, b_scale, group_sizes, *, out_dtype=jnp.bfloat16) -> jax.Array:
  """a [M, K], b [G, N, K], group_sizes [G] -> [M, N]; see jax_fp8.blockwise_fp8_ragged_dot.

  Takes any group sizes (negative ones count as 0, groups are cut at M); rows
  past the groups are 0.
  """
  m, k = a.shape
  g, n, _ = b.shape
  starts, ends = ragged_group_bounds(group_sizes, m)
  out = _rows_by_group(a, a_scale, b, b_scale, starts, ends,
                       tile_rows=_tile_rows(m, n, quantize.num_blocks(k)))
  return out.astype(out_dtype)


def masked_dot(a, a_scale, b, b_scale, masked_m, *, out_dtype=jnp.bfloat16,
               expected_m: int | None = None) -> jax.Array:
  """a [G, M, K], b [G, N, K], masked_m [G] -> [G, M, N]; see jax_fp8.blockwise_fp8_masked_dot.

  masked_m is clamped to [0, M]; rows >= masked_m[g] of group g are 0.
  expected_m (a kernels' tiling hint) changes nothing here.
  """
  del expected_m
  g, m, k = a.shape
  n = b.shape[1]
  starts = lax.iota(jnp.int32, g) * m
  ends = starts + jnp.clip(masked_m.astype(jnp.int32), 0, m)
  kb = quantize.num_blocks(k)
  out = _rows_by_group(a.reshape(g * m, k), a_scale.reshape(g * m, kb), b, b_scale, starts, ends,
                       tile_rows=_tile_rows(m, n, kb))
  return out.reshape(g, m, n).astype(out_dtype)


def glu(a, a_scale, b, b_scale, *, activation, out_dtype, power_of_two_scales=False):
  """act(a @ gate.T) * (a @ up.T), b = [gate; up] [2F, K]; see jax_fp8.blockwise_fp8_glu."""
  f = b.shape[0] // 2
  both = blockwise_fp8_dot(a, a_scale, b, b_scale, out_dtype=jnp.float32)
  gate, up = both[..., :f], both[..., f:]
  act = {"silu": lambda x: x / (1.0 + jnp.exp(-x)),
         "gelu": lambda x: jax.nn.gelu(x, approximate=True),
         "relu": lambda x: jnp.maximum(x, 0.0)}[activation]
  out = act(gate) * up
  if jnp.dtype(out_dtype) == jnp.dtype(quantize.FP8):
    return quantize.quantize_1x128(out, power_of_two_scales=power_of_two_scales)
  return out.astype(out_dtype)
