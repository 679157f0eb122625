"""Tile schedulers: which output tile a persistent CTA computes at each step.

A kernel launches one CTA (or cluster of CTAs) per SM and lets each walk the
*work units* of a scheduler: unit u goes to CTA u % num_ctas, in order. Every
warp role of the CTA (TMA producer, MMA issuers, epilogue) runs its own copy of
the same walk, so no tile index is ever passed between them. The kernel body
asks the scheduler for everything that depends on the problem's layout:

- `num_units`: how many units the grid has (static);
- `tile(unit, cluster_index)`: a `Tile`: where the tile's rows and columns are
  in a, b and the output (including the group or K split they belong to), its
  first K block, how many K passes it sums, and which of its rows exist;
- `tile_pass(tile, p)`: the b group of the tile's p-th K pass and the rows of
  the tile that pass may change (the others get a zero scale);
- `steps(cta, num_ctas, steps_per_pass)`: the pipeline steps a CTA runs in all
  (the producer closes its ring with it).

Schedulers (see next-wave-notes.md, DeepGEMM's GemmType):
- `DenseScheduler`: one GEMM (G = 1), tiles in planar-snake order for L2 reuse,
  optionally K cut into `split_k` ranges (each its own unit, writing its own
  partial output group) and CTA clusters sharing A or B by multicast.
- `MaskedScheduler`: G independent GEMMs of M rows each (a [G, M, K]); only
  the first masked_m[g] rows of group g exist. Tiles wholly past masked_m have
  no K pass (they are stored as zeros); optionally in CTA clusters as above.
- `RaggedScheduler`: one [M, K] activation whose rows are cut into G
  contiguous groups of any size, group g multiplied by b[g]. A tile whose rows
  span several groups runs one K pass per group, each pass changing only its
  group's rows (the rows of the other groups get a zero a-scale), and is stored
  once. Rows past the last group are zeros.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

i32 = jnp.int32


@dataclasses.dataclass(frozen=True)
class Tile:
  """One unit of work: an output tile and how its K blocks are summed.

  m0, n0: first row (within the a/output group) and first column.
  a_group / out_group: index along the leading (group) axis of a and a_scale /
    of the output (the group; for split-K the K range's partial output).
  k0: first K block. passes: K passes summed into the tile (0: none, the tile
    is stored as zeros). row_end: rows at or past it (within the group) are
    zeros in the output.
  """
  m0: Any
  n0: Any
  a_group: Any
  out_group: Any
  k0: Any
  passes: Any
  row_end: Any


@dataclasses.dataclass(frozen=True)
class TilePass:
  """One K pass of a tile: b's group, and the rows [row_lo, row_hi) it changes."""
  b_group: Any
  row_lo: Any
  row_hi: Any


def _snake(lin, m_tiles: int, n_tiles: int, minor: str, group: int):
  """(m tile, n tile) of linear index lin in planar-snake order."""
  return plgpu.planar_snake(lin, (m_tiles, n_tiles), 1 if minor == "n" else 0, group)


@dataclasses.dataclass(frozen=True)
class _Walk:
  """What every scheduler shares: the tile grid and its order."""
  m: int              # rows per group (the output's)
  n: int
  tile_m: int
  tile_n: int
  grid_minor: str = "n"
  group: int = 8      # planar-snake band width
  # num_units as an int32 GMEM ref [1] to read at run time, or None: the
  # constant (hopper._run gives it where the constant would unroll a loop).
  units_ref: Any = None

  @property
  def m_tiles(self) -> int:
    return pl.cdiv(self.m, self.tile_m)

  @property
  def n_tiles(self) -> int:
    return pl.cdiv(self.n, self.tile_n)

  # Schedulers whose every tile runs exactly one K pass need no pass loop.
  static_passes = False

  def local_units(self, cta, num_ctas):
    """Units of CTA `cta` of `num_ctas` (unit u goes to CTA u % num_ctas)."""
    cta, num_ctas = i32(cta), i32(num_ctas)
    units = i32(self.num_units) if self.units_ref is None else self.units_ref[0]
    return lax.div(units - cta + num_ctas - 1, num_ctas)

  def steps(self, cta, num_ctas, steps_per_pass: int):
    """Pipeline steps of CTA `cta` over all its units (passes x steps_per_pass each)."""
    units = self.local_units(cta, num_ctas)
    if self.static_passes:
      return units * steps_per_pass

    def add(i, total):
      return total + self.tile(i32(cta) + i * i32(num_ctas), 0).passes
    return lax.fori_loop(i32(0), units, add, i32(0)) * steps_per_pass


@dataclasses.dataclass(frozen=True)
class DenseScheduler(_Walk):
  """One GEMM: planar-snake tiles x K splits, optionally in clusters of 2 CTAs
  taking vertically (cluster_m) or horizontally (cluster_n) adjacent tiles."""
  k_blocks: int = 1   # K blocks of one unit (one K split)
  split_k: int = 1
  cluster_m: int = 1
  cluster_n: int = 1
  static_passes = True

  @property
  def num_units(self) -> int:
    return (pl.cdiv(self.m_tiles, self.cluster_m) * pl.cdiv(self.n_tiles, self.cluster_n)
            * self.split_k)

  def tile(self, unit, cluster_index) -> Tile:
    per_split = self.num_units // self.split_k
    split, lin = lax.div(unit, i32(per_split)), lax.rem(unit, i32(per_split))
    mi, ni = _snake(lin, pl.cdiv(self.m_tiles, self.cluster_m),
                    pl.cdiv(self.n_tiles, self.cluster_n), self.grid_minor, self.group)
    # A cluster's CTAs stack vertically (cluster_m) or side by side (cluster_n);
    # a CTA past M or N loads zeros and its stores are dropped, but it must
    # still take part in the multicast.
    if self.cluster_m > 1:
      mi = mi * self.cluster_m + cluster_index
    if self.cluster_n > 1:
      ni = ni * self.cluster_n + cluster_index
    return Tile(m0=mi * self.tile_m, n0=ni * self.tile_n, a_group=i32(0), out_group=split,
                k0=split * self.k_blocks, passes=i32(1), row_end=i32(self.m))

  def tile_pass(self, tile: Tile, p) -> TilePass:
    del p
    return TilePass(b_group=i32(0), row_lo=i32(0), row_hi=i32(self.m))


@dataclasses.dataclass(frozen=True)
class MaskedScheduler(_Walk):
  """G GEMMs of up to M rows (a [G, M, K], b [G, N, K]); group g has masked_m[g]
  rows (masked_m: an int32 GMEM ref, already clamped to [0, M]).

  Optionally in clusters of 2 CTAs within a group: vertically adjacent tiles
  sharing B (cluster_m) or side by side sharing A (cluster_n). A cluster runs
  its K pass if its first tile holds rows: its CTAs load in step for the
  multicast, and a tile past masked_m (or past M) is stored as zeros.
  """
  groups: int = 1
  masked_m: Any = None
  cluster_m: int = 1
  cluster_n: int = 1

  @property
  def num_units(self) -> int:
    return (self.groups * pl.cdiv(self.m_tiles, self.cluster_m)
            * pl.cdiv(self.n_tiles, self.cluster_n))

  def tile(self, unit, cluster_index) -> Tile:
    m_units = pl.cdiv(self.m_tiles, self.cluster_m)
    n_units = pl.cdiv(self.n_tiles, self.cluster_n)
    g, lin = lax.div(unit, i32(m_units * n_units)), lax.rem(unit, i32(m_units * n_units))
    pair, ni = _snake(lin, m_units, n_units, self.grid_minor, self.group)
    mi = pair * self.cluster_m + cluster_index if self.cluster_m > 1 else pair
    if self.cluster_n > 1:
      ni = ni * self.cluster_n + cluster_index
    rows = self.masked_m[g]
    m0 = mi * self.tile_m
    first_m0 = pair * (self.cluster_m * self.tile_m) if self.cluster_m > 1 else m0
    return Tile(m0=m0, n0=ni * self.tile_n, a_group=g, out_group=g, k0=i32(0),
                passes=(first_m0 < rows).astype(i32), row_end=rows)

  def tile_pass(self, tile: Tile, p) -> TilePass:
    del p
    return TilePass(b_group=tile.a_group, row_lo=i32(0), row_hi=tile.row_end)


@dataclasses.dataclass(frozen=True)
class RaggedScheduler(_Walk):
  """Rows of one a [M, K] cut into contiguous groups (b [G, N, K]).

  GMEM refs, built by `ragged_tables` in XLA from the group sizes:
  group_start [G + 1]: first row of each group (the last entry: the end of the
  last group); pass_group [G]: the non-empty groups in order; tile_passes
  [m_tiles, 2]: for each row tile, its first entry in pass_group and how many
  non-empty groups its rows meet.
  """
  group_start: Any = None
  pass_group: Any = None
  tile_passes: Any = None
  num_groups: int = 1

  @property
  def num_units(self) -> int:
    return self.m_tiles * self.n_tiles

  def tile(self, unit, cluster_index) -> Tile:
    del cluster_index
    mi, ni = _snake(unit, self.m_tiles, self.n_tiles, self.grid_minor, self.group)
    return Tile(m0=mi * self.tile_m, n0=ni * self.tile_n, a_group=i32(0), out_group=i32(0),
                k0=i32(0), passes=self.tile_passes[mi, 1],
                row_end=self.group_start[self.num_groups])

  def tile_pass(self, tile: Tile, p) -> TilePass:
    g = self.pass_group[self.tile_passes[lax.div(tile.m0, i32(self.tile_m)), 0] + p]
    return TilePass(b_group=g, row_lo=self.group_start[g], row_hi=self.group_start[g + 1])


def ragged_tables(group_sizes, m: int, tile_m: int):
  """(group_start, pass_group, tile_passes) of RaggedScheduler, in XLA.

  Negative sizes count as 0 and groups are cut at M. Small arrays: G + 1, G
  and m_tiles x 2 int32.
  """
  sizes = jnp.maximum(group_sizes.astype(i32), 0)
  ends = jnp.minimum(jnp.cumsum(sizes), m).astype(i32)
  starts = jnp.concatenate([jnp.zeros((1,), i32), ends])   # [G + 1]
  lo, hi = starts[:-1], starts[1:]
  nonempty = hi > lo
  # pass_group: the non-empty groups first, in order (stable sort on emptiness).
  order = jnp.argsort(jnp.logical_not(nonempty), stable=True).astype(i32)
  rank = jnp.cumsum(nonempty.astype(i32)) - nonempty.astype(i32)   # index among non-empty
  tiles = pl.cdiv(m, tile_m)
  t0 = jnp.arange(tiles, dtype=i32) * tile_m
  t1 = jnp.minimum(t0 + tile_m, m)
  meets = nonempty[None, :] & (lo[None, :] < t1[:, None]) & (hi[None, :] > t0[:, None])
  count = jnp.sum(meets, axis=1).astype(i32)
  first_group = jnp.argmax(meets, axis=1)
  first = jnp.where(count > 0, rank[first_group], 0).astype(i32)
  return starts, order, jnp.stack([first, count], axis=1)
