"""Scale recipes: how the scales of one K block enter the float32 sum.

Every recipe computes, per 128-deep K block kb (a "block sum" from the tensor
cores), the promotion

    acc[m, n] += block[m, n] * a_scale[m, kb] * b_scale[<n's scale>, kb]

and differs only in how many rows of b share one scale:

- `BLOCK_128` ("1D2D", DeepSeek-V3's forward and dgrad): 128 rows of b (a
  128x128 block of the weight) share a scale; b_scale is [nb, kb] per group, and
  one b scale covers a whole 128-column chunk of the tile (a scalar per chunk).
- `PER_ROW` ("1D1D", the weight gradient): every row of b has its own scale,
  stored transposed as [kb, N] per group so that a chunk's scales are one
  contiguous load; each column of the tile has its own factor.

The a scales are one per row per K block in both. A block's factor is built
from a per-row vector (WGMMA/TCGEN05 row layout) and either a scalar (BLOCK_128:
the two multiply into one row vector before the broadcast) or a per-column
vector (PER_ROW: two broadcasts). Zero factors mask rows (other groups' rows of
a ragged tile) and K blocks past K; a masked factor is set to 0 with a select,
so an infinite scale never meets a zero (inf * 0 would be NaN).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas.common import SCALE_N


@dataclasses.dataclass(frozen=True)
class ScaleRecipe:
  """b_rows: rows of b sharing one scale (SCALE_N = 128, or 1)."""
  b_rows: int

  @property
  def per_row_b(self) -> bool:
    return self.b_rows == 1

  def load_b(self, bs_gmem, group, kb, col0, cols: int, col_layout):
    """b's scales of K block kb for the `cols` columns from col0 of group `group`:
    a scalar (BLOCK_128; col0 .. col0 + cols - 1 lie in one 128-row block of b)
    or a (cols,) vector in col_layout (PER_ROW, from the transposed [G, kb, N])."""
    if self.per_row_b:
      return plgpu.load(bs_gmem.at[group, kb, pl.ds(col0, cols)], layout=col_layout,
                        optimized=False)
    nb = jnp.minimum(lax.div(col0, jnp.int32(SCALE_N)), jnp.int32(bs_gmem.shape[1] - 1))
    return bs_gmem[group, nb, kb]

  def row_factor(self, a_rows, b):
    """The per-row part of a block's factor: a_rows * b where b is one scalar
    for the chunk (BLOCK_128), else a_rows (PER_ROW keeps b per column)."""
    return a_rows if self.per_row_b else a_rows * b

  def factor(self, row_factor, b, shape):
    """The (rows, cols) multiplier of a block sum, from its row factor and b."""
    f = lax.broadcast_in_dim(row_factor, shape, [0])
    if self.per_row_b:
      f = f * lax.broadcast_in_dim(b, shape, [1])
    return f


BLOCK_128 = ScaleRecipe(b_rows=SCALE_N)
PER_ROW = ScaleRecipe(b_rows=1)


def recipe_for(b_scale_rows: int) -> ScaleRecipe:
  """The recipe of a b_scale with one scale per `b_scale_rows` rows of b."""
  if b_scale_rows == SCALE_N:
    return BLOCK_128
  if b_scale_rows == 1:
    return PER_ROW
  raise ValueError(f"b_scale_rows must be {SCALE_N} (128x128 blocks) or 1 (per row), "
                   f"got {b_scale_rows}")


def zero_unless(keep, x):
  """x where keep, else 0, by a select (a zero factor must never be inf * 0).
  keep may be a scalar: Mosaic GPU's select takes operands of one shape."""
  return jnp.where(jnp.broadcast_to(keep, jnp.shape(x)), x, jnp.zeros_like(x))
