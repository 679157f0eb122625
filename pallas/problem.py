"""From a call's operands to what a kernel launches: one place for every variant.

Each entry point (`dense`, `ragged`, `masked`) turns the 2-D (or grouped)
operands of an operation into a `Launch`: the `Problem` the kernel body is
specialised on (its scheduler, scale recipe and row handling), the operands
with their leading group axes, padded for tiled TMA by the kernel's own `pad`,
the output's shape and dtype, and `finish`, which turns the kernel's output
into the operation's result (crop, and for K splits the reduction). Both
kernels (hopper.py, blackwell.py) launch the same `Launch`es.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from jax_fp8.pallas import scheduler as sched_lib
from jax_fp8.pallas.common import C_DTYPES, K_BLOCK, round_up
from jax_fp8.pallas.recipe import BLOCK_128, ScaleRecipe, recipe_for


@dataclasses.dataclass(frozen=True)
class Problem:
  """What a kernel body is specialised on besides its config."""
  scheduler: Any         # a pallas.scheduler scheduler (its GMEM tables come as `meta`)
  recipe: ScaleRecipe
  k_blocks: int          # K blocks of one unit of work (one K split)
  beta: float = 1.0
  zero_rows: bool = False   # rows at or past the tile's row_end are stored as zeros
  exact_rows: bool = False  # only the tile's rows [row_lo, row_end) are stored (ragged pieces)
  quantize_out: bool = False  # FP8 output: e4m3 values and one scale per row per 128 columns
  power_of_two: bool = False  # ... with power-of-two scales
  glu_rows: int = 0         # a fused GLU: b's up rows start here (its gate rows at 0)
  activation: str = ""      # ... and the gate's activation


@dataclasses.dataclass(frozen=True)
class Tiling:
  """What setting up a launch needs of a kernel's config."""
  tile_m: int
  tile_n: int
  pad: Callable          # (a, a_scale, b, c, out_dtype, out_n=None) with group axes
                         # -> common.TmaOperands
  grid_minor: str = "n"
  group: int = 8
  split_k: int = 1
  cluster_m: int = 1
  cluster_n: int = 1
  live_first: bool = False  # masked GEMMs: the units holding rows walked first


@dataclasses.dataclass(frozen=True)
class Launch:
  problem: Problem
  args: tuple            # (a, a_scale, b, b_scale, c, meta) as the kernel takes them
  out_type: Any          # the kernel's output(s): [groups, rows, cols] (FP8 output: and
                         # its scales, transposed [groups, column blocks, rows'])
  finish: Callable       # kernel output -> the operation's result

  @property
  def out_dtype(self):
    return jax.tree.leaves(self.out_type)[0].dtype


def _b_scale_for(recipe: ScaleRecipe, b_scale, n_cols: int):
  """b_scale [G, nb, kb] as given (128x128), or per-row [G, N, kb] transposed to
  [G, kb, n_cols] (zero-padded) so that a chunk's scales are one contiguous load."""
  if not recipe.per_row_b:
    return b_scale.astype(jnp.float32)
  bs = jnp.swapaxes(b_scale.astype(jnp.float32), 1, 2)
  return jnp.pad(bs, ((0, 0), (0, 0), (0, n_cols - bs.shape[2])))


def dense(t: Tiling, a, a_scale, b, b_scale, c, *, beta: float, out_dtype,
          b_scale_rows: int, power_of_two_scales: bool = False, activation: str = "") -> Launch:
  """One GEMM, a [M, K] x b [N, K]; with t.split_k > 1, K ranges written as
  float32 partials and summed (with beta * c) by one fused XLA reduction. With
  out_dtype float8_e4m3fn the result is (q [M, N], scale [M, ceil(N/128)]),
  quantised 1x128 in the epilogue."""
  m, k = a.shape
  # A fused GLU: b holds the gate rows [0, F) and the up rows [F, 2F); a tile's
  # B tile is tile_n / 2 gate rows beside the same up rows, its output tile_n / 2.
  glu_rows = b.shape[0] // 2 if activation else 0
  n = glu_rows or b.shape[0]
  tile_n = t.tile_n // 2 if activation else t.tile_n
  out_dtype = np.dtype(out_dtype)
  quantize_out = out_dtype == np.dtype(jnp.float8_e4m3fn)
  if quantize_out and (t.split_k > 1 or tile_n % 128):
    raise ValueError(f"FP8 output needs whole 128-column groups in a tile and no K split, got "
                     f"tile_n={t.tile_n}, split_k={t.split_k}")
  if activation and (b.shape[0] % 256 or t.split_k > 1 or c is not None):
    raise ValueError(f"a fused GLU needs b of 2F rows with F a multiple of 128, no K split "
                     f"and no c, got b of {b.shape[0]} rows, split_k={t.split_k}")
  k_blocks = pl.cdiv(k, K_BLOCK)
  if k_blocks % t.split_k:
    raise ValueError(f"split_k={t.split_k} must divide the {k_blocks} K blocks of K={k}")
  if c is not None and np.dtype(c.dtype) not in C_DTYPES:
    c = c.astype(jnp.float32)
  recipe = recipe_for(b_scale_rows)
  split = t.split_k > 1
  ops = t.pad(a[None], a_scale[None], b[None], None if c is None or split else c[None],
              out_dtype, out_n=n)
  # A split's partial output has whole tiles of rows: the TMA stores of its
  # last row tile must not land in the next split's rows.
  rows = pl.cdiv(m, t.tile_m) * t.tile_m if split else ops.rows
  sched = sched_lib.DenseScheduler(
      m=m, n=n, tile_m=t.tile_m, tile_n=tile_n, grid_minor=t.grid_minor, group=t.group,
      k_blocks=k_blocks // t.split_k, split_k=t.split_k, cluster_m=t.cluster_m,
      cluster_n=t.cluster_n)

  def finish(out):
    if quantize_out:
      q, s = out
      return q[0, :m, :n], jnp.swapaxes(s[0], 0, 1)[:m, :pl.cdiv(n, 128)]
    if not split:
      return out[0, :m, :n]
    # One fused XLA reduction, in a fixed order (deterministic).
    out = out[:, :m, :n].sum(axis=0)
    if c is not None:
      out = out + beta * c.astype(jnp.float32)
    return out.astype(out_dtype)

  out_type = jax.ShapeDtypeStruct((t.split_k, rows, ops.out_cols),
                                  np.dtype(jnp.float32) if split else out_dtype)
  if quantize_out:  # the scales transposed: a chunk's row scales are contiguous
    # Whole clusters of tiles: a CTA of a pair past M or N computes a tile of
    # zeros and stores its scales with generic stores, which TMA does not clip.
    out_type = (out_type, jax.ShapeDtypeStruct(
        (1, round_up(n, tile_n * t.cluster_n) // 128, round_up(m, t.tile_m * t.cluster_m)),
        jnp.float32))
  return Launch(Problem(sched, recipe, k_blocks // t.split_k, float(beta),
                        quantize_out=quantize_out, power_of_two=power_of_two_scales,
                        glu_rows=glu_rows, activation=activation),
                (ops.a, ops.a_scale, ops.b,
                 _b_scale_for(recipe, b_scale[None], round_up(b.shape[0], t.tile_n)), ops.c, {}),
                out_type, finish)


def _check_grouped(t: Tiling, pairs_sharing_b: bool = False):
  """Grouped GEMMs take no K splits; clusters only where the scheduler pairs
  tiles of one group: side by side (cluster_n), and one above the other
  (cluster_m) in masked groups (ragged pieces of one row tile have no
  neighbour in the same group)."""
  if t.split_k != 1:
    raise ValueError(f"grouped GEMMs take no K splits (split_k=1), got {t}")
  if not pairs_sharing_b and t.cluster_m != 1:
    raise ValueError(f"ragged grouped GEMMs take no pairs sharing B (cluster_m=1), got {t}")


def ragged(t: Tiling, a, a_scale, b, b_scale, group_sizes, *, out_dtype) -> Launch:
  """Rows of a [M, K] cut into G contiguous groups, group g times b[g] [N, K]
  (b_scale [G, nb, kb]); rows past the groups are zeros. Result [M, N]."""
  _check_grouped(t)
  m, k = a.shape
  g, n, _ = b.shape
  ops = t.pad(a[None], a_scale[None], b, None, out_dtype)
  pieces, piece_counts = sched_lib.ragged_pieces(group_sizes, m, t.tile_m)
  sched = sched_lib.RaggedScheduler(m=m, n=n, tile_m=t.tile_m, tile_n=t.tile_n,
                                    grid_minor=t.grid_minor, group=t.group, num_groups=g,
                                    cluster_n=t.cluster_n)
  meta = dict(pieces=pieces, piece_counts=piece_counts)
  # A unit's rows outside its piece are computed with its group's weights and
  # never stored: their scales need no masking.
  return Launch(Problem(sched, BLOCK_128, pl.cdiv(k, K_BLOCK), exact_rows=True),
                (ops.a, ops.a_scale, ops.b, b_scale.astype(jnp.float32), None, meta),
                jax.ShapeDtypeStruct((1, ops.rows, ops.out_cols), out_dtype),
                lambda out: out[0, :m, :n])


def masked(t: Tiling, a, a_scale, b, b_scale, masked_m, *, out_dtype) -> Launch:
  """G GEMMs a[g] [M, K] x b[g] [N, K] of which only the first masked_m[g]
  rows exist (the rest are stored as zeros). Result [G, M, N]."""
  _check_grouped(t, pairs_sharing_b=True)
  g, m, k = a.shape
  n = b.shape[1]
  ops = t.pad(a, a_scale, b, None, out_dtype)
  sched = sched_lib.MaskedScheduler(m=m, n=n, tile_m=t.tile_m, tile_n=t.tile_n,
                                    grid_minor=t.grid_minor, group=t.group, groups=g,
                                    cluster_m=t.cluster_m, cluster_n=t.cluster_n,
                                    live_first=t.live_first)
  rows = jnp.clip(masked_m.astype(jnp.int32), 0, m)
  return Launch(Problem(sched, BLOCK_128, pl.cdiv(k, K_BLOCK), zero_rows=True),
                (ops.a, ops.a_scale, ops.b, b_scale.astype(jnp.float32), None,
                 dict(masked_m=rows)),
                jax.ShapeDtypeStruct((g, ops.rows, ops.out_cols), out_dtype),
                lambda out: out[:, :m, :n])
