"""The cost model of the Hopper tiling: the estimated time of a config at a shape.

pallas/hopper_tiling.py builds the candidate configs of a shape; the default is
the candidate this model estimates fastest, and autotuning times them all in
the order of their estimates. One model for every candidate:

  time = waves x (K loop + fixed part of one unit of work)  [+ K-split reduction]

- waves: a persistent grid runs its units (tiles x K splits x groups, in
  clusters) in ceil(units / CTAs) waves; a mostly empty last wave costs a full
  one, and rows and columns of a tile past the problem cost as much as real ones.
- K loop: the unit's K blocks x the tile's time per K block. At decode
  (M <= 128) the kernel is bandwidth-bound: a K block of a tile costs its width
  in columns of B plus a fixed part (its A tile, the epilogue's share), 1.6x
  for 128-row tiles. At larger M it is compute-bound: a tile's area over its
  efficiency. Two-block steps save a step boundary per two blocks and wait for
  two blocks first; a ring past RING_BYTES takes L1's SMEM.
- fixed part: where a CTA's tiles chain (`chains_tiles`: the next tile's loads
  run under the epilogue) it is about half: at decode for every tile, at larger
  M for 192 x 128 tiles over short K loops (the one chained large-M form
  measured faster). 4-deep rings of 128 x 256 tiles chained over long K loops,
  K splits and pairs of CTAs sharing A have their own measured terms below.
- masked groups (M: their capacity; the rows that exist are known on the
  device only): the mean of the estimate over fills of half the capacity to
  all of it, or, told the rows a group is expected to hold (expected_m, the
  hint DeepGEMM's masked GEMM takes too), over fills of 0.7x to 1.3x that, and
  the tiles of a GEMM of that capacity (`masked_capacity`).

Forms without a measurement behind them (tiles autotuning also tries, pairs
sharing B, deeper rings, K splits or pairs outside the measured range) are left
to autotuning: `unmodelled` says why, and their estimate is infinite. The
measurements behind the constants are in benchmarks/RESULTS.md ("Hopper tiling
rules").
"""
from __future__ import annotations

import math

from jax_fp8.pallas import hopper
from jax_fp8.pallas.common import K_BLOCK, SCALE_N
from jax_fp8.pallas.hopper_config import HopperConfig

# M up to which a problem is bandwidth-bound (decode): every B tile is read by
# the CTAs of one tile column only, so a tile costs the bytes it streams.
DECODE_MAX_M = 128

# Decode tiles (tile_m, tile_n, wg_split, consumers) -> weight: a K block of the
# tile costs weight x (tile_n + the fixed columns). A 128-row tile ~1.6x a
# 64-row one; 64 x 192 (three warpgroups of 64 columns) fills the SMs where
# 256-wide tiles leave many idle.
DECODE_TILES = {(64, 32, "n", 2): 1.0, (64, 64, "n", 2): 1.0, (64, 128, "n", 2): 1.0,
                (64, 192, "n", 3): 1.0, (64, 256, "n", 2): 1.0, (128, 64, "m", 2): 1.6,
                (128, 256, "n", 2): 1.6}
# Decode tiles whose warpgroups split the K loop (wg_split "k": each holds the
# whole tile and every consumers-th K step; the first sums the others' through
# SMEM): a K split with no float32 partials and no reduction after the kernel,
# and each warpgroup's chain has half (a third) of the steps. Their weights are
# fitted to their times against the rules' earlier picks, in one wave over K
# loops of >= K_SPLIT_MIN_BLOCKS blocks (H100, 2026-11-27): 128x4096x7168 64 x 64
# (two warpgroups) 1.14x over 128 x 64 tiles split in 2 across CTAs,
# 64x4096x7168 64 x 32 1.09-1.10x (two or three warpgroups) over 64 x 64 split
# in 2, 128x2112x7168 64 x 32 (three) 1.08x over 128 x 64 split in 4,
# 64x7168x16384 64 x 64 (two) 1.045x over 64 x 64 split by columns; at K = 2048
# 0.95-0.99x; 64x2112x7168 64 x 16 (three, 9 two-block stages) 1.022-1.052x over
# 64 x 64 split in 4 (6 stages: 1.007); masked decode fills 0.67-0.75x the rules'
# 128 x 256 tiles (64-row tiles read a group's weights once per row tile). Their
# rings are not held to 8 one-block stages (K_SPLIT_RING: the measured depths above).
K_SPLIT_DECODE_TILES = {(64, 64, "k", 2): 0.85, (64, 32, "k", 2): 0.8, (64, 32, "k", 3): 0.7,
                        (64, 16, "k", 3): 0.65}
K_SPLIT_MIN_BLOCKS = 32
K_SPLIT_RING = 16  # one-block stages at most (RING_BYTES decides for these tiles)
# An FP8 output of at most MID_M_MAX rows over >= K_SPLIT_MIN_BLOCKS K blocks whose
# fused tiling (hopper_tiling.fp8_output_config: at decode 64 x 128 tiles splitting K
# among their warpgroups, above it 128 x 128) fills its waves' CTAs to at most this
# share is the float32 output of the bf16 rules' tiling quantised by the quantiser
# kernel after it: 1.07-1.31x at 17-64 such tiles at decode (64 / 128 rows x 2112 /
# 4096 x 7168, 64x7168x16384), 1.20-1.62x at 34-68 tiles of 200-512 rows x 2112 /
# 4096 x 7168 and at 1024x2112x7168 (136 tiles: two waves half full), 1.02x at
# 128x18432x7168 (144); fuller waves 0.73-1.09x (85-128 tiles of 256-1024 rows,
# 128x7168x16384), 0.83-0.99x at K = 2048 (H100 2026-11-27).
FP8_QUANTIZE_AFTER_MAX_FILL = 0.55
# Between decode and MID_M_MAX rows (long K, 128 x 128 b scales) an FP8 output also
# takes the decode FP8 tiles (64 x 128, the two warpgroups splitting K, 6 one-block
# stages) where they fit one wave and fp8_k_split_us puts them ahead of the float32
# output quantised after: they ran 14.0-15.4 us over 32 K blocks, 18.7-22.7 over 56,
# 37.1-47.6 over 128 (at 15-128 tiles; calls at partial row tiles 2-5 us more, XLA's
# pads; FP8_K_SPLIT_FIXED_US + FP8_K_SPLIT_BLOCK_US a block), and the quantised-after
# path its tiling's estimate plus 2.4-11.9 us (the float32 stores, the quantiser's
# pass; FP8_QUANTIZE_AFTER_US). Ranked so, they are
# taken at 27 of 30 measured shapes of 129-1024 rows x 576-4096 columns x K = 4096-16384
# and ran 1.08-1.71x the quantised-after path at 21 of them (geometric mean over the 27:
# 1.19x), 0.995x at 384x1536x7168 and 0.94-0.99x at five (160x576x7168, 300x1024x4096,
# 384x2112x16384, 1024x576x16384, 768x1024x16384: the model does not tell them apart);
# left at 192 / 256 x 2112 x 7168 (1.02 / 0.97x) and 192x2112x16384 (0.88x; H100
# 2026-11-28).
FP8_K_SPLIT_FIXED_US = 5.7
FP8_K_SPLIT_BLOCK_US = 0.267
FP8_QUANTIZE_AFTER_US = 8.0
# A fused GLU's tiles hold 256 weight rows (128 gate, 128 up: its epilogue needs
# both, and an FP8 output whole 128-column groups), so at decode a DeepSeek-V3 MLP
# input (2 x 18432 x 7168) runs 144 of them: a second wave of 12 CTAs streaming
# their weights alone. Up to this M over >= K_SPLIT_MIN_BLOCKS K blocks the gate|up
# GEMM with the dense rules' tiles (float32 out), then the activation and product
# in XLA (and the quantiser kernel for an FP8 output), ran 1.25-1.30x faster at
# M = 1-64, 1.10x (FP8 out) / 1.16x (bf16) at 96 and 1.08x / 1.14x at 128 (with the
# dense decode tiles of `unmodelled` and the pairs below), 0.97x at 256 (H100
# 2026-11-27).
GLU_UNFUSED_MAX_M = 128
DECODE_TILES = {**DECODE_TILES, **K_SPLIT_DECODE_TILES}
# One 128-byte column of a K block from HBM with every SM streaming (3.35 TB/s
# over 132 SMs).
_COLUMN_BLOCK_US = 0.005
# A decode tile's fixed part per K block (its A tile, which every CTA reads and
# so comes from L2, and its share of the epilogue), in columns; half where the
# tiles chain.
_DECODE_FIXED_COLUMNS = 32
_CHAINED_DECODE_FIXED_COLUMNS = 16

# Large-M tiles -> efficiency relative to 128 x 256 at full waves: wider tiles
# read less A and B per FLOP; 192 x 128 balances the waves where N is narrow, and
# so does 128 x 192 split by rows (one 64 x 192 WGMMA per warpgroup: WIDE_TILES),
# which leaves the 128 x 256 tile its ties. 128 x 160 (one 64 x 160 WGMMA per
# warpgroup, promoted in 32-column parts) fills the waves that 128 x 192 leaves
# part idle where N is 4096, 1536, 576, ...: 1.06-1.16x over the 128 x 192 picks
# at 13 shapes of 200-8192 rows (fitted efficiency 0.87-0.95; H200 2026-11-28).
LARGE_M_TILES = {(128, 256, "n", 2): 1.0, (128, 128, "m", 2): 0.93,
                 (192, 128, "m", 3): 0.95, (128, 192, "m", 2): 0.98, (128, 160, "m", 2): 0.91,
                 (64, 128, "n", 2): 0.8}
# Between decode and large M, narrow N leaves the large-M tiles few: 256x2112x7168 has
# 68 64 x 128 tiles or 34 of 128 x 128 for 132 SMs. Dense GEMMs of the 128 x 128
# recipe with M <= MID_M_MAX over >= K_SPLIT_MIN_BLOCKS K blocks take narrow tiles
# that fill one wave -> (their fields, efficiency relative to 128 x 256 at full waves,
# fitted to one wave over 56 K blocks): 64 x 64 tiles whose two warpgroups split K
# (two-block steps, 6 stages) 1.78-1.80x at 192 / 256 x 2112 x 7168 (99 / 132 tiles);
# 128 x 64 in two-block steps 1.15x at 256x4096x7168, 1.19x at 384x2112x7168, 1.49x at
# 512x2112x7168; 256 x 64 (two 64 x 64 chunks a warpgroup) 1.11x at 1024x2112x7168.
# Over several waves they lost (0.55-0.98x at 192-1024 rows; H100 2026-11-27).
MID_M_MAX = 1024
# Where M leaves the last row tile partial, the forms splitting K (the others take whole
# row tiles only) rank at this multiple of their time at whole row tiles. Their kernels
# run as fast as at whole row tiles (64 x 96 0.94-1.00x at 300 / 450 / 1000 rows; 64 x
# 64 at 200 rows 1.40x slower while the last tile's TMA box ran 56 of its 64 rows past
# a, 1.48x faster since the box holds only a's rows: common.copy_a_rows); what the call
# adds there, XLA's pads of a and a_scale to whole 8- and 64-row blocks, every tiling
# pays. Ranked at 1.3, the 64 x 96 form takes the partial row tiles the 64 x 128 tiles
# split by columns had (1.03-1.36x faster at 14 shapes of 129-1000 rows x 576-4096
# columns x K = 4096-16384, geometric mean 1.23) and leaves 190x2112x7168, 700x576x7168
# to the 64 x 64 form (there 0.82 / 0.94x of it; H100 2026-11-28). 128 x 64 and 256 x 64
# ran 0.83-1.13x: those take whole row tiles only.
MID_M_PARTIAL_ROWS_COST = 1.3
# In that one wave 64 x 128 tiles split by columns (one 64 x 64 WGMMA a warpgroup and
# step) ran at 0.58 of 128 x 256's efficiency, not the 0.8 of full waves: 20.8-22.4 us
# at 51-128 tiles over 56 K blocks (192 / 256 / 384 rows x 2112 / 4096 columns).
MID_M_ONE_WAVE_64X128 = 0.58
# In one wave, warpgroups of one chunk also take the decode tiles' K loop (two-block
# steps, the scales multiplied at promotion): 128 x 128 tiles 1.14-1.22x the large-M
# form (384x4096x7168, 768x2112x7168, 256x7168x16384, 512x4096x16384), and 128 x 64
# tiles 1.05-1.08x with the scales apart (256 x 64, two chunks a warpgroup: 0.90x).
# 64 x 96 tiles whose warpgroups split K (one wide 64 x 96 chunk each, two-block
# steps, 4 stages) fill waves that 128 x 64 / 64 x 128 tiles leave partly idle (384 x
# 2112: 132 tiles against 99): 1.04-1.48x at 28 shapes of 192-1024 rows x 576-4096
# columns, K = 4096-16384 (H100 2026-11-27; in 3 warpgroups 0.86-1.00x; 64 x 192 tiles
# so, at 384 / 640 / 768 rows x 2112 / 4096, 0.93-1.12x: not taken).
MID_M_FORMS = {
    (64, 64, "k", 2): (dict(k_step=2, stages=6, scale_product=False), 0.495),
    (64, 96, "k", 2): (dict(k_step=2, stages=4, scale_product=False, wide_chunks=True), 0.54),
    (128, 64, "m", 2): (dict(k_step=2, stages=4, scale_product=False), 0.665),
    (128, 128, "m", 2): (dict(k_step=2, stages=3, scale_product=False), 0.96),
    (256, 64, "m", 2): (dict(stages=4), 0.80),
}
# Pairs of CTAs sharing their A tile by multicast (cluster_n=2) at large M:
# 256 x 128 tiles split by rows (each warpgroup two 64 x 128 chunks, as in
# DeepGEMM's kernels) -> efficiency relative to 128 x 256 at full waves, where
# the ring brings the scales (M >= TMA_SCALES_MIN_M) and the K loop is at least
# PAIRED_MIN_K_BLOCKS long. Measured +0.5-3.0% over 128 x 256 at 2048-16384 rows
# x 4096-18432 columns x K 3072-18432 (same waves), -1.4 to -0.6% at K = 1536-2048,
# -10% at M = 1024 without the scales in the ring (H100, 2026-11-27).
PAIRED_LARGE_M_TILES = {(256, 128, "m", 2): 1.015}
PAIRED_MIN_K_BLOCKS = 24
# ... with a ring of at least this many stages: where a float32 c's ring leaves
# SMEM for 2, the pairs ran 0.7-2.8% behind 128 x 256 tiles (of 2 stages too).
PAIRED_MIN_STAGES = 3
# From SCALED_RING_MIN_M rows to TMA_SCALES_MIN_M, the 256 x 128 tiles alone (not in
# pairs), their scales in the ring and their step top overlapped, over >=
# PAIRED_MIN_K_BLOCKS K blocks and a ring of >= PAIRED_MIN_STAGES -> efficiency relative
# to 128 x 256 (scales from GMEM): at the same waves +3.4-8.0% at 512-1792 rows x
# 4096-36864 columns x K = 7168-16384 (896 rows: a partial row tile; in pairs 1-2 points
# less); -1.1 / +1.7% at K = 2048, 0.86-0.97x at K = 512-1536. Where the waves differ the
# model's counts held: against 128 x 192 0.95-0.97x with more tile area per wave (512 /
# 1024 x 36864 / 18432 x 7168), 0.80-0.82x with the same waves (640-1536 rows), 1.015x
# with fewer (768x36864x7168); against 128 x 128 at 768x18432x7168 1.001x (H100 2026-11-27).
SCALED_RING_MIN_M = 512
SCALED_RING_TILES = {(256, 128, "m", 2): 1.06}
# Ragged groups: 128 x 192 split by rows (one wide chunk per warpgroup) is the
# fastest over long K loops (128 x 256 split by columns, spill-free since a
# unit runs at most one K pass behind a branch, is 3-8% behind there); over
# short ones (up to RAGGED_SHORT_K_BLOCKS) 128 x 256 split by columns is 0.4-2.9%
# ahead of 192 x 128 of three consumers (H100, 2026-11-26). 128 x 256 split by
# rows: 2-5% behind both.
RAGGED_TILES = {(128, 192, "m", 2): 1.0, (192, 128, "m", 3): 0.92, (128, 128, "m", 2): 0.91,
                (64, 128, "n", 2): 0.76}
RAGGED_SHORT_K_TILES = {(128, 256, "n", 2): 1.02, (192, 128, "m", 3): 1.0,
                        (128, 128, "m", 2): 0.94, (64, 128, "n", 2): 0.8}
RAGGED_SHORT_K_BLOCKS = 16
# ... and where the groups hold >= RAGGED_LONG_GROUP_MIN_ROWS rows on average over
# >= RAGGED_LONG_GROUP_MIN_K_BLOCKS K blocks, 192 x 128 tiles of three consumers
# (3 stages, carried slot and descriptors) ran 1.021-1.026x the 128 x 192 picks at
# 1 x 32768, 2 x ~16384 and 4 x ~8192 rows (4096x7168; three calls), 0.995x at
# 8 x ~4096 (a group's boundary cuts a taller tile in two more often); at K = 2048
# (7168 columns) 0.99-1.007x the 128 x 256 picks (H200 2026-11-28).
RAGGED_LONG_GROUP_TILES = {**RAGGED_TILES, (192, 128, "m", 3): 0.99}
RAGGED_LONG_GROUP_MIN_ROWS = 8192
RAGGED_LONG_GROUP_MIN_K_BLOCKS = 32
# Masked groups at large M: a loop of K passes around the K loop too, so tiles of
# one 64-row chunk row per warpgroup (128 x 256 and 256 x 128 ran 2.8-4x slower
# at K=7168). The ragged efficiencies do not carry over; these are the tiles'
# times per wave at random fills of masked GEMMs of 1 x 1408, 2 x 768 and 8 x 384
# rows (4096 x 7168) and 4 x 384 (7168 x 2048), per 128 x 256 of area (H100,
# 2026-11-26): 192 x 128 46.5 us, 128 x 192 48.5, 128 x 160 52.5; which is
# fastest depends on the waves a fill gives each. 128 x 128 tiles are left out:
# 6% behind 192 x 128 on the mean, 19% on fills that give them a last, mostly
# idle wave.
MASKED_TILES = {(192, 128, "m", 3): 1.0, (128, 192, "m", 2): 0.96, (128, 160, "m", 2): 0.885,
                (64, 128, "n", 2): 0.6}
# ... of which these walk the groups' live tiles first (HopperConfig.live_first),
# so that the estimate's even share of the live tiles among the CTAs holds:
# under the plain walk 128 x 160 tiles at 1 x 1408 took a third wave where two
# held every live tile. The plain walk deals 192 x 128 tiles unevenly too at most
# capacities (a CTA's units a multiple of 132 apart fall in the same row tile
# where the row tiles divide 132 or its band of 8 column tiles): live-first they
# ran 1.09-1.45x faster on the mean of random fills at 1 x 1024, 1 x 1152,
# 1 x 1408 (expected 1024), 4 x 512 7168x2048, 2 x 2048 and 8 x 512 (up to 1.66x
# at one fill), 0.97-1.01x at fills the plain walk happens to balance (H200,
# 2026-11-29).
MASKED_LIVE_FIRST_TILES = ((128, 192, "m", 2), (128, 160, "m", 2), (192, 128, "m", 3))
# The live-first walk scans the groups' row counts, unrolled, for every tile:
# up to this many groups. Beyond, tiles the estimate also takes walked plainly
# (MASKED_PLAIN_WALK_TILES) walk so, the others are not candidates.
MASKED_LIVE_FIRST_MAX_GROUPS = 16
MASKED_PLAIN_WALK_TILES = ((192, 128, "m", 3),)


def masked_walk(tile: tuple, groups: int, sparse: bool) -> bool | None:
  """Whether a masked GEMM's tiling of this tile (tile_key) walks live-first
  (HopperConfig.live_first): the tables' tiles, and every tile at sparse fills
  (sparse_fill); None where it is no candidate: past MASKED_LIVE_FIRST_MAX_GROUPS
  groups only MASKED_PLAIN_WALK_TILES remain, walking plainly."""
  live = sparse or tile in MASKED_LIVE_FIRST_TILES
  if live and groups > MASKED_LIVE_FIRST_MAX_GROUPS:
    return False if tile in MASKED_PLAIN_WALK_TILES else None
  return live
# Masked wide tiles stage no a-scale windows (within +-1% at 4 x 256 and 4 x 384
# 7168x2048; 128 x 160 3% slower with them).
# These tiles take a ring one stage past RING_BYTES, masked and dense (the
# tables' efficiencies are the deeper ring's): 4 stages of 128 x 192, masked
# 4 x 384 7168x2048 45.4 us over four fills against 48.3 with 3; dense
# 4096x2112x7168 +2.2-2.4%, 1024 / 2048 / 8192 / 16384 rows x 2112x7168 +2.1 /
# +0.1 / +2.3 / +1.0%, 256x24576x1536 +4.3%, 256x18432x7168 +5.7%, 512 rows x
# 18432x7168 / 36864x7168 +2.9%, 1024x18432x7168 +1.4%, 4096x7000x1000 +1.0% (H100,
# 2026-11-26). Ragged groups (their row-exact stores take more SMEM; not measured)
# keep RING_BYTES.
DEEPER_RING_TILES = ((128, 192, "m", 2),)
# ... and these in dense GEMMs over long K loops only, with their efficiency there
# (LARGE_M_TILES has the shallower ring's): 192 x 128 tiles of three consumer
# warpgroups (each promotion behind two other warpgroups' WGMMAs) in 4 stages with
# carried descriptors ran 1.009-1.026x the 128 x 192 picks at 4096 / 8192 x 2112 x
# 7168 (same waves; bf16 and float32 out), in 3 stages 0.95-0.97x (H200 2026-11-28).
# Shorter K loops are not measured.
DENSE_DEEPER_RING_TILES = {(192, 128, "m", 3): 0.99}
DENSE_DEEPER_RING_MIN_K_BLOCKS = 32
# ... and in masked GEMMs over those K loops, the ring bringing the scales too and
# the step top overlapped (MASKED_TILES' efficiency): against 3 stages of scales from
# GMEM, 1.022-1.031x at 1 x ~1024 4096x7168 (three runs of 3-4 fills), 1.042 at 2 x
# 512, 1.045 at 4 x 1024 7168x7168, 1.015 at 8 x 384; 4 stages of scales from GMEM ran
# 0.95x (H200 2026-11-28). Where the model picks other tiles it stays behind them
# (0.97x 128 x 160 at 2 x ~512; over 16 K blocks 0.91x 128 x 192 at 4 x ~256).
# 128 x 160 tiles (live-first, scales from GMEM) in 5 stages against 4: 1.009, 1.013
# and 1.011x at 2 x ~512 4096x7168 (three sessions' fills; 6 stages 1.008 / 1.014x).
# Tile -> whether its deeper ring brings the scales too.
MASKED_DEEPER_RING_TILES = {(192, 128, "m", 3): True, (128, 160, "m", 2): False}
# ... and masked 192 x 128 tiles over shorter K loops of at least
# MASKED_SHORT_K_DEEPER_RING_MIN_K_BLOCKS too, their scales from GMEM: 4 stages against
# 3, 1.058x at 2 x ~512 7168x2048 and 1.018x at 1 x ~1024 7168x2048 (the ring
# bringing the scales too: 1.023x / 0.991x; six fills each, every fill faster; H200
# 2026-11-29). Shorter loops are not measured.
MASKED_SHORT_K_DEEPER_RING_TILES = ((192, 128, "m", 3),)
MASKED_SHORT_K_DEEPER_RING_MIN_K_BLOCKS = 16
# The masked GEMMs' row counts (masked_m) are known on the device only: their
# estimate averages over MASKED_DRAWS fills, each group's rows spread evenly
# over half its capacity M to all of it, independently of the other groups'
# (what tools/masked_tilings.py draws at random): a tile's wave count jumps with
# the live tiles of all groups together.
MASKED_DRAWS = 33


# Told a group's expected rows e (expected_m), the fills spread evenly over
# [0.7 e, 1.3 e] (as DeepGEMM's masked tests draw them around its hint), capped
# at the capacity.
EXPECTED_SPREAD = (0.7, 1.3)


def masked_fills(groups: int) -> list[list[float]]:
  """[draw][group] points in [0, 1): draw i of group 0 at the i-th point of an
  even grid, the other groups' offset along it by the golden ratio (a
  low-discrepancy set: no two groups fill alike)."""
  return [[((i + 0.5) / MASKED_DRAWS + g * 0.6180339887) % 1.0 for g in range(groups)]
          for i in range(MASKED_DRAWS)]


def masked_rows(m: int, groups: int, expected_m: int | None = None) -> list[list[int]]:
  """[draw][group] rows of the fills a masked estimate averages over: spread
  over [m / 2, m] (m: the capacity), or over EXPECTED_SPREAD times expected_m
  and at most m."""
  lo, hi = ((0.5 * m, m) if expected_m is None
            else (EXPECTED_SPREAD[0] * expected_m, EXPECTED_SPREAD[1] * expected_m))
  return [[min(m, math.ceil(lo + (hi - lo) * u)) for u in draw] for draw in masked_fills(groups)]


def masked_capacity(m: int, expected_m: int | None = None, groups: int = 1) -> int:
  """The capacity whose tilings a masked GEMM of capacity m chooses from: m, or
  the most rows its expected fills hold (a capacity far past them, e.g. every
  token of a batch, takes the tiles of the rows it will hold: 8 groups of ~256
  rows in 2048 at 4096x7168 1.40x faster, 2 of ~512 in 768 1.04x; H100,
  2026-11-27). Expected decode fills (at most DECODE_MAX_M rows) take the
  decode tiles of DECODE_MAX_M rows, a group's rows in one row tile, where the
  live-first walk is taken (`sparse_fill`): 1.06-1.53x faster than m's tiles
  walked so, 1.28-1.73x than m's tiles as they were (8 groups of ~64 or ~96
  rows in 1024-2048, 16 of ~32 in 2048). Elsewhere they keep m's tiles: the
  decode tiles' plain walk ran 1.7x slower at 8 groups of ~64 rows in 2048
  (4096x7168)."""
  if expected_m is None:
    return m
  rows = math.ceil(EXPECTED_SPREAD[1] * expected_m)
  if rows > DECODE_MAX_M:
    return min(m, rows)
  return DECODE_MAX_M if sparse_fill(m, expected_m, groups) else m


def sparse_fill(m: int, expected_m: int | None, groups: int) -> bool:
  """Whether a masked GEMM's expected fills hold at most a quarter of its
  capacity m: every tiling then walks the groups' live tiles first (up to
  MASKED_LIVE_FIRST_MAX_GROUPS groups), as the plain walk deals them unevenly
  (192 x 128 tiles 1.21-1.64x faster live-first with 2-10% of the capacity
  filled; they walk live-first at any fill now: MASKED_LIVE_FIRST_TILES). A
  capacity of at most DECODE_MAX_M rows is one row tile of the decode tiles: no
  walk to mend."""
  return (expected_m is not None and groups <= MASKED_LIVE_FIRST_MAX_GROUPS
          and m > DECODE_MAX_M and EXPECTED_SPREAD[1] * expected_m <= m / 4)


# Tiles whose warpgroups' columns form one wide WGMMA chunk (HopperConfig.wide_chunks).
WIDE_TILES = ((128, 192, "m", 2), (128, 160, "m", 2))
# Per-row b scales (a column factor per chunk column next to the row factors)
# spill beyond one 64 x 128 accumulator per warpgroup: 128 x 128 tiles. With the
# scales brought by TMA (below) the warpgroups one above the other are 1% ahead;
# with GMEM scales (M < 2048: rare, a weight gradient's M is a feature
# dimension) the side-by-side ones (two 64 x 64 chunks each) were 4% ahead.
# 128 x 160 tiles (one wide 64 x 160 chunk a warpgroup, the scales by TMA, 5
# stages) ran 1.004-1.067x the 128 x 128 ones at the training benchmark's four
# weight gradients (7168 / 18432 features x 4096 / 16384 tokens; H200 2026-11-29):
# fewer tiles, each longer, for about the same registers.
PER_ROW_B_TILES = {(128, 128, "m", 2): 1.0, (128, 128, "n", 2): 0.99, (64, 128, "n", 2): 0.8,
                   (128, 160, "m", 2): 1.03}
PER_ROW_B_TMA_ONLY_TILES = ((128, 160, "m", 2),)  # measured with the scales by TMA only
# Each ring slot's scales brought by its TMA (HopperConfig.tma_scales) from
# this M on, outside masked groups and two-block steps: dense GEMMs at M = 2048
# and 4096 1-5% faster, per-row b scales 7-14%, ragged groups 0-3%; at
# M = 1024 (one 128 x 256 tile per CTA) 7% slower, masked 192 x 128 tiles
# 3-7% slower over fills, decode tiles (one-block steps) 8-14% slower.
TMA_SCALES_MIN_M = 2048
# One K block of a 128 x 256 tile at large M (~1300 TFLOP/s over 132 SMs).
_TILE_BLOCK_US = 0.85
# A large-M tile's fixed part (first loads, epilogue) in K blocks of its own
# loop (fitted to 4096x32768x512: chained 192 x 128 993 TFLOP/s, unchained
# 128 x 256 845); half where 192 x 128 tiles chain over a short K loop with a
# ring at most as deep. Other large-M tiles' chained rings measured no such gain.
_LARGE_M_FIXED_BLOCKS = 2.6
SHORT_K_CHAINED_TILES = ((192, 128, "m", 3),)
SHORT_K_MAX_BLOCKS = 4  # a ring holding a longer K loop would take L1's SMEM
# ... where M fills the 192-row tiles to this fraction (H100, M = 1000-1024, 89%: at
# 2 K blocks 5-9% slower than 128 x 256, at 4 up to 5% faster; not modelled).
SHORT_K_MIN_FILL = 0.95

# The ring of a tile: about this much SMEM, at most 8 stages; what SMEM leaves
# free is L1, where the scale loads hit. Deeper rings run their K loop slower.
RING_BYTES = 144 * 1024
_L1_LOSS = 1.03
# ... except a 4-deep ring of 128 x 256 tiles chained over a K loop of at least
# this many blocks: its K loop runs faster (at 56 blocks it was slower).
_DEEP_RING_TILE = (128, 256)
_DEEP_RING_STAGES = 4
_DEEP_RING_MIN_BLOCKS = 64
_DEEP_RING_GAIN = 0.95
# ... and a 5-deep ring of 128 x 128 tiles with per-row b scales in it
# (tma_scales): 3-8% faster than 4 stages (weight gradients, H100, 2026-11-26);
# of 128 x 160 tiles, 2.7% (7168x18432x4096, H200 2026-11-29).
_PER_ROW_RING_TILES = ((128, 128), (128, 160))
_PER_ROW_RING_STAGES = 5
_PER_ROW_RING_GAIN = 0.95

# Two K blocks per pipeline step: a step boundary (barrier wait, scale loads,
# bookkeeping) comes once per two blocks, saving this share of a block's time;
# the first step waits for two blocks' loads (one block more per unit). Only
# for tiles whose one-block ring holds this many stages: fewer make a two-block
# ring of 2 stages past RING_BYTES, which starves (1.14-1.71x slower).
_TWO_BLOCK_SAVING = 0.087
_TWO_BLOCK_FILL_BLOCKS = 1.0
_TWO_BLOCK_MIN_RING = 4

# K splits at decode: units of all M rows in 64 columns (B is read once) in one
# wave, over K loops of at least this many blocks (measured faster from K=4096,
# slower at 2048); the float32 partials' reduction (a second pass) costs this.
SPLIT_K_TILE_N = 64
SPLIT_K_MIN_BLOCKS = 32
_SPLIT_K_REDUCTION_US = 2.0

# Pairs of 128-row decode CTAs in one wave sharing their A tile by multicast
# (with two-block steps one stage more): each loads half of A, saving these
# columns of every K block; the pair's cluster costs a fixed time per tile.
_SHARED_A_COLUMNS = 10
_CLUSTER_US = 2.8
# ... and over several waves where K loops are long: 128 x 64 pairs at M = 128,
# N = 18432-36864, K = 4096-18432 1.02-1.14x over the tiles the rules took before
# (64 x 64 tiles, two row tiles reading each B tile, or 128 x 64 alone; H100
# 2026-11-27); at K = 1536-2048 no gain (0.98-0.99x).
DECODE_PAIRS_MIN_BLOCKS = 32


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _one_block_ring(cfg: HopperConfig) -> int:
  most = 8 if cfg.k_stride == 1 else K_SPLIT_RING
  return max(2, min(most, RING_BYTES // ((cfg.tile_m + cfg.tile_n) * K_BLOCK)))


def ring_stages(cfg: HopperConfig) -> int:
  """The ring depth (stages of k_step blocks) of about RING_BYTES for cfg's
  tile, at least 2; warpgroups splitting K take a multiple of their count (a
  slot always goes to the same one), rounded up, at least two each."""
  stages = max(2, _one_block_ring(cfg) // cfg.k_step)
  if cfg.k_stride == 1:
    return stages
  # Two slots a warpgroup at least: its next step's loads in flight.
  return max(2, _cdiv(stages, cfg.k_stride)) * cfg.k_stride


def tile_key(cfg: HopperConfig) -> tuple:
  return cfg.tile_m, cfg.tile_n, cfg.wg_split, cfg.consumers


def large_m_tiles(k: int, *, b_scale_rows: int = SCALE_N, row_masks: bool = False,
                  masked: bool = False, group_rows: int | None = None) -> dict:
  """The large-M tile table of a problem: grouped GEMMs and per-row b scales have
  their own (register pressure; see the tables). group_rows: the mean rows of a
  ragged problem's groups, where known."""
  if masked:
    return MASKED_TILES
  if row_masks:
    if _cdiv(k, K_BLOCK) <= RAGGED_SHORT_K_BLOCKS:
      return RAGGED_SHORT_K_TILES
    if (group_rows is not None and group_rows >= RAGGED_LONG_GROUP_MIN_ROWS
        and _cdiv(k, K_BLOCK) >= RAGGED_LONG_GROUP_MIN_K_BLOCKS):
      return RAGGED_LONG_GROUP_TILES
    return RAGGED_TILES
  if b_scale_rows == 1:
    return PER_ROW_B_TILES
  return LARGE_M_TILES


def _scaled_ring_k_loop(cfg: HopperConfig, k: int, table: dict) -> bool:
  """The K loop the 256 x 128 tiles were measured in (PAIRED_LARGE_M_TILES,
  SCALED_RING_TILES): a dense 128x128-scaled GEMM's, the scales in a ring of >=
  PAIRED_MIN_STAGES one-block steps, >= PAIRED_MIN_K_BLOCKS K blocks, no K split."""
  return (table is LARGE_M_TILES and cfg.tma_scales and cfg.split_k == 1 and cfg.k_step == 1
          and cfg.stages >= PAIRED_MIN_STAGES and _cdiv(k, K_BLOCK) >= PAIRED_MIN_K_BLOCKS)


def paired_large_m(cfg: HopperConfig, m: int, k: int, table: dict) -> bool:
  """Whether cfg is a modelled pair sharing A at large M (PAIRED_LARGE_M_TILES)."""
  return (m > DECODE_MAX_M and cfg.cluster_n == 2 and tile_key(cfg) in PAIRED_LARGE_M_TILES
          and _scaled_ring_k_loop(cfg, k, table))


def scaled_ring_tile(cfg: HopperConfig, m: int, k: int, table: dict) -> bool:
  """Whether cfg is a modelled SCALED_RING_TILES tile (SCALED_RING_MIN_M <= M <
  TMA_SCALES_MIN_M): alone, its step top overlapped."""
  return (SCALED_RING_MIN_M <= m < TMA_SCALES_MIN_M and tile_key(cfg) in SCALED_RING_TILES
          and cfg.cluster_m == cfg.cluster_n == 1 and cfg.step_top_overlap
          and _scaled_ring_k_loop(cfg, k, table))


def _mid_m(m: int, k: int, table: dict) -> bool:
  """Whether a problem lies between decode and large M (MID_M_FORMS)."""
  return (DECODE_MAX_M < m <= MID_M_MAX and table is LARGE_M_TILES
          and _cdiv(k, K_BLOCK) >= K_SPLIT_MIN_BLOCKS)


def in_mid_m_form(cfg: HopperConfig) -> bool:
  """Whether cfg has the tile and K loop of one of the MID_M_FORMS (a 128 x 128 tile
  of one-block steps is the large-M form)."""
  form = MID_M_FORMS.get(tile_key(cfg))
  return form is not None and (cfg.k_step, cfg.scale_product) == (
      form[0].get("k_step", 1), form[0].get("scale_product", True))


def mid_m_form(cfg: HopperConfig, m: int, k: int, table: dict) -> bool:
  """Whether cfg is one of the MID_M_FORMS where they are modelled (one wave aside)."""
  return (in_mid_m_form(cfg) and _mid_m(m, k, table)
          and (m % cfg.tile_m == 0 or cfg.wg_split == "k")
          and cfg.split_k == 1 and cfg.cluster_m == cfg.cluster_n == 1)


def units(cfg: HopperConfig, m: int, n: int, groups: int = 1) -> int:
  """Units of work of the persistent grid: clusters of tiles x K splits x groups."""
  return (_cdiv(_cdiv(m, cfg.tile_m), cfg.cluster_m)
          * _cdiv(_cdiv(n, cfg.tile_n), cfg.cluster_n) * cfg.split_k * groups)


def grid(cfg: HopperConfig, m: int, n: int, groups: int = 1, num_sms: int | None = None) -> int:
  """CTAs (clusters) of the persistent grid (num_sms: the device's, if not cfg's)."""
  sms = cfg.num_sms or num_sms or hopper.num_sms()
  return min(sms // (cfg.cluster_m * cfg.cluster_n), units(cfg, m, n, groups))


def unit_steps(cfg: HopperConfig, k: int) -> int:
  """Pipeline steps of one unit of work."""
  return _cdiv(_cdiv(k, K_BLOCK) // cfg.split_k, cfg.k_step)


def chains_tiles(cfg: HopperConfig, m: int, n: int, k: int, groups: int = 1,
                 num_sms: int | None = None) -> bool:
  """Whether every CTA runs >= 2 tiles and the ring wraps exactly at a tile's
  end: such tilings measured a smaller fixed cost per tile (the next tile's
  first loads fill a ring its predecessor leaves in step)."""
  return (units(cfg, m, n, groups) >= 2 * grid(cfg, m, n, groups, num_sms)
          and unit_steps(cfg, k) % cfg.stages == 0)


def tma_scales_pay(m: int, masked: bool, k_step: int) -> bool:
  """Whether the ring's TMA should bring each slot's scales (TMA_SCALES_MIN_M)."""
  return m >= TMA_SCALES_MIN_M and not masked and k_step == 1


# Dense tiles of one wide chunk a warpgroup take the ring's scales (their step top
# overlapped, their descriptors carried) below TMA_SCALES_MIN_M too, from this M over
# >= PAIRED_MIN_K_BLOCKS K blocks, in place of the staged a-scale window (128 x 192) or
# the scales from GMEM (128 x 160): 1280x4096x7168 (128 x 160) 1.008x, 1536x4096x7168
# 1.044x and 1280x2112x7168 1.014x (128 x 192), one tile per CTA over 448 K blocks at
# 1536 rows 1.079x (128 x 160) and 1.067x (128 x 192) (H200 2026-11-29, the XLA
# transpose of the a-scales included).
WIDE_RING_SCALES_TILES = ((128, 192, "m", 2), (128, 160, "m", 2))
WIDE_RING_SCALES_MIN_M = 1024


def wide_tile_ring_scales(tile: tuple, m: int, k: int, *, b_scale_rows: int) -> bool:
  """Whether a dense GEMM's WIDE_RING_SCALES_TILES tile takes the ring's scales
  where the M rule (tma_scales_pay) would not."""
  return (tuple(tile) in WIDE_RING_SCALES_TILES and b_scale_rows == SCALE_N
          and WIDE_RING_SCALES_MIN_M <= m < TMA_SCALES_MIN_M
          and _cdiv(k, K_BLOCK) >= PAIRED_MIN_K_BLOCKS)


# 128 x 256 tiles overlap their step top only in dense GEMMs with a bfloat16 output
# and no residual: +0.5-0.9% there (their 12 spilled bytes are stored before the K
# loop and loaded after it, once a tile), 0.4-1.4% slower with a float32 output or
# a residual, 0.7-2.1% slower in ragged GEMMs (H100 2026-11-27).
_PLAIN_OVERLAP_TILE = (128, 256)


def step_top_overlap_pays(tile: tuple[int, int], tma_scales: bool, *, grouped: bool = False,
                          b_scale_rows: int, plain_output: bool = True) -> bool:
  """Whether a tiling of (tile_m, tile_n) with the scales in the ring overlaps
  its step top (HopperConfig.step_top_overlap): GEMMs of 128x128 b scales (per-row
  b scales ran 5-7% slower with it). Dense: +0.2-1.4% at the M = 4096 shapes;
  grouped (ragged) K loops, which read the scales after the first WGMMA's issue
  but test no barrier ahead: +0.3-1.0% at 4096x7168 (128 x 192 and 128 x 128
  tiles, aligned and unaligned groups); _PLAIN_OVERLAP_TILE only where it pays.
  plain_output: a bfloat16 output and no residual c."""
  if not tma_scales or b_scale_rows != SCALE_N:
    return False
  if tuple(tile) == _PLAIN_OVERLAP_TILE:
    return not grouped and plain_output
  return True


# Dense tilings whose K loop carries its WGMMA descriptors (HopperConfig.desc_carry):
# one wide chunk a warpgroup (128 x 192 +2.2% at 4096x2112x7168, 128 x 160 +1.2%
# at 1280x4096x7168 and +1.7% at 2048x2112x7168) and 256 x 128 split by rows (in
# pairs sharing A +1.1% at 4096x4096x7168); not 128 x 256 split by columns (-1.1 to
# -1.5% at 4096x7168x2048) nor 128 x 128 (-0.3% at 2000x7168x2048) (H200 2026-11-28).
# Per-row b scales (the weight gradient's 128 x 128: +0.3-0.4%) keep Pallas's wgmma.
# The 192 x 128 tiles of three consumers carry them where they take the deeper ring
# (DENSE_DEEPER_RING_TILES; in 3 stages +1.0-1.1% at 4096 x 2112 / 4096 x 7168, in the
# short-K chained form 1.000 at 4096x32768x512).
DESC_CARRY_TILES = ((128, 192, "m", 2), (128, 160, "m", 2), (256, 128, "m", 2))
# Masked grouped tilings that carry them, every one measured (H200 2026-11-28, over
# random fills): 128 x 160 +2.0% (2 x 512 4096x7168), the decode 128 x 256 split by
# columns +1.9% (32 x 64), 192 x 128 of three consumers +0.5% (1 x 1024), 128 x 192
# +0.2% (4 x 256 7168x2048). Contiguous (ragged) groups carry them where their loop
# carries its ring slot (carried_slot_pays): 128 x 192 +0.9-1.0% at 16 x ~2048 and
# 64 x ~512 4096x7168, 128 x 128 +0.7-0.8% at 8 x ~256 4096x7168 and 7168x2048
# (without the slot carried 128 x 192 ran -0.7% at 4 x 8192). So carried, 128 x 192
# tiles run 1.00-1.025x the 256 x 128 tiles (two chunks a warpgroup, carrying their
# descriptors) at 2-8 groups of 32768 rows, aligned and not (H200 2026-11-28),
# which a rule had taken ahead of the model there before.
MASKED_DESC_CARRY_TILES = ((128, 160, "m", 2), (128, 256, "n", 2), (192, 128, "m", 3),
                           (128, 192, "m", 2))


def desc_carry_pays(cfg: HopperConfig, m: int, k: int, *, grouped: bool, masked: bool,
                    b_scale_rows: int) -> bool:
  """Whether a tiling's K loop carries its WGMMA descriptors (DESC_CARRY_TILES,
  dense DENSE_DEEPER_RING_TILES in their deeper ring, MASKED_DESC_CARRY_TILES,
  ragged loops carrying their slot)."""
  if not cfg.can_carry_descriptors():
    return False
  if masked:
    return tile_key(cfg) in MASKED_DESC_CARRY_TILES
  if grouped:
    return carried_slot_pays(cfg, grouped=grouped, masked=masked)
  return b_scale_rows == SCALE_N and (tile_key(cfg) in DESC_CARRY_TILES
                                      or in_dense_deeper_ring(cfg, m, k))


# Tilings whose ring is filled by one producer warp (HopperConfig.producer_warp): one
# WGMMA chunk a consumer warpgroup. Dense, against the four-warp producer (H200
# 2026-11-29, bf16 output, outputs checked): 128 x 160 +1.0-2.1%, 128 x 192 +1.2%,
# 192 x 128 of three consumers +1.4-2.2%, and +1.7% over 4 K blocks (4096x32768x512).
# Nsight Compute (1536x1760x57344, 128 x 160) put the four warps' ~35 instructions a
# step beside the consumers' promotions, whose warps lost 89 cycles a step "not
# selected" (DeepGEMM's, of one producer warp: 21). Tile -> the fewest K blocks it was
# measured from (the two-consumer tiles over K >= 2048 only). No clusters.
PRODUCER_WARP_TILES = {(128, 160, "m", 2): 16, (128, 192, "m", 2): 16, (192, 128, "m", 3): 1}
# Dense GEMMs (128x128 b scales) of two chunks a warpgroup, since the probe in flight
# (H200 2026-11-29 ~12:20): 128 x 256 split by columns +0.6-0.9% (six shapes, K = 1536 -
# 7168; FP8 output +1.6%; float32 output 1.6% slower: not there), 128 x 128 +0.7-1.5%
# (K = 2048, 16384; bf16 output). No clusters. At 2048-8192 rows only: at 512 rows
# (512x7168x2048, one 128 x 256 tile a CTA) ptxas spilled 16 bytes with it.
PRODUCER_WARP_DENSE_TILES = {(128, 256, "n", 2): 12, (128, 128, "m", 2): 16}
PRODUCER_WARP_DENSE_MIN_M = 2048
# ... and 256 x 128 pairs sharing A (cluster_n = 2) over N >= 7168: +0.8-1.7% (four
# shapes, K = 7168 - 18432; float32 output +1.2%, FP8 +4.2%, a bf16 residual +3.4%);
# at N = 4096 1.6-4.7% slower (three of four shapes; Nsight Compute at 4096x4096x7168:
# some SMs busy 10% longer than the mean, none so with four producer warps).
PRODUCER_WARP_PAIRS = {(256, 128, "m", 2): 56}
PRODUCER_WARP_PAIRS_MIN_N = 7168


def producer_warp_pays(cfg: HopperConfig, m: int, n: int, k: int, *, dense: bool,
                       f32_out: bool = False) -> bool:
  """Whether one warp issues the ring's loads: PRODUCER_WARP_TILES over K loops of at
  least their blocks, and for dense GEMMs (128x128 b scales, no groups) the tables
  beside it (PRODUCER_WARP_DENSE_TILES from PRODUCER_WARP_DENSE_MIN_M rows, not with
  a float32 output; PRODUCER_WARP_PAIRS sharing A over N >= PRODUCER_WARP_PAIRS_MIN_N);
  one-block steps, no staged a-scale window."""
  if not cfg.can_use_producer_warp() or cfg.k_step != 1:
    return False
  key = tile_key(cfg)
  if cfg.cluster_m * cfg.cluster_n > 1:
    pairs = dense and cfg.cluster_n == 2 and n >= PRODUCER_WARP_PAIRS_MIN_N
    min_blocks = PRODUCER_WARP_PAIRS.get(key) if pairs else None
  else:
    min_blocks = PRODUCER_WARP_TILES.get(key)
    if min_blocks is None and dense and not f32_out and m >= PRODUCER_WARP_DENSE_MIN_M:
      min_blocks = PRODUCER_WARP_DENSE_TILES.get(key)
  return min_blocks is not None and _cdiv(k, K_BLOCK) >= min_blocks


def probe_in_flight_pays(cfg: HopperConfig, *, grouped: bool) -> bool:
  """Whether a K loop that tests the next slot's barrier ahead (step_top_overlap,
  in a loop carrying its slot) tests it while the step's last WGMMA runs
  (HopperConfig.probe_in_flight): two consumer warpgroups. Against the test after
  the WGMMA's wait (H200 2026-11-29, outputs checked): 256 x 128 pairs +1.2-1.5%
  (4096x18432x7168, 4096x7168x18432, 4096x7168x16384), 128 x 128 +1.0%
  (2048x7168x16384), 128 x 160 +0.4-0.6% (1536x1760x57344), ragged 128 x 192
  +0.1%; three consumers (192 x 128) 3.5-4.2% slower (4096x2112x7168, ragged
  4 x 8192)."""
  loop_probes = not grouped or cfg.carried_slot
  return cfg.step_top_overlap and loop_probes and cfg.consumers == 2


def carried_slot_pays(cfg: HopperConfig, *, grouped: bool, masked: bool) -> bool:
  """Whether a ragged tiling's K loop carries its ring slot (HopperConfig.carried_slot):
  where each consumer warpgroup holds one WGMMA chunk. Against the slot derived
  from the step (H200 2026-11-28, random group sizes, outputs equal): 128 x 192
  +0.8-1.4% (8-64 groups of ~512-2048 rows, 4096x7168), 128 x 128 split by rows
  +2.4-2.8% (8 x ~256 rows at 4096x7168 and 7168x2048); with two chunks a
  warpgroup (256 x 128, 128 x 256) ptxas made the loop 3.4-4.2x slower."""
  return grouped and not masked and cfg.chunks_per_warpgroup() == 1


def _deep_ring(cfg: HopperConfig, m: int) -> bool:
  """The 4-deep ring of 128 x 256 tiles at large M (past RING_BYTES), its scales
  from GMEM (with them in the ring it spilled and ran 4% slower than 3 stages)."""
  return (m > DECODE_MAX_M and (cfg.tile_m, cfg.tile_n) == _DEEP_RING_TILE and cfg.k_step == 1
          and cfg.stages == _DEEP_RING_STAGES and not cfg.tma_scales)


def _per_row_deep_ring(cfg: HopperConfig, per_row_b: bool) -> bool:
  """The 5-deep ring of _PER_ROW_RING_TILES with per-row b scales in it."""
  return (per_row_b and cfg.tma_scales and (cfg.tile_m, cfg.tile_n) in _PER_ROW_RING_TILES
          and cfg.stages == _PER_ROW_RING_STAGES)


def takes_deeper_ring(tile: tuple, m: int, k: int, *, row_masks: bool, b_scale_rows: int,
                      masked: bool) -> bool:
  """Whether a large-M tile (tile_key) of a problem runs only with the ring one
  stage past RING_BYTES (DEEPER_RING_TILES: dense and masked 128x128-scaled GEMMs;
  DENSE_DEEPER_RING_TILES: dense ones over long K loops whose ring brings the
  scales, as measured; MASKED_DEEPER_RING_TILES: masked ones over those loops,
  the ring bringing the scales too where measured so, deeper_ring_scales_in_ring;
  MASKED_SHORT_K_DEEPER_RING_TILES: masked ones over shorter loops)."""
  long_k = _deeper_ring_long_k(k)
  deeper = tile in DEEPER_RING_TILES or (long_k and (
      (tile in DENSE_DEEPER_RING_TILES and not masked and m >= TMA_SCALES_MIN_M)
      or (tile in MASKED_DEEPER_RING_TILES and masked))) or (
          masked and tile in MASKED_SHORT_K_DEEPER_RING_TILES
          and _cdiv(k, K_BLOCK) >= MASKED_SHORT_K_DEEPER_RING_MIN_K_BLOCKS)
  return deeper and not row_masks and b_scale_rows == SCALE_N


def deeper_ring_scales_in_ring(tile: tuple, k: int, *, masked: bool) -> bool:
  """Whether a tile that takes its deeper ring (takes_deeper_ring) has the ring
  bring the scales where the M rule (tma_scales_pay) would not: masked
  MASKED_DEEPER_RING_TILES over long K loops, where measured so (over shorter
  ones, MASKED_SHORT_K_DEEPER_RING_TILES, the scales come from GMEM)."""
  return masked and _deeper_ring_long_k(k) and MASKED_DEEPER_RING_TILES.get(tile, False)


def _deeper_ring_long_k(k: int) -> bool:
  """Whether a K loop is one of the long ones DENSE_DEEPER_RING_TILES and
  MASKED_DEEPER_RING_TILES were measured over."""
  return _cdiv(k, K_BLOCK) >= DENSE_DEEPER_RING_MIN_K_BLOCKS


def deeper_ring(cfg: HopperConfig) -> bool:
  """A tile of DEEPER_RING_TILES, DENSE_DEEPER_RING_TILES or MASKED_DEEPER_RING_TILES
  with its ring one stage deeper (the callers tell dense from masked)."""
  key = tile_key(cfg)
  return ((key in DEEPER_RING_TILES or key in DENSE_DEEPER_RING_TILES
           or key in MASKED_DEEPER_RING_TILES) and cfg.stages == ring_stages(cfg) + 1)


def in_dense_deeper_ring(cfg: HopperConfig, m: int, k: int, *,
                         b_scale_rows: int = SCALE_N) -> bool:
  """A dense GEMM's tile of DENSE_DEEPER_RING_TILES in the deeper ring it takes."""
  return (tile_key(cfg) in DENSE_DEEPER_RING_TILES and deeper_ring(cfg)
          and takes_deeper_ring(tile_key(cfg), m, k, row_masks=False,
                                b_scale_rows=b_scale_rows, masked=False))


def _short_k(cfg: HopperConfig, m: int, k: int) -> bool:
  """192 x 128 tiles at large M over a short K loop, the ring at most as deep, M
  filling the tiles."""
  return (m > DECODE_MAX_M and tile_key(cfg) in SHORT_K_CHAINED_TILES
          and cfg.stages <= _cdiv(k, K_BLOCK) <= SHORT_K_MAX_BLOCKS
          and m / (_cdiv(m, cfg.tile_m) * cfg.tile_m) >= SHORT_K_MIN_FILL)


def _past_ring_bytes(cfg: HopperConfig) -> bool:
  """Whether cfg's ring is deeper than ring_stages (pairs sharing A with two-block
  steps: one more)."""
  return cfg.stages > ring_stages(cfg) + (cfg.cluster_n > 1 and cfg.k_step > 1)


def _gemms_and_group_rows(m: int, groups: int, row_masks: bool) -> tuple[int, int | None]:
  """(GEMMs side by side, the rows a ragged group holds on average): ragged groups
  (row_masks) are one GEMM of m rows to the model (its units count no groups)."""
  return (1, m // groups) if row_masks else (groups, None)


def unmodelled(cfg: HopperConfig, m: int, n: int, k: int, groups: int = 1, *,
               b_scale_rows: int = SCALE_N, row_masks: bool = False, masked: bool = False,
               num_sms: int | None = None) -> str | None:
  """Why the model has no estimate for cfg (autotuning still times it), or None.
  groups: GEMMs of this shape side by side, or with row_masks the ragged groups
  of one; b_scale_rows=1: per-row b scales; row_masks: ragged groups; masked:
  masked groups of capacity m; num_sms: the device's, if cfg does not say."""
  groups, group_rows = _gemms_and_group_rows(m, groups, row_masks)
  decode = m <= DECODE_MAX_M
  one_wave = units(cfg, m, n, groups) <= grid(cfg, m, n, groups, num_sms)
  table = DECODE_TILES if decode else large_m_tiles(k, b_scale_rows=b_scale_rows,
                                                    row_masks=row_masks, masked=masked,
                                                    group_rows=group_rows)
  paired = paired_large_m(cfg, m, k, table)
  if not decode and in_mid_m_form(cfg):
    if not (mid_m_form(cfg, m, k, table) and one_wave):
      return (f"{list(MID_M_FORMS)} tiles other than in their measured forms in one wave "
              f"of a dense GEMM of {DECODE_MAX_M} < M <= {MID_M_MAX} rows over >= "
              f"{K_SPLIT_MIN_BLOCKS} K blocks (whole row tiles but for the 64 x 64 form)")
    return None
  if (table is PER_ROW_B_TILES and tile_key(cfg) in PER_ROW_B_TMA_ONLY_TILES
      and not cfg.tma_scales):
    return f"{PER_ROW_B_TMA_ONLY_TILES} with per-row b scales from GMEM (not measured)"
  if tile_key(cfg) not in table and not (paired or scaled_ring_tile(cfg, m, k, table)):
    return "a tile shape without a measurement for this problem"
  if decode and cfg.split_k == 1 and cfg.tile_m > max(64, m):
    return "a decode tile taller than M"
  if cfg.cluster_m > 1:
    return "pairs sharing B"
  decode_pairs = decode and cfg.tile_m == 128 and (
      one_wave or _cdiv(k, K_BLOCK) >= DECODE_PAIRS_MIN_BLOCKS)
  if cfg.cluster_n > 1 and not decode_pairs and not paired:
    return ("pairs sharing A other than 128-row decode tiles in one wave or over >= "
            f"{DECODE_PAIRS_MIN_BLOCKS} K blocks and large-M {list(PAIRED_LARGE_M_TILES)} "
            f"tiles with the scales in the ring over >= {PAIRED_MIN_K_BLOCKS} K blocks")
  if cfg.split_k > 1 and not (decode and cfg.tile_n == SPLIT_K_TILE_N and one_wave
                              and cfg.tile_m == max(64, _cdiv(m, 64) * 64)
                              and _cdiv(k, K_BLOCK) >= SPLIT_K_MIN_BLOCKS):
    return (f"K splits other than {SPLIT_K_TILE_N}-column tiles of all M rows in one wave "
            f"over >= {SPLIT_K_MIN_BLOCKS} K blocks")
  if cfg.k_step > 1 and not decode:
    return "two-block steps at large M (measured within +-1%)"
  if cfg.k_step > 1 and _one_block_ring(cfg) < _TWO_BLOCK_MIN_RING:
    return "two-block steps of a tile with a one-block ring < 4 stages (measured: starves)"
  if _past_ring_bytes(cfg) and not (_deep_ring(cfg, m) or _short_k(cfg, m, k)
                                    or _per_row_deep_ring(cfg, b_scale_rows == 1)
                                    or (takes_deeper_ring(tile_key(cfg), m, k,
                                                          row_masks=row_masks,
                                                          b_scale_rows=b_scale_rows,
                                                          masked=masked)
                                        and deeper_ring(cfg))):
    return "a ring past RING_BYTES (measured slower)"
  if decode and m > 64 and cfg.tile_m == 64 and cfg.consumers == 3 and not one_wave:
    return "64-row three-consumer tiles for M > 64 over several waves (measured slower)"
  if decode and m % 64 and m > 64 and cfg.tile_m == 64 and cfg.tile_n < 128 and not one_wave:
    # (65-127 rows x 18432-36864 columns, K = 2048-16384: 64 x 128 tiles 1.03-1.38x
    # faster than the 64 x 64 ones the model ranked first; at M = 128 1.06x, where
    # 128 x 64 pairs win; H100 2026-11-27.)
    return ("64-row tiles narrower than 128 columns over several waves where M leaves "
            "the second row tile partial (measured slower)")
  if cfg.wg_split == "k" and not (decode and one_wave and cfg.split_k == 1 and not masked
                                  and not row_masks and _cdiv(k, K_BLOCK) >= K_SPLIT_MIN_BLOCKS):
    return ("a K split among the warpgroups other than dense decode tiles in one wave over "
            f">= {K_SPLIT_MIN_BLOCKS} K blocks")
  return None


def fp8_k_split_us(k: int) -> float:
  """The time of an FP8 output in one wave of the decode FP8 tiles (64 x 128 tiles
  whose warpgroups split K) between decode and large M (FP8_K_SPLIT_FIXED_US)."""
  return FP8_K_SPLIT_FIXED_US + FP8_K_SPLIT_BLOCK_US * _cdiv(k, K_BLOCK)


def two_block_steps_pay(k_blocks: int) -> bool:
  """Whether two-block steps shorten a K loop of this many blocks."""
  return k_blocks * _TWO_BLOCK_SAVING > _TWO_BLOCK_FILL_BLOCKS


def _k_loop_blocks(cfg: HopperConfig, k: int) -> float:
  """A unit's K loop in blocks of one-block-step time."""
  blocks = _cdiv(k, K_BLOCK) // cfg.split_k
  if cfg.k_step == 1:
    return blocks
  return blocks * (1 - _TWO_BLOCK_SAVING) + _TWO_BLOCK_FILL_BLOCKS


def _decode_unit_us(cfg, m, k, chained, table) -> float:
  del m
  fixed = _CHAINED_DECODE_FIXED_COLUMNS if chained else _DECODE_FIXED_COLUMNS
  columns = table[tile_key(cfg)] * (cfg.tile_n + fixed)
  if cfg.cluster_n > 1:
    columns -= _SHARED_A_COLUMNS
  cluster_us = _CLUSTER_US if cfg.cluster_n > 1 else 0.0
  return columns * _k_loop_blocks(cfg, k) * _COLUMN_BLOCK_US + cluster_us


def _large_m_unit_us(cfg, m, k, chained, table, one_wave=False) -> float:
  area = cfg.tile_m * cfg.tile_n / (128 * 256)  # in 128 x 256 tiles
  paired = paired_large_m(cfg, m, k, table)
  mid = mid_m_form(cfg, m, k, table)
  if mid:
    efficiency = MID_M_FORMS[tile_key(cfg)][1]
    if m % cfg.tile_m:
      efficiency /= MID_M_PARTIAL_ROWS_COST
  elif one_wave and tile_key(cfg) == (64, 128, "n", 2) and _mid_m(m, k, table):
    efficiency = MID_M_ONE_WAVE_64X128
  elif scaled_ring_tile(cfg, m, k, table):
    efficiency = SCALED_RING_TILES[tile_key(cfg)]
  elif table is LARGE_M_TILES and in_dense_deeper_ring(cfg, m, k):
    efficiency = DENSE_DEEPER_RING_TILES[tile_key(cfg)]
  else:
    efficiency = (PAIRED_LARGE_M_TILES if paired else table)[tile_key(cfg)]
  block_us = area / efficiency * _TILE_BLOCK_US
  loop = _k_loop_blocks(cfg, k)
  fixed = _LARGE_M_FIXED_BLOCKS
  if _deep_ring(cfg, m) and chained and _cdiv(k, K_BLOCK) >= _DEEP_RING_MIN_BLOCKS:
    loop *= _DEEP_RING_GAIN
  elif _short_k(cfg, m, k) and chained:
    fixed /= 2
  elif _per_row_deep_ring(cfg, table is PER_ROW_B_TILES):
    loop *= _PER_ROW_RING_GAIN
  elif _past_ring_bytes(cfg) and not mid and not (
      (table is MASKED_TILES or table is LARGE_M_TILES) and deeper_ring(cfg)):
    loop *= _L1_LOSS
  return block_us * (loop + fixed)


def estimated_time_us(cfg: HopperConfig, m: int, n: int, k: int, groups: int = 1, *,
                      b_scale_rows: int = SCALE_N, row_masks: bool = False,
                      masked: bool = False, num_sms: int | None = None,
                      expected_m: int | None = None) -> float:
  """The model's time of cfg at this shape (inf where `unmodelled`; the
  arguments as there). Masked groups at large M: the mean over masked_rows
  (expected_m: the rows a group is expected to hold) of the estimate at that
  many rows (a tile wholly past masked_m runs no K pass)."""
  num_sms = cfg.num_sms or num_sms or hopper.num_sms()
  if unmodelled(cfg, m, n, k, groups, b_scale_rows=b_scale_rows, row_masks=row_masks,
                masked=masked, num_sms=num_sms):
    return math.inf
  groups, group_rows = _gemms_and_group_rows(m, groups, row_masks)
  if masked and m > DECODE_MAX_M:
    table = large_m_tiles(k, masked=True)
    times = [_masked_time_us(cfg, [max(DECODE_MAX_M + 1, r) for r in rows], n, k, num_sms,
                             table) for rows in masked_rows(m, groups, expected_m)]
    return round(sum(times) / len(times), 4)
  table = DECODE_TILES if m <= DECODE_MAX_M else large_m_tiles(
      k, b_scale_rows=b_scale_rows, row_masks=row_masks, group_rows=group_rows)
  return _time_us(cfg, m, n, k, groups, num_sms, table)


def _masked_time_us(cfg: HopperConfig, rows: list[int], n: int, k: int, num_sms: int,
                    table: dict) -> float:
  """One fill of masked groups (rows per group): the CTAs share the tiles that
  hold rows evenly (the live-first walk; the plain walk of 192 x 128 tiles as
  near as measured)."""
  live = sum(units(cfg, r, n) for r in rows)
  ctas = min((cfg.num_sms or num_sms) // (cfg.cluster_m * cfg.cluster_n), live)
  chained = live >= 2 * ctas and unit_steps(cfg, k) % cfg.stages == 0
  return _cdiv(live, ctas) * _large_m_unit_us(cfg, max(rows), k, chained, table)


def _time_us(cfg: HopperConfig, m: int, n: int, k: int, groups: int, num_sms: int,
             table: dict) -> float:
  chained = chains_tiles(cfg, m, n, k, groups, num_sms)
  waves = _cdiv(units(cfg, m, n, groups), grid(cfg, m, n, groups, num_sms))
  if m <= DECODE_MAX_M:
    time = waves * _decode_unit_us(cfg, m, k, chained, table)
  else:
    time = waves * _large_m_unit_us(cfg, m, k, chained, table, one_wave=waves == 1)
  if cfg.split_k > 1:
    time += _SPLIT_K_REDUCTION_US
  # Rounded to 0.1 ns: equal estimates compare equal (the first candidate wins).
  return round(time, 4)
