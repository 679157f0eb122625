"""Tiling of the Hopper kernel: the candidate configs of a shape, the default
(the candidate the cost model, pallas/hopper_cost.py, estimates fastest),
autotuning over the same candidates, and the autotuned config lookup
(pallas/hopper.py holds the kernel).

The candidates of a shape, in the cost model's order (the default first):
- decode (M <= 128): hopper_cost.DECODE_TILES (128-row ones only where M > 64),
  each with one- and two-block pipeline steps; K cut into 2 or 4 ranges; pairs
  of 128-row CTAs sharing their A tile (with two-block steps, one stage more);
  dense GEMMs also tiles whose warpgroups split K (K_SPLIT_DECODE_TILES).
- larger M: the problem's tile table (hopper_cost.large_m_tiles: dense, ragged
  groups (of many rows on average over long K: their own), masked groups or
  per-row b scales), with pairs sharing B; 128 x 256 also with a
  4-deep ring; 192 x 128 also with a ring holding a short K loop (2..4 blocks); dense
  GEMMs also 256 x 128 tiles in pairs sharing A (hopper_cost.PAIRED_LARGE_M_TILES),
  up to M = 1024 narrow tiles that fill one wave (hopper_cost.MID_M_FORMS), and from
  M = 512 to 2048 256 x 128 tiles with the scales in the ring
  (hopper_cost.SCALED_RING_TILES).
- what autotuning also tries (the model has no measurement for it, so it is
  never the default): the _EXPLORED tiles, pairs sharing B, rings one deeper.
- up to M = 1024 (an FP8 output) or at decode (a GLU) over long K, where the fused
  epilogues' tiles would leave SMs idle, sm90.py runs an FP8 output
  (fp8_output_quantized_after) or a GLU (glu_unfused)
  as the float32 output of the dense rules' tiling, finished after the GEMM.
Every candidate is completed the same way: the scales brought by the ring's TMA
from M = 2048 outside masked groups (hopper_cost.tma_scales_pay; where a form does
not say: dense tiles of one wide chunk a warpgroup from M = 1024,
hopper_cost.wide_tile_ring_scales), with them the
step top overlapped (hopper_cost.step_top_overlap_pays), the widest
epilogue store, the producer's registers, the ring fitted into SMEM. Grouped
schedulers take no K splits and no clusters in the rules (`_grouped_allows`). A masked GEMM's M is its groups'
capacity: the rows that exist are known on the device only, so its estimate
is the mean over fills of the capacity (hopper_cost.masked_rows), or, told the
rows a group is expected to hold (expected_m), over fills around them, among
the tilings of their capacity (hopper_cost.masked_capacity, sparse_fill).

The measurements behind the model are in benchmarks/RESULTS.md ("Hopper tiling
rules"); the code keeps the reasons.
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
from jax._src import core as jax_core
from jax.experimental import pallas as pl

from jax_fp8.pallas import autotune, hopper, hopper_cost
from jax_fp8.pallas.common import FP8_OUT, K_BLOCK, SCALE_N, SMEM_BYTES
from jax_fp8.pallas.hopper_config import HopperConfig, kernel_dtypes
from jax_fp8.pallas.hopper_cost import chains_tiles, ring_stages  # noqa: F401 (API)

# Tiles autotuning also tries that the model has no measurement for.
_EXPLORED_DECODE_TILES = ((128, 128, "m", 2),)
_EXPLORED_LARGE_M_TILES = ((128, 128, "n", 2), (64, 256, "n", 2), (256, 128, "m", 2))
# Registers the producer warpgroup keeps where a consumer carries two chunks
# (128 x 256): 72 leaves the consumers 216, where ptxas's K loop does not spill
# and issues both chunks' first WGMMAs with the no-accumulate flag (with 232 it
# zeroes one chunk by moves instead, 13-15% slower: tools/spill_check.py).
_TWO_CHUNK_PRODUCER_REGISTERS = 72
# K steps per staged a-scale window of the wide 128 x 192 tiles (HopperConfig.
# a_scale_window) where the ring's TMA does not bring the scales: their
# warpgroups read a-scales from SMEM, 2-3% faster than from GMEM; 128 x 256
# tiles (two chunk rows per warpgroup) were 8-10% slower so, and so were 128 x 160
# tiles (1-5%, dense and masked): a window stages a row or two per producer thread.
_WIDE_TILE_A_SCALE_WINDOW = 4
_A_SCALE_WINDOW_TILES = ((128, 192, "m", 2),)
# Up to this many K blocks the epilogue is a large part of a tile's time and
# stores of 256-byte rows pay; with longer K loops their SMEM is better left to
# L1. 256-column tiles gain up to twice as many.
_SHORT_K_BLOCKS = 8
_SHORT_K_BLOCKS_WIDE_TILE = 16
# An FP8 output (quantised in the epilogue) takes the long-K pairs sharing A
# (hopper_cost.PAIRED_LARGE_M_TILES) from this N: at 4096 x 7168 x 16384 / 18432
# +6-8% over 128 x 256 tiles, at N = 4096 (4096 and 8192 rows, K = 7168) 2-3% behind.
_FP8_PAIRS_MIN_N = 7168


def _fp8_k_split_units(m: int, n: int) -> int:
  """Tiles of an FP8 output's decode tiling of 64 x 128 tiles whose two warpgroups
  split K (one-block steps, 6 stages; the two-block form does not fit beside the
  summing buffer), taken where they fit one wave: 1.24-1.63x the 64 x 256 /
  128 x 128 tiles at 17-112 tiles (64 / 128 rows x 2112-7168 columns, K
  2048-16384), 0.95x at 192 (H100, 2026-11-27)."""
  return pl.cdiv(m, 64) * pl.cdiv(n, 128)


def _fp8_mid_k_split(m: int, n: int, k: int, b_scale_rows: int,
                     num_sms: int | None = None) -> bool:
  """Whether an FP8 output between decode and large M takes the decode FP8 tiles
  (_fp8_k_split_units) quantised in the epilogue: where they fit one wave and the
  model puts them ahead of the float32 output of the bf16 rules' tiling quantised
  after (hopper_cost.FP8_K_SPLIT_FIXED_US)."""
  sms = num_sms or hopper.num_sms()
  if not (hopper_cost.DECODE_MAX_M < m <= hopper_cost.MID_M_MAX and b_scale_rows == SCALE_N
          and pl.cdiv(k, K_BLOCK) >= hopper_cost.K_SPLIT_MIN_BLOCKS
          and _fp8_k_split_units(m, n) <= sms):
    return False
  after = default_config(m, n, k, out_dtype=jnp.float32)
  return hopper_cost.fp8_k_split_us(k) < (
      hopper_cost.estimated_time_us(after, m, n, k, num_sms=sms)
      + hopper_cost.FP8_QUANTIZE_AFTER_US)


def _grouped_allows(cfg: HopperConfig) -> bool:
  """Grouped schedulers take no K splits and no clusters (masked ones can run
  pairs of CTAs, ragged ones pairs sharing A, neither faster on our tiles:
  explicit configs only; RESULTS.md)."""
  return cfg.split_k == 1 and cfg.cluster_m == cfg.cluster_n == 1


def _fit_stages(cfg: HopperConfig, out_dtype, c_dtype, max_stages: int,
                exact_rows: bool = False) -> HopperConfig:
  """cfg with the deepest ring up to max_stages (at least 2) that fits in SMEM,
  narrowing the epilogue stores if even 2 stages do not fit (warpgroups splitting
  K: a multiple of their count, at least two slots each, so that each has its
  next step's loads in flight)."""
  cfg = dataclasses.replace(cfg, stages=max_stages)
  step = cfg.k_stride
  while cfg.smem_bytes(out_dtype, c_dtype, exact_rows) > SMEM_BYTES:
    if cfg.stages - step >= 2 * step:
      cfg = dataclasses.replace(cfg, stages=cfg.stages - step)
    elif cfg.epi_tile_n > 16:
      cfg = dataclasses.replace(cfg, epi_tile_n=cfg.epi_tile_n // 2)
    else:
      break  # cannot fit: not a candidate
  return cfg


def _with_registers(cfg: HopperConfig) -> HopperConfig:
  """cfg with the producer's register count for its chunks per consumer."""
  if cfg.consumers == 2 and cfg.chunks_per_warpgroup() >= 2:
    return dataclasses.replace(cfg, producer_registers=_TWO_CHUNK_PRODUCER_REGISTERS)
  return cfg


def _with_epilogue(cfg: HopperConfig, out_dtype, k: int, c_dtype=None,
                   exact_rows: bool = False) -> HopperConfig:
  """The widest epilogue store the chunk and the output dtype allow: rows of
  128 bytes, or 256 for short K loops without c (c's ring takes that SMEM) nor
  row-exact stores (their buffer would cost a 128 x 256 tile a ring stage)."""
  out_dtype, c_dtype = kernel_dtypes(cfg, out_dtype, c_dtype)
  short = _SHORT_K_BLOCKS_WIDE_TILE if cfg.tile_n == 256 else _SHORT_K_BLOCKS
  short_k = pl.cdiv(k, K_BLOCK) <= short
  row_bytes = 256 if short_k and c_dtype is None and not exact_rows else 128
  widest = row_bytes // np.dtype(out_dtype).itemsize
  return dataclasses.replace(cfg, epi_tile_n=min(widest, cfg.piece_n()))


# The tile order: along N first (bands of row tiles, for L2 reuse of B) from these
# rows. A dense GEMM of fewer rows has both operands in the L2 and walks rows first,
# but in 128 x 128 tiles and pairs sharing A (H200, 1024-3000 rows: rows first
# 0.996-1.063x the walk along N at 20 shapes, 2048x2112x7168 1.05-1.06x; 128 x 128
# tiles 0.965-1.013x, pairs 0.987-1.006x; benchmarks/RESULTS.md).
_ALONG_N_MIN_M = 1024
_DENSE_ALONG_N_MIN_M = 4096
_DENSE_ALONG_N_TILES = ((128, 128),)


def _order_and_scales(m: int, tile=None) -> dict:
  """The tile order (along N first where M spans many row tiles, for L2 reuse of
  B) and whether one-chunk warpgroups carry the scale product: decode carries
  a_scale and b_scale apart and multiplies at promotion, off the step's tail.
  tile: (tile_m, tile_n) of a dense GEMM's unpaired tiles (not grouped, not a
  fused GLU), which walk rows first below _DENSE_ALONG_N_MIN_M rows."""
  rows_first = tile is not None and tuple(tile[:2]) not in _DENSE_ALONG_N_TILES
  along_n = m >= (_DENSE_ALONG_N_MIN_M if rows_first else _ALONG_N_MIN_M)
  return dict(grid_minor="n" if along_n else "m", scale_product=m > hopper_cost.DECODE_MAX_M)


def _forms(m: int, k: int, *, b_scale_rows: int, row_masks: bool, masked: bool):
  """(tile, fields, deeper) of every candidate form of a problem before it is
  completed: HopperConfig fields, and the ring's stages past ring_stages (where
  the fields do not give them)."""
  k_blocks = pl.cdiv(k, K_BLOCK)
  if m <= hopper_cost.DECODE_MAX_M:
    tiles = [t for t in (*hopper_cost.DECODE_TILES, *_EXPLORED_DECODE_TILES)
             if t[0] == 64 or m > 64]
    # Fewer, larger tiles first: of equal estimates the first is the default.
    tiles.sort(key=lambda t: -t[0] * t[1])
    base = _order_and_scales(m)
    for t in tiles:
      if t[2] == "k":  # warpgroups splitting K: dense GEMMs, no other split, no pairs
        if not (row_masks or masked):
          yield t, base, 0
          if k_blocks >= 2:
            yield t, dict(base, k_step=2), 0
        continue
      # Pairs of 64-row tiles sharing B where M has two row tiles to pair.
      for cluster_m in (1, 2) if t[0] == 64 and m > 64 else (1,):
        yield t, dict(base, cluster_m=cluster_m), 0
        yield t, dict(base, cluster_m=cluster_m), 1
        if k_blocks >= 2:
          yield t, dict(base, cluster_m=cluster_m, k_step=2), 0
      if t[0] == 128:  # pairs sharing A (with two-block steps, one stage more)
        yield t, dict(base, cluster_n=2), 0
        yield t, dict(base, k_step=2, cluster_n=2), 1
      for split_k in (2, 4):
        if k_blocks % split_k == 0:
          yield t, dict(base, split_k=split_k), 0
          if (k_blocks // split_k) % 2 == 0:
            yield t, dict(base, split_k=split_k, k_step=2), 0
  else:
    dense = not (row_masks or masked)

    def base(t):  # a dense GEMM's order depends on its tile; the grouped walks' does not
      return _order_and_scales(m, t if dense else None)
    tiles = hopper_cost.large_m_tiles(k, b_scale_rows=b_scale_rows, row_masks=row_masks,
                                      masked=masked)
    if tiles is hopper_cost.LARGE_M_TILES:  # autotuning covers the dense recipe
      if m <= hopper_cost.MID_M_MAX:
        for t, (fields, _) in hopper_cost.MID_M_FORMS.items():  # narrow tiles, one wave
          yield t, dict(base(t), **fields), 0
      tiles = (*tiles, *_EXPLORED_LARGE_M_TILES)
      for t in hopper_cost.PAIRED_LARGE_M_TILES:  # pairs sharing A
        yield t, dict(_order_and_scales(m), cluster_n=2), 0
      if hopper_cost.SCALED_RING_MIN_M <= m < hopper_cost.TMA_SCALES_MIN_M:
        for t in hopper_cost.SCALED_RING_TILES:  # the scales in the ring below its M
          yield t, dict(base(t), tma_scales=True), 0
    for t in tiles:
      fields = dict(base(t))
      if dense and hopper_cost.wide_tile_ring_scales(t, m, k, b_scale_rows=b_scale_rows):
        fields["tma_scales"] = True
      if hopper_cost.takes_deeper_ring(t, m, k, row_masks=row_masks,
                                       b_scale_rows=b_scale_rows, masked=masked):
        if hopper_cost.deeper_ring_scales_in_ring(t, k, masked=masked):
          fields["tma_scales"] = True
        for cluster_m in (1, 2) if pl.cdiv(m, t[0]) >= 2 and not masked else (1,):
          yield t, dict(fields, cluster_m=cluster_m), 1
        continue
      for cluster_m in (1, 2) if pl.cdiv(m, t[0]) >= 2 else (1,):
        yield t, dict(fields, cluster_m=cluster_m), 0
        yield t, dict(fields, cluster_m=cluster_m), 1      # 128 x 256: the deep ring
      if t in hopper_cost.SHORT_K_CHAINED_TILES and 2 <= k_blocks <= hopper_cost.SHORT_K_MAX_BLOCKS:
        yield t, dict(base(t), stages=k_blocks), 0          # the whole K loop


def candidate_configs(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16, c_dtype=None,
                      b_scale_rows: int = SCALE_N, groups: int = 1, grouped: bool = False,
                      row_masks: bool = False,
                      expected_m: int | None = None) -> list[HopperConfig]:
  """The configs a shape may take (what autotuning times), completed, in the
  order of the cost model's estimates: the first is the default. groups: GEMMs
  of this shape side by side (masked); grouped: a grouped scheduler (masked or
  ragged); row_masks: ragged groups; b_scale_rows=1: per-row b scales;
  expected_m: the rows a masked group is expected to hold (a hint: the tiles
  are those of the fills around it, hopper_cost.masked_capacity)."""
  if not _is_masked(grouped, row_masks):
    expected_m = None
  return list(_ranked(m, n, k, np.dtype(out_dtype), None if c_dtype is None else np.dtype(c_dtype),
                      b_scale_rows, groups, grouped, row_masks, hopper.num_sms(), expected_m))


def default_config(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16,
                   c_dtype=None, b_scale_rows: int = SCALE_N, groups: int = 1,
                   grouped: bool = False, row_masks: bool = False,
                   expected_m: int | None = None) -> HopperConfig:
  """The candidate the cost model (pallas/hopper_cost.py) estimates fastest."""
  return candidate_configs(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype,
                           b_scale_rows=b_scale_rows, groups=groups, grouped=grouped,
                           row_masks=row_masks, expected_m=expected_m)[0]


@functools.lru_cache(maxsize=4096)
def _ranked(m, n, k, out_dtype, c_dtype, b_scale_rows, groups, grouped, row_masks,
            num_sms, expected_m=None) -> tuple[HopperConfig, ...]:
  """candidate_configs for one device (its SM count), computed once; a masked
  GEMM expected to hold expected_m rows per group ranks the tilings of its
  expected fills' capacity, walked live-first where they fill little of it."""
  out, seen = [], set()
  masked = _is_masked(grouped, row_masks)
  sparse = hopper_cost.sparse_fill(m, expected_m, groups)
  m = hopper_cost.masked_capacity(m, expected_m, groups)
  for key, fields, deeper in _forms(m, k, b_scale_rows=b_scale_rows, row_masks=row_masks,
                                    masked=masked):
    tm, tn, split, consumers = key
    large_m_wide = key in hopper_cost.WIDE_TILES
    fields = dict(fields)
    wide = fields.pop("wide_chunks", large_m_wide)
    tma = fields.pop("tma_scales",
                     hopper_cost.tma_scales_pay(m, masked, fields.get("k_step", 1)))
    live_first = hopper_cost.masked_walk(key, groups, sparse) if masked else False
    if live_first is None:
      continue
    cfg = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, consumers=consumers,
                       wide_chunks=wide, tma_scales=tma,
                       step_top_overlap=hopper_cost.step_top_overlap_pays(
                           (tm, tn), tma, grouped=grouped, b_scale_rows=b_scale_rows,
                           plain_output=out_dtype == np.dtype(jnp.bfloat16) and c_dtype is None),
                       a_scale_window=(_WIDE_TILE_A_SCALE_WINDOW
                                       if key in _A_SCALE_WINDOW_TILES and not tma
                                       and not masked else 0),
                       live_first=live_first, **fields)
    if grouped and not _grouped_allows(cfg):
      continue
    cfg = _with_registers(_with_epilogue(cfg, out_dtype, k, c_dtype, exact_rows=row_masks))
    stages = fields.get("stages", ring_stages(cfg) + deeper)
    # Ragged groups (row_masks) store cut tiles row-exactly: one more buffer.
    cfg = _fit_stages(cfg, out_dtype, c_dtype, max_stages=stages, exact_rows=row_masks)
    cfg = dataclasses.replace(
        cfg, desc_carry=hopper_cost.desc_carry_pays(cfg, m, k, grouped=grouped, masked=masked,
                                                    b_scale_rows=b_scale_rows),
        carried_slot=hopper_cost.carried_slot_pays(cfg, grouped=grouped, masked=masked))
    cfg = dataclasses.replace(
        cfg, producer_warp=hopper_cost.producer_warp_pays(
            cfg, m, n, k, dense=not grouped and b_scale_rows == SCALE_N,
            f32_out=out_dtype == np.dtype(jnp.float32)),
        probe_in_flight=hopper_cost.probe_in_flight_pays(cfg, grouped=grouped))
    try:
      cfg.check()
    except ValueError:
      continue
    if cfg.smem_bytes(out_dtype, c_dtype, row_masks) <= SMEM_BYTES and cfg not in seen:
      seen.add(cfg)
      out.append(cfg)
  ranked = sorted(out, key=_estimate(m, n, k, groups, b_scale_rows, row_masks, masked,
                                     num_sms, expected_m))
  return tuple(ranked)


def _is_masked(grouped: bool, row_masks: bool) -> bool:
  """A grouped scheduler without row masks: masked groups (M is their capacity)."""
  return grouped and not row_masks


def _estimate(m, n, k, groups, b_scale_rows, row_masks, masked, num_sms, expected_m=None):
  return lambda cfg: hopper_cost.estimated_time_us(
      cfg, m, n, k, groups, b_scale_rows=b_scale_rows, row_masks=row_masks, masked=masked,
      num_sms=num_sms, expected_m=expected_m)


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
  narrow_pairs = cfg.cluster_n > 1 and n < _FP8_PAIRS_MIN_N
  if cfg.wide_chunks or narrow_pairs:
    # The next candidate with 128-column parts (wide chunks' are 64), not in pairs.
    # (Tiles whose estimate is their dense deeper ring's count as in a plain one: the
    # FP8 stores take that stage's SMEM.)
    cands = candidate_configs(m, n, k, c_dtype=c_dtype, b_scale_rows=b_scale_rows)
    cands = sorted(cands, key=lambda c: _fp8_estimate(c, m, n, k, b_scale_rows))
    cfg = next((c for c in cands if not c.wide_chunks and c.piece_n() == SCALE_N
                and not (narrow_pairs and c.cluster_n > 1)), cfg)
  mid_k_split = _fp8_mid_k_split(m, n, k, b_scale_rows)
  if cfg.split_k > 1 or cfg.piece_n() != SCALE_N or mid_k_split:
    if mid_k_split or (m <= hopper_cost.DECODE_MAX_M
                       and _fp8_k_split_units(m, n) <= hopper.num_sms()):
      # 64 x 128 tiles whose two warpgroups split K, where they fit one wave: twice
      # the CTAs of the tiles below (an FP8 output takes no K split across CTAs),
      # in the decode K loop (the scales multiplied at promotion).
      cfg = HopperConfig(tile_m=64, tile_n=128, wg_split="k", grid_minor=cfg.grid_minor,
                         scale_product=False)
    else:
      # The decode tile of 128-column warpgroups: 64 x 256 (two side by side),
      # or 128 x 128 (one above the other) where M fills 128 rows.
      shape = (64, 256, "n") if m <= 64 else (128, 128, "m")
      cfg = HopperConfig(tile_m=shape[0], tile_n=shape[1], wg_split=shape[2],
                         grid_minor=cfg.grid_minor, scale_product=cfg.scale_product)
      if m <= hopper_cost.DECODE_MAX_M and hopper_cost.two_block_steps_pay(pl.cdiv(k, K_BLOCK)):
        cfg = dataclasses.replace(cfg, k_step=2)
  overlap = hopper_cost.step_top_overlap_pays((cfg.tile_m, cfg.tile_n), cfg.tma_scales,
                                              b_scale_rows=b_scale_rows, plain_output=False)
  # (The barrier test in flight, HopperConfig.probe_in_flight, gains nothing with an FP8
  # output: 1.003 / 0.994 at 4096x18432x7168 / 1024x7168x7168, H200 2026-11-29.)
  cfg = _with_registers(dataclasses.replace(cfg, epi_tile_n=SCALE_N, step_top_overlap=overlap,
                                            probe_in_flight=False))
  # A mid-M form keeps the bf16 default's ring (its two-block steps were measured at
  # that depth, one stage past RING_BYTES) where SMEM holds it beside the FP8 stores.
  mid = hopper_cost.mid_m_form(cfg, m, k, hopper_cost.large_m_tiles(k, b_scale_rows=b_scale_rows))
  cfg = _fit_stages(cfg, FP8_OUT, c_dtype, max_stages=cfg.stages if mid else ring_stages(cfg))
  return dataclasses.replace(cfg, desc_carry=hopper_cost.desc_carry_pays(
      cfg, m, k, grouped=False, masked=False, b_scale_rows=b_scale_rows))


def _fp8_estimate(cfg: HopperConfig, m: int, n: int, k: int, b_scale_rows: int) -> float:
  """The model's time of a bf16 candidate as fp8_output_config keeps it: a dense
  deeper ring (hopper_cost.DENSE_DEEPER_RING_TILES) cut to RING_BYTES, whose SMEM
  stage the FP8 stores take."""
  if hopper_cost.in_dense_deeper_ring(cfg, m, k, b_scale_rows=b_scale_rows):
    cfg = dataclasses.replace(cfg, stages=ring_stages(cfg))
  return hopper_cost.estimated_time_us(cfg, m, n, k, b_scale_rows=b_scale_rows)


def fp8_output_quantized_after(m: int, n: int, k: int, *, b_scale_rows: int = SCALE_N,
                               num_sms: int | None = None) -> bool:
  """Whether an FP8 output is better computed as the float32 output of the bf16
  rules' tiling, then quantised 1x128 by the quantiser kernel (sm90.py), than in
  the epilogue of fp8_output_config: up to hopper_cost.MID_M_MAX rows over long K
  loops, where the epilogue's tiles (whole 128-column groups, no K split across
  CTAs) would fill their waves' CTAs to at most
  hopper_cost.FP8_QUANTIZE_AFTER_MAX_FILL (not where, above decode, the decode FP8
  tiles run ahead: _fp8_mid_k_split). Either way the float32 sum is quantised by the
  same arithmetic (pallas/quant_math.py)."""
  if (m > hopper_cost.MID_M_MAX or b_scale_rows != SCALE_N
      or pl.cdiv(k, K_BLOCK) < hopper_cost.K_SPLIT_MIN_BLOCKS
      or _fp8_mid_k_split(m, n, k, b_scale_rows, num_sms)):
    return False
  sms = num_sms or hopper.num_sms()
  units = hopper_cost.units(fp8_output_config(m, n, k), m, n)
  waves = pl.cdiv(units, sms)
  return units <= waves * sms * hopper_cost.FP8_QUANTIZE_AFTER_MAX_FILL


def glu_unfused(m: int, f: int, k: int) -> bool:
  """Whether a GLU is better run unfused (sm90.py): the gate|up GEMM with the
  dense rules' tiling and a float32 output, then act(gate) * up in XLA
  (hopper_cost.GLU_UNFUSED_MAX_M)."""
  del f
  return (m <= hopper_cost.GLU_UNFUSED_MAX_M
          and pl.cdiv(k, K_BLOCK) >= hopper_cost.K_SPLIT_MIN_BLOCKS)


def glu_config(m: int, f: int, k: int, *, out_dtype) -> HopperConfig:
  """A fused GLU's tiling: 128 x 256 tiles of 128 gate and 128 up columns, the
  two warpgroups one above the other (each holds a gate chunk and its up chunk:
  a third warpgroup would leave none of them registers for two)."""
  del f, k
  cfg = HopperConfig(tile_m=128, tile_n=256, wg_split="m", **_order_and_scales(m),
                     epi_tile_n=SCALE_N if np.dtype(out_dtype) == FP8_OUT else 64,
                     tma_scales=hopper_cost.tma_scales_pay(m, False, 1))
  cfg = _with_registers(cfg)
  return _fit_stages(cfg, out_dtype, None, max_stages=ring_stages(cfg))


def config_for(m, n, k, *, out_dtype, c_dtype=None, b_scale_rows: int = SCALE_N
               ) -> HopperConfig:
  """The autotuned config if this shape was tuned on this device (tuning it now
  under JAX_FP8_AUTOTUNE=1), else the default (the cost model's pick)."""
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


