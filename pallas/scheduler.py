"""Tile schedulers: which output tile a persistent CTA computes at each step.

A kernel launches one CTA (or cluster of CTAs) per SM and lets each walk the
*work units* of a scheduler: unit u goes to CTA u % num_ctas, in order. Every
warp role of the CTA (TMA producer, MMA issuers, epilogue) runs its own copy of
the same walk, so no tile index is ever passed between them. The kernel body
asks the scheduler for everything that depends on the problem's layout:

- `num_units`: how many units the grid has (static; for the ragged scheduler
  an upper bound, its walk reads the count at run time);
- `tile(unit, cluster_index)`: a `Tile`: where the tile's rows and columns are
  in a, b and the output (including the group or K split they belong to), its
  first K block, how many K passes it sums, and which of its rows exist;
- `tile_pass(tile, p)`: the b group of the tile's p-th K pass;
- `steps(cta, num_ctas, steps_per_pass)`: the pipeline steps a CTA runs in all
  (the producer closes its ring with it).

Schedulers (see next-wave-notes.md, DeepGEMM's GemmType):
- `DenseScheduler`: one GEMM (G = 1), tiles in planar-snake order for L2 reuse,
  optionally K cut into `split_k` ranges (each its own unit, writing its own
  partial output group) and CTA clusters sharing A or B by multicast.
- `MaskedScheduler`: G independent GEMMs of M rows each (a [G, M, K]); only
  the first masked_m[g] rows of group g exist. Tiles wholly past masked_m have
  no K pass (they are stored as zeros); optionally in CTA clusters as above,
  and optionally walked live-first (the tiles holding rows of every group
  before the empty ones, found per unit from masked_m by a short scan over
  the groups: no tables).
- `RaggedScheduler`: one [M, K] activation whose rows are cut into G
  contiguous groups of any size, group g multiplied by b[g]. A tile whose rows
  span several groups is cut into pieces, one unit each: every unit runs one
  K pass (its group's) and stores only its piece's rows. Rows past the last
  group are zeros (pieces without a K pass); optionally in CTA pairs side by
  side sharing A (a piece's rows) by multicast.
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
    zeros in the output, or, with row-exact stores, not stored (nor those
    before row_lo).
  """
  m0: Any
  n0: Any
  a_group: Any
  out_group: Any
  k0: Any
  passes: Any
  row_end: Any
  row_lo: Any = 0    # row-exact stores (Problem.exact_rows): the first row stored
  piece: Any = None  # the ragged scheduler's piece


@dataclasses.dataclass(frozen=True)
class TilePass:
  """One K pass of a tile: b's group."""
  b_group: Any


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
  # Clusters of 2 CTAs side by side (neighbouring column tiles, A shared by
  # multicast), where the scheduler takes them.
  cluster_n: int = 1

  @property
  def m_tiles(self) -> int:
    return pl.cdiv(self.m, self.tile_m)

  @property
  def n_tiles(self) -> int:
    return pl.cdiv(self.n, self.tile_n)

  @property
  def n_units(self) -> int:
    """Units along N: column tiles, or pairs of them (cluster_n)."""
    return pl.cdiv(self.n_tiles, self.cluster_n)

  def column_tile(self, ni, cluster_index):
    """The column tile of CTA cluster_index in the unit at ni along N."""
    return ni * self.cluster_n + cluster_index if self.cluster_n > 1 else ni

  # Schedulers whose every tile runs exactly one K pass need no pass loop; where
  # a tile runs at most one (tile.passes 0 or 1), `single_pass` asks the Hopper
  # kernel for a branch instead of a loop of 0 or 1 trips (the Blackwell kernel,
  # whose accumulators live in TMEM, keeps its loop).
  static_passes = False
  single_pass = False
  # Whether num_units is the walk's count (else an upper bound; the count is read).
  static_units = True

  def local_units(self, cta, num_ctas):
    """Units of CTA `cta` of `num_ctas` (unit u goes to CTA u % num_ctas)."""
    units = i32(self.num_units) if self.units_ref is None else self.units_ref[0]
    return _share(units, cta, num_ctas)

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
  static_passes = True

  @property
  def num_units(self) -> int:
    return pl.cdiv(self.m_tiles, self.cluster_m) * self.n_units * self.split_k

  def tile(self, unit, cluster_index) -> Tile:
    per_split = self.num_units // self.split_k
    split, lin = lax.div(unit, i32(per_split)), lax.rem(unit, i32(per_split))
    mi, ni = _snake(lin, pl.cdiv(self.m_tiles, self.cluster_m), self.n_units,
                    self.grid_minor, self.group)
    # A cluster's CTAs stack vertically (cluster_m) or side by side (cluster_n);
    # a CTA past M or N loads zeros and its stores are dropped, but it must
    # still take part in the multicast.
    if self.cluster_m > 1:
      mi = mi * self.cluster_m + cluster_index
    ni = self.column_tile(ni, cluster_index)
    return Tile(m0=mi * self.tile_m, n0=ni * self.tile_n, a_group=i32(0), out_group=split,
                k0=split * self.k_blocks, passes=i32(1), row_end=i32(self.m))

  def tile_pass(self, tile: Tile, p) -> TilePass:
    del p
    return TilePass(b_group=i32(0))


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
  live_first: bool = False

  @property
  def num_units(self) -> int:
    return self.groups * pl.cdiv(self.m_tiles, self.cluster_m) * self.n_units

  def _live_units(self):
    """Per group, its units (row tiles, or pairs, x column tiles) holding rows."""
    rows_per_unit = self.tile_m * self.cluster_m
    n_units = self.n_units
    return [lax.div(self.masked_m[g] + i32(rows_per_unit - 1), i32(rows_per_unit))
            * i32(n_units) for g in range(self.groups)]

  def _live_first(self, unit):
    """(group, m unit, n unit) of `unit` in the live-first walk: first every
    group's units holding rows, group by group (each group's in planar-snake
    order over its live row tiles), then the units past masked_m. The round
    robin then shares the live units evenly among the CTAs, however masked_m
    falls (the plain walk interleaves the empty tiles with the live ones, so
    that some CTAs draw a tile with rows more than others)."""
    m_units = pl.cdiv(self.m_tiles, self.cluster_m)
    n_units = self.n_units
    live = self._live_units()
    total_live = sum(live[1:], live[0])
    is_live = unit < total_live
    idx = jnp.where(is_live, unit, unit - total_live)
    g, off, live_rows, before = i32(0), idx, i32(0), i32(0)
    for j, live_j in enumerate(live):  # one short scan of the group counts
      count = jnp.where(is_live, live_j, i32(m_units * n_units) - live_j)
      hit = (idx >= before) & (idx < before + count)
      g = jnp.where(hit, i32(j), g)
      off = jnp.where(hit, idx - before, off)
      live_rows = jnp.where(hit, lax.div(live_j, i32(n_units)), live_rows)
      before = before + count
    pair, ni = _snake(off, jnp.maximum(live_rows, 1), n_units, self.grid_minor, self.group)
    pair = jnp.where(is_live, pair, live_rows + lax.div(off, i32(n_units)))
    ni = jnp.where(is_live, ni, lax.rem(off, i32(n_units)))
    return g, pair, ni

  def steps(self, cta, num_ctas, steps_per_pass: int):
    if not self.live_first:
      return super().steps(cta, num_ctas, steps_per_pass)
    # A CTA's units with rows are the first of its units.
    live = self._live_units()
    return _share(sum(live[1:], live[0]), cta, num_ctas) * steps_per_pass

  def tile(self, unit, cluster_index) -> Tile:
    m_units = pl.cdiv(self.m_tiles, self.cluster_m)
    n_units = self.n_units
    if self.live_first:
      g, pair, ni = self._live_first(unit)
    else:
      g, lin = lax.div(unit, i32(m_units * n_units)), lax.rem(unit, i32(m_units * n_units))
      pair, ni = _snake(lin, m_units, n_units, self.grid_minor, self.group)
    mi = pair * self.cluster_m + cluster_index if self.cluster_m > 1 else pair
    ni = self.column_tile(ni, cluster_index)
    rows = self.masked_m[g]
    m0 = mi * self.tile_m
    first_m0 = pair * (self.cluster_m * self.tile_m) if self.cluster_m > 1 else m0
    return Tile(m0=m0, n0=ni * self.tile_n, a_group=g, out_group=g, k0=i32(0),
                passes=(first_m0 < rows).astype(i32), row_end=rows)

  def tile_pass(self, tile: Tile, p) -> TilePass:
    del p
    return TilePass(b_group=tile.a_group)


@dataclasses.dataclass(frozen=True)
class RaggedScheduler(_Walk):
  """Rows of one a [M, K] cut into contiguous groups (b [G, N, K]).

  A unit is a *piece* of a row tile times a column tile, a piece being the
  rows of one tile_m-row tile that lie in one group (its "segment"): a tile
  that group boundaries cut gives one piece per group it meets. Each unit runs
  one K pass with its group's weights over the whole tile and stores only its
  piece's rows (`Tile.row_lo` to `row_end`, the epilogue's row-exact stores),
  so every unit costs the same and the round-robin walk stays balanced (whole
  tiles with a pass per group made the CTAs that drew cut tiles the critical
  path). The rows past the last group form the last segment, whose pieces have
  no K pass and are stored as zeros.

  Units come in two runs: the K-pass pieces x column tiles in planar-snake
  order, then the zero pieces x column tiles. The piece counts are known on
  the device only: `local_units` and `steps` read them.

  GMEM refs, built by `ragged_pieces` in XLA from the group sizes:
  pieces [m_tiles + G, 4]: (row tile, b group, first row, end row) of each piece,
  the K-pass pieces first; piece_counts [2]: K-pass pieces, all pieces.

  Optionally in clusters of 2 CTAs side by side (cluster_n): a unit is a piece
  times a pair of column tiles, the pair's CTAs the same rows of one group (A
  shared by multicast); a pair's second tile may lie past N.
  """
  pieces: Any = None
  piece_counts: Any = None
  num_groups: int = 1
  static_units = False
  # The loop made ptxas spill 460 bytes in 128 x 256 tiles, the branch none.
  # (The masked scheduler keeps the loop: with the branch its 128 x 256 decode
  # tiles ran 2.3x slower; RESULTS.md, 2026-11-26.)
  single_pass = True

  @property
  def num_units(self) -> int:
    """An upper bound (each group boundary inside a tile adds a piece)."""
    return (self.m_tiles + self.num_groups) * self.n_units

  def _unit_counts(self):
    """(K-pass units, all units), read from GMEM."""
    return self.piece_counts[0] * i32(self.n_units), self.piece_counts[1] * i32(self.n_units)

  def local_units(self, cta, num_ctas):
    return _share(self._unit_counts()[1], cta, num_ctas)

  def steps(self, cta, num_ctas, steps_per_pass: int):
    # The K-pass units come first: a CTA's are the first of its units.
    return _share(self._unit_counts()[0], cta, num_ctas) * steps_per_pass

  def tile(self, unit, cluster_index) -> Tile:
    pass_pieces = self.piece_counts[0]
    pass_units = pass_pieces * i32(self.n_units)
    has_pass = unit < pass_units
    p_snake, n_snake = _snake(jnp.minimum(unit, pass_units - 1),
                              jnp.maximum(pass_pieces, 1), self.n_units, self.grid_minor,
                              self.group)
    zero = jnp.maximum(unit - pass_units, 0)
    piece = jnp.where(has_pass, p_snake, pass_pieces + lax.div(zero, i32(self.n_units)))
    ni = self.column_tile(jnp.where(has_pass, n_snake, lax.rem(zero, i32(self.n_units))),
                          cluster_index)
    row_tile, _, row_lo, row_hi = (self.pieces[piece, j] for j in range(4))
    return Tile(m0=row_tile * self.tile_m, n0=ni * self.tile_n, a_group=i32(0),
                out_group=i32(0), k0=i32(0), passes=has_pass.astype(i32), row_end=row_hi,
                row_lo=row_lo, piece=piece)

  def tile_pass(self, tile: Tile, p) -> TilePass:
    del p
    return TilePass(b_group=self.pieces[tile.piece, 1])


def _share(units, cta, num_ctas):
  """How many of `units` (a traced count) CTA `cta` of `num_ctas` runs."""
  cta, num_ctas = i32(cta), i32(num_ctas)
  return lax.div(units - cta + num_ctas - 1, num_ctas)


def _inclusive_sum(x):
  """cumsum of a short int32 vector (the groups) as a triangular sum: it fuses
  with its neighbours, where XLA's cumsum is a reduce-window kernel of its own
  (G x G elements: small for any expert count)."""
  i = jnp.arange(x.shape[0])
  return jnp.sum(jnp.where(i[None, :] <= i[:, None], x[None, :], 0), axis=1).astype(i32)


def ragged_pieces(group_sizes, m: int, tile_m: int):
  """(pieces, piece_counts) of RaggedScheduler, in XLA (small int32 arrays).

  Negative sizes count as 0 and groups are cut at M. Segment s < G is group s's
  rows, segment G the rows past the last group; a non-empty segment [lo, hi)
  gives one piece per tile_m-row tile it meets.
  """
  g = group_sizes.shape[0]
  sizes = jnp.maximum(group_sizes.astype(i32), 0)
  ends = jnp.minimum(_inclusive_sum(sizes), m)
  lo = jnp.concatenate([jnp.zeros((1,), i32), ends])        # [G + 1]
  hi = jnp.concatenate([ends, jnp.full((1,), m, i32)])
  first_tile = lax.div(lo, i32(tile_m))
  count = jnp.where(hi > lo, lax.div(hi + i32(tile_m - 1), i32(tile_m)) - first_tile, 0)
  end = _inclusive_sum(count)                                # pieces before segment s + 1
  slots = pl.cdiv(m, tile_m) + g                             # >= sum(count)
  p = jnp.arange(slots, dtype=i32)
  # compare_all: one fused comparison (the default method is a loop of kernels).
  seg = jnp.minimum(jnp.searchsorted(end, p, side="right", method="compare_all").astype(i32), g)
  row_tile = first_tile[seg] + p - (end[seg] - count[seg])
  row_lo = jnp.maximum(lo[seg], row_tile * tile_m)
  row_hi = jnp.minimum(hi[seg], row_tile * tile_m + tile_m)
  pieces = jnp.stack([row_tile, seg, row_lo, row_hi], axis=1)
  return pieces, jnp.stack([end[g - 1], end[g]])
