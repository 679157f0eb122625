"""Tiling rules of the Hopper kernel: the heuristic, the candidates autotuning
times, and the autotuned config lookup (pallas/hopper.py holds the kernel).

The measurements behind each rule are in benchmarks/RESULTS.md ("Hopper tiling
rules"); the code keeps the reasons.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax.experimental import pallas as pl

from jax_fp8.pallas import autotune, hopper
from jax_fp8.pallas.common import FP8_OUT, K_BLOCK, SCALE_N, SMEM_BYTES
from jax_fp8.pallas.hopper import CHUNK_M, HopperConfig, kernel_dtypes


def chains_tiles(cfg: HopperConfig, m: int, n: int, k: int, groups: int = 1) -> bool:
  """Whether every CTA runs >= 2 tiles and the ring wraps exactly at a tile's
  end: such tilings measured a smaller fixed cost per tile (the next tile's
  first loads fill a ring its predecessor leaves in step)."""
  units = (pl.cdiv(pl.cdiv(m, cfg.tile_m), cfg.cluster_m)
           * pl.cdiv(pl.cdiv(n, cfg.tile_n), cfg.cluster_n) * cfg.split_k * groups)
  grid = min((cfg.num_sms or hopper.num_sms()) // (cfg.cluster_m * cfg.cluster_n), units)
  return (units >= 2 * grid
          and pl.cdiv(pl.cdiv(k, K_BLOCK) // cfg.split_k, cfg.k_step) % cfg.stages == 0)


def _fit_stages(cfg: HopperConfig, out_dtype, c_dtype, max_stages: int) -> HopperConfig:
  """cfg with the deepest ring up to max_stages (at least 2) that fits in SMEM,
  narrowing the epilogue stores if even 2 stages do not fit."""
  cfg = dataclasses.replace(cfg, stages=max_stages)
  while cfg.smem_bytes(out_dtype, c_dtype) > SMEM_BYTES:
    if cfg.stages > 2:
      cfg = dataclasses.replace(cfg, stages=cfg.stages - 1)
    elif cfg.epi_tile_n > 16:
      cfg = dataclasses.replace(cfg, epi_tile_n=cfg.epi_tile_n // 2)
    else:
      break  # cannot fit: Mosaic's compile error says so
  return cfg


# Large-M tiles (tile_m, tile_n, wg_split, consumers, efficiency per tile relative
# to 128 x 256 at full waves): wider tiles read less A/B per FLOP; 192 x 128
# balances the waves where N is narrow.
_LARGE_M_TILES = ((128, 256, "n", 2, 1.0), (128, 128, "m", 2, 0.93),
                  (192, 128, "m", 3, 0.95), (64, 128, "n", 2, 0.8))
# Ragged groups (row masks: a K-pass loop around the K loop) spill where a
# warpgroup holds two row chunks: tiles of one 64-row chunk row per warpgroup;
# 128 x 256 split by rows is the fastest of them over long K loops, 192 x 128
# of three consumers over short ones (<= _SHORT_K_BLOCKS_WIDE_TILE blocks).
_RAGGED_TILES = ((128, 256, "m", 2, 1.0), (192, 128, "m", 3, 0.97),
                 (128, 128, "m", 2, 0.96), (64, 128, "n", 2, 0.8))
_RAGGED_SHORT_K_TILES = ((192, 128, "m", 3, 1.0), (128, 256, "m", 2, 0.95),
                         (128, 128, "m", 2, 0.94), (64, 128, "n", 2, 0.8))
# Per-row b scales (a column factor per chunk column next to the row factors)
# spill beyond one 64 x 128 accumulator per warpgroup: 128 x 128 tiles, the
# warpgroups side by side (two 64 x 64 chunks each) slightly ahead.
_PER_ROW_B_TILES = ((128, 128, "n", 2, 1.0), (128, 128, "m", 2, 0.96), (64, 128, "n", 2, 0.8))
# Up to this many K blocks a tile's fixed cost (first loads, epilogue) outweighs
# its K loop: _SHORT_K_TILE tiles with a ring as deep as the K loop.
_CHAIN_K_BLOCKS = 4
_SHORT_K_TILE = (192, 128, "m", 3)  # tile_m, tile_n, wg_split, consumers
# Small-M (decode) tiles (tile_m, tile_n, wg_split, consumers, weight): bandwidth-
# bound, a tile costs its width plus a fixed part (its A tile, the epilogue) worth
# ~32 columns, a 128-row tile ~1.6x a 64-row one. 64 x 192 (three warpgroups of 64
# columns) fills the SMs where 256-wide tiles leave many idle; for M > 64 only in
# one wave.
_SMALL_M_TILES = ((64, 32, "n", 2, 1.0), (64, 64, "n", 2, 1.0), (64, 128, "n", 2, 1.0),
                  (64, 192, "n", 3, 1.0), (64, 256, "n", 2, 1.0), (128, 64, "m", 2, 1.6),
                  (128, 256, "n", 2, 1.6))
# Long K loops (>= 64 K blocks) on 128 x 256 tiles: a 4-deep ring where it
# divides the K blocks (at 56 blocks the SMEM is better left to L1).
_LONG_K_BLOCKS = 64
_LONG_K_STAGES = 4
# Decode split-K from this many K blocks (K >= 4096) up, where 64-column tiles
# leave SMs idle; below it the reduction's fixed cost outweighs the gain.
_SPLIT_K_MIN_BLOCKS = 32
_SPLIT_K_TILE_N = 64
# Decode tiles of 128 rows in one wave over at least this many K blocks: pairs
# of CTAs share their A tile by TMA multicast.
_SHARED_A_K_BLOCKS = 64
# SMEM the operand ring may take: what SMEM leaves free is L1, where the scale
# loads hit (~144 KB was fastest for every tile).
_RING_BYTES = 144 * 1024
# Decode tiles over at least this many K blocks (K >= 1536) take two K blocks per
# pipeline step in a ring of the same bytes: a warpgroup's step boundary (barrier
# wait, scale loads, bookkeeping) comes once per two blocks.
_K_STEP_MIN_BLOCKS = 12
# ... where the one-block ring holds at least this many stages: a two-block ring
# of fewer than two stages' bytes starves (128 x 256 decode tiles, 3 one-block
# stages, bumped to 2 two-block ones: 1.14-1.71x slower, masked decode).
_K_STEP_MIN_RING = 4
# Up to this M one-chunk warpgroups carry a_scale and b_scale separately and
# multiply at promotion (scale_product=False): the product's FMUL otherwise waits
# at the end of every step for the scale loads issued during its last WGMMA.
_SEPARATE_SCALES_MAX_M = 128


def _two_block_steps(cfg: HopperConfig, ring_stages: int, extra: int = 0):
  """(cfg with two K blocks per step, its ring depth): the bytes of ring_stages
  one-block stages (+ extra stages)."""
  return dataclasses.replace(cfg, k_step=2), max(2, ring_stages // 2 + extra)


# Registers the producer warpgroup keeps where a consumer carries two chunks
# (128 x 256): 72 leaves the consumers 216, where ptxas's K loop does not spill.
_TWO_CHUNK_PRODUCER_REGISTERS = 72


def _ring_stages(tile_m: int, tile_n: int) -> int:
  return max(2, min(8, _RING_BYTES // ((tile_m + tile_n) * K_BLOCK)))


# Up to this many K blocks the epilogue is a large part of a tile's time and
# stores of 256-byte rows pay; with longer K loops their SMEM is better left to
# L1. 256-column tiles gain up to twice as many.
_SHORT_K_BLOCKS = 8
_SHORT_K_BLOCKS_WIDE_TILE = 16


def _decode_split_k(m: int, n: int, k: int, num_sms: int) -> HopperConfig | None:
  """The split-K tiling for small M and long K, or None where K should not be
  split: 64-column tiles holding all M rows (B is read once), K cut into the
  most ranges (4 or 2) that keep the work within one wave of the SMs."""
  k_blocks = pl.cdiv(k, K_BLOCK)
  if m > 128 or k_blocks < _SPLIT_K_MIN_BLOCKS:
    return None
  tile_m, split = (64, "n") if m <= 64 else (128, "m")
  tiles = pl.cdiv(n, _SPLIT_K_TILE_N)
  for split_k in (4, 2):
    if k_blocks % split_k == 0 and tiles * split_k <= num_sms:
      return HopperConfig(tile_m=tile_m, tile_n=_SPLIT_K_TILE_N, wg_split=split,
                          grid_minor="m", split_k=split_k,
                          scale_product=m > _SEPARATE_SCALES_MAX_M)
  return None


def _large_m_tiles(k_blocks: int, *, b_scale_rows: int, row_masks: bool):
  """The large-M tile table of a problem: ragged groups and per-row b scales
  have their own (register pressure; see the tables)."""
  if row_masks:
    short = k_blocks <= _SHORT_K_BLOCKS_WIDE_TILE
    return _RAGGED_SHORT_K_TILES if short else _RAGGED_TILES
  if b_scale_rows == 1:
    return _PER_ROW_B_TILES
  return _LARGE_M_TILES


def _with_registers(cfg: HopperConfig) -> HopperConfig:
  """cfg with the producer's register count for its chunks per consumer."""
  wm, wn = cfg.wg_tile()
  if cfg.consumers == 2 and (wm // CHUNK_M) * pl.cdiv(wn, SCALE_N) >= 2:
    return dataclasses.replace(cfg, producer_registers=_TWO_CHUNK_PRODUCER_REGISTERS)
  return cfg


def _with_epilogue(cfg: HopperConfig, out_dtype, k: int, c_dtype=None) -> HopperConfig:
  """The widest epilogue store the chunk and the output dtype allow: rows of
  128 bytes, or 256 for short K loops without c (c's ring takes that SMEM)."""
  out_dtype, c_dtype = kernel_dtypes(cfg, out_dtype, c_dtype)
  short = _SHORT_K_BLOCKS_WIDE_TILE if cfg.tile_n == 256 else _SHORT_K_BLOCKS
  short_k = pl.cdiv(k, K_BLOCK) <= short
  row_bytes = 256 if short_k and c_dtype is None else 128
  widest = row_bytes // np.dtype(out_dtype).itemsize
  return dataclasses.replace(cfg, epi_tile_n=min(widest, cfg.chunk()[1]))


def default_config(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16,
                   c_dtype=None, b_scale_rows: int = SCALE_N, groups: int = 1,
                   grouped: bool = False, row_masks: bool = False) -> HopperConfig:
  """Tiling heuristic by shape (from H100 measurements of the DeepSeek-V3 shapes).

  - M <= 128 (decode): bandwidth-bound; with K >= 4096 and N too narrow to
    give every SM a 64-column tile, split-K (_decode_split_k). Else the tiling
    that finishes soonest when the tiles are spread over the SMs in waves
    (waves x cost per tile, less for tiles whose pipelines chain), down to
    64 x 32 tiles so that narrow N still feeds every SM (and 64 x 192 tiles of
    three consumer warpgroups between 128 and 256). A 128-row tile is
    never used for M <= 64; one wave of them over a long K shares A in
    clusters of 2. K >= 1536 (and split-K): two K blocks per pipeline step.
    One-chunk warpgroups multiply their scales at promotion (scale_product).
  - larger M: among 128 x 256, 128 x 128, 192 x 128 and 64 x 128 tiles, the
    one with the best (wave efficiency x padding efficiency x per-tile
    efficiency): the last wave of a persistent grid that is mostly empty costs
    as much as a full one, and rows past M cost as much as real ones. K loops
    of 2..4 blocks take chained 192 x 128 tiles where every CTA runs >= 2
    and M fills the 192-row tiles.
  - the ring takes ~_RING_BYTES of SMEM; short K loops get wider epilogue stores.
  """
  num_sms = hopper.num_sms()
  decode_split = None if grouped else _decode_split_k(m, n, k, num_sms)
  k_blocks = pl.cdiv(k, K_BLOCK)
  if decode_split is not None:
    cfg = _with_epilogue(decode_split, out_dtype, k, c_dtype)
    max_stages = _ring_stages(cfg.tile_m, cfg.tile_n)
    if (k_blocks // cfg.split_k) % 2 == 0:
      cfg, max_stages = _two_block_steps(cfg, max_stages)
    return _fit_stages(cfg, out_dtype, c_dtype, max_stages=max_stages)
  if m <= 128:
    def cost(t):
      tm, tn, split, consumers, weight = t
      tiles = pl.cdiv(m, tm) * pl.cdiv(n, tn) * groups
      # A chained tile's fixed part is about half: the next tile's loads run
      # under its epilogue.
      ring = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, consumers=consumers,
                          stages=_ring_stages(tm, tn))
      fixed = 16 if chains_tiles(ring, m, n, k, groups) else 32
      return (pl.cdiv(tiles, num_sms) * weight * (tn + fixed), -tm * tn)
    def allowed(t):
      tm, tn, _, consumers, _ = t
      if tm > max(64, m):
        return False
      # Three-consumer 64-row tiles for M > 64 only in one wave (see _SMALL_M_TILES).
      return not (consumers == 3 and m > 64 and pl.cdiv(m, tm) * pl.cdiv(n, tn) > num_sms)

    tm, tn, split, consumers, _ = min(filter(allowed, _SMALL_M_TILES), key=cost)
    max_stages = _ring_stages(tm, tn)
    # One wave of 128-row tiles over a long K: every CTA reads all of A, so
    # pairs of CTAs share it by multicast.
    shared_a = (not grouped and tm == 128 and k_blocks >= _SHARED_A_K_BLOCKS
                and pl.cdiv(n, tn) <= num_sms)
    cfg = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, grid_minor="m",
                       consumers=consumers, cluster_n=2 if shared_a else 1,
                       scale_product=m > _SEPARATE_SCALES_MAX_M)
    if k_blocks >= _K_STEP_MIN_BLOCKS and max_stages >= _K_STEP_MIN_RING:
      # One stage more where a single wave of CTAs pairs up over a long K.
      cfg, max_stages = _two_block_steps(cfg, max_stages, extra=1 if shared_a else 0)
  else:
    def score(t):
      tm, tn, _, _, eff = t
      tiles = pl.cdiv(m, tm) * pl.cdiv(n, tn) * groups
      padding = m / (pl.cdiv(m, tm) * tm) * n / (pl.cdiv(n, tn) * tn)
      return eff * padding * tiles / (pl.cdiv(tiles, num_sms) * num_sms)
    order = "n" if m >= 1024 else "m"
    tm, tn, split, consumers = _SHORT_K_TILE
    if 2 <= k_blocks <= _CHAIN_K_BLOCKS and m / (pl.cdiv(m, tm) * tm) >= 0.95:
      chained = _with_epilogue(HopperConfig(tile_m=tm, tile_n=tn, wg_split=split,
                                            consumers=consumers, grid_minor=order),
                               out_dtype, k, c_dtype)
      chained = _fit_stages(chained, out_dtype, c_dtype, max_stages=k_blocks)
      if chains_tiles(chained, m, n, k, groups):
        return chained
    tiles = _large_m_tiles(k_blocks, b_scale_rows=b_scale_rows, row_masks=row_masks)
    tm, tn, split, consumers, _ = max(tiles, key=score)
    max_stages = _ring_stages(tm, tn)
    cfg = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, grid_minor=order,
                       consumers=consumers)
  cfg = _with_epilogue(cfg, out_dtype, k, c_dtype)
  cfg = _with_registers(cfg)
  if m > 128 and (tm, tn) == (128, 256) and k_blocks >= _LONG_K_BLOCKS:
    deep = _fit_stages(cfg, out_dtype, c_dtype, max_stages=_LONG_K_STAGES)
    if deep.stages == _LONG_K_STAGES and chains_tiles(deep, m, n, k, groups):
      return deep
  return _fit_stages(cfg, out_dtype, c_dtype, max_stages=max_stages)


def candidate_configs(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16,
                      c_dtype=None) -> list[HopperConfig]:
  """The configs autotuning times for a shape: the heuristic's first, then the
  tile shapes, warpgroup splits, ring depths, tile orders, clusters and (small
  M, long K) K splits and two-block steps worth trying there. Clusters pair
  vertically adjacent tiles only where M has two row tiles to pair."""
  k_blocks = pl.cdiv(k, K_BLOCK)
  splits = (1,)
  if m <= 128:
    # The heuristic's decode tiles (128-row ones where M > 64), and 128 x 128
    # (never its pick, worth timing).
    tiles = [t[:4] for t in _SMALL_M_TILES if t[0] == 64 or m > 64]
    if m > 64:
      tiles = sorted(tiles + [(128, 128, "m", 2)])
    # Where 64 < M, the two 64-row tiles of a column may share B by multicast:
    # an alternative to splitting K that needs no reduction (not measured yet).
    orders = ("m",)
    if k_blocks >= _SPLIT_K_MIN_BLOCKS:
      splits += tuple(s for s in (2, 4) if k_blocks % s == 0)
  else:
    tiles = [(128, 256, "n", 2), (128, 128, "m", 2), (128, 128, "n", 2), (64, 128, "n", 2),
             (64, 256, "n", 2), (256, 128, "m", 2), (192, 128, "m", 3)]
    orders = ("n" if m >= 1024 else "m",)
  out = [default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)]
  for tm, tn, split, consumers in tiles:
    for order, cl, split_k in itertools.product(orders, (1, 2), splits):
      if cl > 1 and pl.cdiv(m, tm) < 2:
        continue  # the second CTA of the pair would only run past M
      cfg = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, grid_minor=order, cluster_m=cl,
                         consumers=consumers, split_k=split_k,
                         scale_product=m > _SEPARATE_SCALES_MAX_M)
      try:
        cfg = _with_registers(_with_epilogue(cfg, out_dtype, k, c_dtype))
        cfg.check()
      except ValueError:
        continue
      ring = _ring_stages(tm, tn)
      # One deeper: chains where it divides the K blocks (a split's K range is
      # long, its tiles few: not worth a second ring there).
      for stages in (ring, ring + 1) if split_k == 1 else (ring,):
        staged = _fit_stages(cfg, out_dtype, c_dtype, max_stages=stages)
        if staged not in out:
          out.append(staged)
      # Two K blocks per step in a ring of the same bytes (small M, K >= 1536).
      if m <= 128 and k_blocks >= _K_STEP_MIN_BLOCKS and (k_blocks // split_k) % 2 == 0:
        stepped, stages = _two_block_steps(cfg, ring)
        stepped = _fit_stages(stepped, out_dtype, c_dtype, max_stages=stages)
        if stepped not in out:
          out.append(stepped)
  return out


def _tune_key(m, n, k, out_dtype, c_dtype) -> str:
  return autotune.make_key("pallas_sm90", m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)


def tune(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16, c_dtype=None, iters: int = 10,
         candidates: list[HopperConfig] | None = None, seed: int = 0) -> HopperConfig:
  """Times the candidate configs at this shape on this device (fresh random
  operands); caches the fastest (pallas/autotune.py) and returns it.
  blockwise_fp8_dot then uses it for this shape without being told."""
  out_dtype = np.dtype(out_dtype)
  args = autotune.random_operands(seed, m, n, k, c_dtype=c_dtype)
  beta = 1.0
  # Each candidate's output is checked before it is timed. f32 outputs: FP8
  # WGMMA accumulates with ~14 bits inside a K block (1e-4 of the norm on the
  # H100, like cuBLAS).
  check = autotune.output_check(
      args, beta=beta, tol=2.5e-4 if out_dtype == np.dtype(jnp.float32) else 4e-3)

  def time_config(cfg):
    fn = functools.partial(hopper.blockwise_fp8_dot, beta=beta, out_dtype=out_dtype, config=cfg)
    return autotune.kernel_time_ms(fn, args, iters=iters, check=check)

  if candidates is None:
    candidates = candidate_configs(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  return autotune.tune(_tune_key(m, n, k, out_dtype, c_dtype), candidates, time_config)


def fp8_output_config(m: int, n: int, k: int, *, c_dtype=None,
                      b_scale_rows: int = SCALE_N) -> HopperConfig:
  """The bf16 default made fit for an FP8 output quantised in the epilogue:
  warpgroup chunks of whole 128-column groups, each stored as one piece, and
  no K split (its partials would leave the epilogue)."""
  cfg = default_config(m, n, k, c_dtype=c_dtype, b_scale_rows=b_scale_rows)
  if cfg.split_k > 1 or cfg.chunk()[1] != SCALE_N:
    # The decode tile of 128-column warpgroups: 64 x 256 (two side by side),
    # or 128 x 128 (one above the other) where M fills 128 rows.
    shape = (64, 256, "n") if m <= 64 else (128, 128, "m")
    cfg = HopperConfig(tile_m=shape[0], tile_n=shape[1], wg_split=shape[2],
                       grid_minor=cfg.grid_minor, scale_product=cfg.scale_product)
    if pl.cdiv(k, K_BLOCK) >= _K_STEP_MIN_BLOCKS and m <= 128:
      cfg = dataclasses.replace(cfg, k_step=2)
  cfg = _with_registers(dataclasses.replace(cfg, epi_tile_n=SCALE_N))
  return _fit_stages(cfg, FP8_OUT, c_dtype,
                     max_stages=max(2, _ring_stages(cfg.tile_m, cfg.tile_n) // cfg.k_step))


def glu_config(m: int, f: int, k: int, *, out_dtype) -> HopperConfig:
  """A fused GLU's tiling: 128 x 256 tiles of 128 gate and 128 up columns, the
  two warpgroups one above the other (each holds a gate chunk and its up chunk:
  a third warpgroup would leave none of them registers for two)."""
  del f, k
  cfg = HopperConfig(tile_m=128, tile_n=256, wg_split="m",
                     grid_minor="n" if m >= 1024 else "m", scale_product=m > _SEPARATE_SCALES_MAX_M,
                     epi_tile_n=SCALE_N if np.dtype(out_dtype) == FP8_OUT else 64)
  cfg = _with_registers(cfg)
  return _fit_stages(cfg, out_dtype, None, max_stages=_ring_stages(cfg.tile_m, cfg.tile_n))


def config_for(m, n, k, *, out_dtype, c_dtype=None, b_scale_rows: int = SCALE_N
               ) -> HopperConfig:
  """The autotuned config if this shape was tuned on this device (tuning it now
  under JAX_FP8_AUTOTUNE=1), else the heuristic's."""
  if np.dtype(out_dtype) == FP8_OUT:
    return fp8_output_config(m, n, k, c_dtype=c_dtype, b_scale_rows=b_scale_rows)
  if b_scale_rows != SCALE_N:  # autotuning covers the 128x128 recipe
    return default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype,
                          b_scale_rows=b_scale_rows)
  cached = autotune.lookup(_tune_key(m, n, k, out_dtype, c_dtype), config_type=HopperConfig)
  if cached is not None:
    return cached
  if autotune.enabled():
    # We may be inside a jit trace: run the tuning calls eagerly, outside it.
    with jax_core.eval_context():
      return tune(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  return default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)


