"""Blockwise-scaled FP8 matmul for Hopper (sm_90a) in Pallas Mosaic GPU.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[n // 128, kb]  (+ beta * c)

Structure (one CTA per SM, persistent):
- two (or three) consumer warpgroups (WGMMA + promotion + epilogue) and one TMA
  producer (`plgpu.emit_pipeline_warp_specialized`), which streams per K block
  the A tile (tile_m, 128) and the B tile (tile_n, 128) into an SMEM ring of
  `stages` slots (decode: two K blocks per slot and pipeline step, `k_step`);
- the CTA walks output tiles in a grouped ("planar snake") order, so
  consecutive tiles of the 132 CTAs share A rows / B columns in L2; where the
  ring divides the K blocks, the per-tile pipelines are chained, so the
  producer runs on into the next tile instead of draining the ring;
- two-level accumulation: each 128-deep K block goes through WGMMA into a fresh
  accumulator (`plgpu.ACC`), then is promoted into a float32 register
  accumulator: acc += block * a_scale[rows] * b_scale. While one consumer
  promotes, the other's WGMMA keeps the tensor cores busy;
- the scales of K block kb + 1 are loaded from GMEM (L1-cached: a row's scales
  are adjacent) while block kb's WGMMA runs, and carried to the next step, so
  their latency is never waited for; the A-scales need no transpose and no SMEM;
- epilogue: acc (+ beta * c) is cast, written to SMEM and stored with TMA in
  (64, epi_tile_n) pieces, double-buffered. c streams by TMA through a 2-slot
  ring per warpgroup: its first piece is requested before the K loop, each
  next piece while the current one is computed.

Both operands are K-major in SMEM (FP8 WGMMA takes no transposes). Edges: TMA
reads out of bounds give zeros (exact for the partial last K block and for
partial M/N tiles) and TMA writes out of bounds are dropped. Mosaic's tiled
TMA needs every dimension to be a multiple of its SMEM tile (or smaller), so
the wrapper zero-pads what is not (K to 128, M and N to 8, the output's N to
64, the A-scale rows to whole 64-row chunks); padding is exact and sliced off.
DeepSeek-V3 shapes need none.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import autotune, common, device
from jax_fp8.pallas.common import (C_DTYPES, K_BLOCK, SCALE_N, SMEM_BYTES, pad_for_tma,
                                   tiled, unsupported_reason)

CHUNK_M = 64           # rows of one WGMMA accumulator (one warpgroup's m64 instructions)


@dataclasses.dataclass(frozen=True)
class HopperConfig:
  """Tiling of one CTA.

  tile_m x tile_n: the CTA's output tile. The `consumers` (2 or 3) consumer
  warpgroups split it along `wg_split` ("m": each takes tile_m/consumers rows;
  "n": each takes tile_n/consumers columns). A warpgroup's tile is computed as (64, min(cols, 128)) WGMMA chunks,
  each promoted with a single b_scale, so that only one chunk's temporary
  accumulator is live next to the float32 accumulator (register budget).
  stages: SMEM ring depth of the TMA pipeline. grid_minor / group: tile order
  (planar snake over groups of `group` tiles along the minor dimension).
  epi_tile_n: column width of one epilogue store. num_sms: CTAs of the
  persistent grid (None: the device's SM count). cluster_m=2: pairs of CTAs
  (a cluster) take vertically adjacent tiles and share the B tile through TMA
  multicast, halving B's L2 traffic; cluster_n=2: horizontally adjacent tiles
  sharing the A tile (at most one of the two is 2). chain_tiles: chain the
  CTA's per-tile pipelines (no drain between tiles) where every CTA runs >= 2 tiles and
  `stages` divides the K blocks. producer_registers: registers per thread the
  TMA warpgroup keeps (setmaxnreg); the consumers share the rest. split_k:
  the K blocks are cut into this many equal ranges, each its own tile of work
  writing a float32 partial output; a fused XLA reduction sums them (and adds
  beta * c). For small M, where the output tiles alone leave SMs idle.
  k_step: K blocks per pipeline step (one SMEM slot holds k_step 128-deep
  blocks of A and B): fewer barrier waits and per-step bookkeeping between a
  warpgroup's last promotion of one step and its first WGMMA of the next, and
  the scales of a whole step load one step ahead.
  scale_product: a warpgroup of one chunk forms a_scale * b_scale when the
  scales load and carries the product (the default; H100: 6% faster for the
  chained short-K tiles at M=4096); False: it carries both and multiplies at
  promotion, off the step's tail (decode: +1-3%, see _SEPARATE_SCALES_MAX_M).
  """
  tile_m: int = 128
  tile_n: int = 256
  wg_split: str = "n"
  stages: int = 4
  grid_minor: str = "n"
  group: int = 8
  epi_tile_n: int = 64
  chain_tiles: bool = True
  num_sms: int | None = None
  cluster_m: int = 1
  cluster_n: int = 1
  consumers: int = 2
  producer_registers: int = 40
  split_k: int = 1
  k_step: int = 1
  scale_product: bool = True

  def wg_tile(self) -> tuple[int, int]:
    if self.wg_split == "m":
      return self.tile_m // self.consumers, self.tile_n
    return self.tile_m, self.tile_n // self.consumers

  def chunk(self) -> tuple[int, int]:
    wm, wn = self.wg_tile()
    return CHUNK_M, min(wn, SCALE_N)

  def check(self):
    """Raises ValueError naming the field if this tiling cannot be built."""
    if self.wg_split not in ("m", "n"):
      raise ValueError(f"wg_split must be 'm' or 'n', got {self.wg_split!r}")
    if self.grid_minor not in ("m", "n"):
      raise ValueError(f"grid_minor must be 'm' or 'n', got {self.grid_minor!r}")
    if self.consumers not in (2, 3):
      raise ValueError(f"consumers must be 2 or 3, got {self.consumers}")
    wm, wn = self.wg_tile()
    split_dim = self.tile_m if self.wg_split == "m" else self.tile_n
    if split_dim % self.consumers:
      raise ValueError(f"the split dimension ({split_dim}) must divide among {self.consumers} "
                       "consumer warpgroups")
    if wm % CHUNK_M or wm < CHUNK_M:
      raise ValueError(f"each warpgroup's rows ({wm}) must be a multiple of {CHUNK_M}")
    if wn < 16 or (wn > SCALE_N and wn % SCALE_N) or (wn < SCALE_N and SCALE_N % wn):
      raise ValueError(f"each warpgroup's columns ({wn}) must be >= 16 and divide or be a "
                       "multiple of 128")
    if self.tile_m > 256 or self.tile_n > 256:
      raise ValueError("tile_m and tile_n must be <= 256 (TMA box limit)")
    cn = self.chunk()[1]
    if cn % self.epi_tile_n or self.epi_tile_n < 16:
      raise ValueError(f"epi_tile_n={self.epi_tile_n} must be >= 16 and divide the chunk "
                       f"width {cn}")
    if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2):
      raise ValueError(f"cluster_m and cluster_n must be 1 or 2, got {self.cluster_m}, "
                       f"{self.cluster_n}")
    if self.cluster_m * self.cluster_n > 2:
      raise ValueError("a cluster shares A (cluster_n) or B (cluster_m), not both")
    if self.stages < 1 or self.group < 1:
      raise ValueError("stages and group must be >= 1")
    if self.split_k < 1 or (self.split_k > 1 and self.cluster_m > 1):
      raise ValueError(f"split_k must be >= 1, and 1 with clusters, got {self.split_k}")
    if self.k_step not in (1, 2):
      raise ValueError(f"k_step must be 1 or 2, got {self.k_step}")
    if not 24 <= self.producer_registers <= 256 or self.producer_registers % 8:
      raise ValueError(f"producer_registers must be a multiple of 8 in [24, 256], got "
                       f"{self.producer_registers}")
    # setmaxnreg only moves registers the CTA was launched with: asking for
    # more than that pool makes the consumers' setmaxnreg.inc wait forever.
    pool = _launch_registers(self.consumers + 1) * (self.consumers + 1)
    used = self.producer_registers + self.consumers * self.consumer_registers()
    if used > pool:
      raise ValueError(f"producer_registers={self.producer_registers} leaves the "
                       f"{self.consumers} consumer warpgroups {self.consumer_registers()} "
                       f"registers each: {used} per thread of a warpgroup > the {pool} the CTA "
                       "is launched with (the kernel would hang)")

  def consumer_registers(self) -> int:
    """Registers per consumer thread after setmaxnreg (Pallas's split of 512
    per warpgroup lane: what the producer leaves, evenly, in multiples of 8)."""
    return int(min(256, (512 - self.producer_registers) / self.consumers) // 8 * 8)

  def out_slots(self) -> int:
    """Store buffers per warpgroup: 2 where a tile's pieces pair up, else 1 (a
    tile's first store must not find its buffer still read by the last tile's).
    (4 buffers measured 1-3% slower on the H100.)"""
    wm, wn = self.wg_tile()
    cm, cn = self.chunk()
    pieces = (wm // cm) * (wn // cn) * (cn // self.epi_tile_n)
    return 2 if pieces % 2 == 0 else 1

  def smem_bytes(self, out_dtype, c_dtype=None) -> int:
    out_dtype, c_dtype = _kernel_dtypes(self, out_dtype, c_dtype)
    stage = (self.tile_m + self.tile_n) * K_BLOCK * self.k_step
    epi = self.consumers * self.out_slots() * CHUNK_M * self.epi_tile_n * np.dtype(out_dtype).itemsize
    if c_dtype is not None:  # a 2-slot ring of c pieces per warpgroup
      epi += self.consumers * 2 * CHUNK_M * self.epi_tile_n * np.dtype(c_dtype).itemsize
    return self.stages * stage + epi + 1024  # barriers and alignment slack


def _launch_registers(warpgroups: int) -> int:
  """Registers per thread a CTA of this many warpgroups is launched with: the
  64K register file over its threads, in multiples of 8 (384 threads: 168)."""
  return min(255, 65536 // (128 * warpgroups)) // 8 * 8


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


# Large-M candidates (tile_m, tile_n, wg_split, consumers) and their per-tile
# efficiency relative to 128 x 256 (measured on the H100 at full waves): wider
# tiles read less A/B per FLOP. 192 x 128 (three consumers) balances the waves
# where N is narrow (4096x2112x7168: 3 waves of 192-row tiles against 5 of 128).
_LARGE_M_TILES = ((128, 256, "n", 2, 1.0), (128, 128, "m", 2, 0.93),
                  (192, 128, "m", 3, 0.95), (64, 128, "n", 2, 0.8))
# Up to this many K blocks, a tile's fixed cost (first loads, epilogue) outweighs
# its K loop, and chaining the tiles' pipelines hides it: _SHORT_K_TILE tiles with
# a ring as deep as the K loop (H100, 4096x32768x512: 993 TFLOP/s against 845 for
# unchained 128 x 256 and 921 for chained 128 x 128).
_CHAIN_K_BLOCKS = 4
_SHORT_K_TILE = (192, 128, "m", 3)  # tile_m, tile_n, wg_split, consumers
# Small-M (decode) candidates (tile_m, tile_n, wg_split, consumers) and their time
# per tile in units of "columns": the problem is bandwidth-bound, a tile costs its
# width plus a fixed part (its A tile, the epilogue) worth ~32 columns; a 128-row
# tile ~1.6x a 64-row one. 64 x 192 (three warpgroups of 64 columns, each within
# one b_scale block) gives one wave of 128 CTAs where N=24576 has 96 tiles of 256
# (H100, 64x24576x1536: 283 -> 288-291 TFLOP/s, 1.08x -> 1.10-1.12x cuBLAS, four
# runs; 64x24576x7168 342 -> 357, 64x18432x1536 262 -> 273, 64x36864x512 178 -> 195,
# 128x12288x1536 406 -> 430, 128x12288x7168 509 -> 599). For M > 64 only in one wave:
# two 64-row tiles per B tile over several waves lost (128x24576x512 334 -> 302,
# 100x24576x7168 464 -> 459).
_SMALL_M_TILES = ((64, 32, "n", 2, 1.0), (64, 64, "n", 2, 1.0), (64, 128, "n", 2, 1.0),
                  (64, 192, "n", 3, 1.0), (64, 256, "n", 2, 1.0), (128, 64, "m", 2, 1.6),
                  (128, 256, "n", 2, 1.6))
# Long K loops (>= 64 K blocks) on 128 x 256 tiles: a 4-deep ring where it
# divides the K blocks, so that the tiles' pipelines chain (H100:
# 4096x7168x16384 1226 -> 1300 TFLOP/s, 4096x7168x8192 1214 -> 1278,
# 4096x4096x16384 1230 -> 1276, 8192x7168x16384 1221 -> 1291). Unchained, 4
# stages were slower than 3 (1188), and at 56 K blocks (K=7168) chained 4
# stages 3% slower: there the SMEM is better left to L1.
_LONG_K_BLOCKS = 64
_LONG_K_STAGES = 4
# Decode split-K: from this many K blocks (K >= 4096) up, a small-M problem
# whose 64-column tiles would leave at least half the SMs idle splits K into 2
# or 4 ranges instead of narrowing its tiles (H100: 64x2112x7168 124 -> 178
# TFLOP/s, 128x2112x7168 248 -> 333, 64x4096x7168 212 -> 240, 128x4096x7168
# 401 -> 420; below 4096 the reduction's fixed cost outweighs the gain).
_SPLIT_K_MIN_BLOCKS = 32
_SPLIT_K_TILE_N = 64
# Decode tiles of 128 rows (64 < M <= 128) in one wave over at least this many K
# blocks: clusters of 2 CTAs share their A tile by TMA multicast (H100,
# 128x7168x16384: 556-559 -> 575-581 TFLOP/s; where split-K or a second wave
# applies, pairs gained nothing or lost: 128x4096x7168 -1%, 128x24576x1536 -2%).
_SHARED_A_K_BLOCKS = 64
# SMEM the operand ring may take. What SMEM leaves free is L1, where the scale
# loads hit: on the H100 a ring of ~144 KB was fastest for every tile (8 stages
# of 64 x 32 up to 3 of 128 x 256; 6 stages of 128 x 128 ran 10% slower than 4,
# 8 stages of 64 x 32 7% faster than 4). Where the ring divides the K blocks, the
# tiles' pipelines also chain (a ring one deeper to make it divide ran slower).
_RING_BYTES = 144 * 1024
# Decode tiles over at least this many K blocks (K >= 1536) take two K blocks
# per pipeline step, in a ring of the same bytes (half the stages): a warpgroup's
# step boundary (barrier wait, scale loads, bookkeeping) comes once per two blocks.
# H100, one process: 64x7168x16384 306 -> 329 TFLOP/s, 128x7168x2048 399 -> 419,
# 128x24576x1536 504 -> 517, 64x7168x2048 221 -> 227, 64x24576x1536 277 -> 282;
# a ring of the same depth in blocks with one block per step gained nothing.
# Shorter K loops lost (128x32768x512 365 -> 342); at large M it was within +-1%.
# Split-K decode takes them too where they divide a split's blocks (64x2112x7168
# 182 -> 191, 128x2112x7168 332 -> 349, 64x4096x7168 236 -> 246, 128x4096x7168
# 415 -> 439).
_K_STEP_MIN_BLOCKS = 12
# Up to this M (decode, split-K decode) one-chunk warpgroups carry a_scale and
# b_scale separately and multiply at promotion (HopperConfig.scale_product=False):
# the product's FMUL otherwise sits at the end of every step, waiting for the
# scale loads issued during the step's last WGMMA. H100, two runs in one process
# each: 64x7168x16384 333 -> 338-339 TFLOP/s, 128x7168x16384 640 -> 649-650,
# 64x7168x2048 227-229 -> 233-234, 128x7168x2048 418-421 -> 421-422,
# 128x4096x7168 439-445 -> 445-447, 64x24576x1536 289-290 -> 291-292. The chained
# short-K tiles at M=4096 keep the product (4096x32768x512 1000-1011 -> 952-964).
# Loading the scales 2-4 steps ahead instead gained nothing more at decode.
_SEPARATE_SCALES_MAX_M = 128


def _two_block_steps(cfg: HopperConfig, ring_stages: int, extra: int = 0):
  """(cfg with two K blocks per step, its ring depth): the bytes of ring_stages
  one-block stages (+ extra stages)."""
  return dataclasses.replace(cfg, k_step=2), max(2, ring_stages // 2 + extra)


# Registers the producer warpgroup keeps where a consumer carries two chunks
# (128 x 256): ptxas's allocation of the K loop is erratic in the consumers'
# budget (4096x7168x16384 spills 40 B at 232, none at 216, 56 B at 208); 72
# leaves them 216 (H100, M=4096: +0-3%, 0.92-0.95x -> 0.92-0.98x cuBLAS).
_TWO_CHUNK_PRODUCER_REGISTERS = 72


def _ring_stages(tile_m: int, tile_n: int) -> int:
  return max(2, min(8, _RING_BYTES // ((tile_m + tile_n) * K_BLOCK)))


# Up to this many K blocks, the epilogue is a large part of a tile's time and
# stores of 256-byte rows pay (H100, 4096x32768x512: +8%); with longer K loops
# the SMEM they take is better left to L1. 256-column tiles gain up to twice
# as many (4096x24576x1536 +2.4%, 4096x7168x2048 +1.1%, 8192x7168x2048 +1.2%;
# 192 x 128 tiles at 4096x2112x2048 lost 2.4%, K=7168 lost 0.7%).
_SHORT_K_BLOCKS = 8
_SHORT_K_BLOCKS_WIDE_TILE = 16


def _kernel_dtypes(cfg: HopperConfig, out_dtype, c_dtype):
  """(output dtype, c dtype) of the kernel itself: split-K kernels write float32
  partials and leave c to the reduction."""
  if cfg.split_k > 1:
    return np.dtype(jnp.float32), None
  return out_dtype, c_dtype


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


def _with_registers(cfg: HopperConfig) -> HopperConfig:
  """cfg with the producer's register count for its chunks per consumer."""
  wm, wn = cfg.wg_tile()
  if cfg.consumers == 2 and (wm // CHUNK_M) * pl.cdiv(wn, SCALE_N) >= 2:
    return dataclasses.replace(cfg, producer_registers=_TWO_CHUNK_PRODUCER_REGISTERS)
  return cfg


def _with_epilogue(cfg: HopperConfig, out_dtype, k: int, c_dtype=None) -> HopperConfig:
  """The widest epilogue store the chunk and the output dtype allow: rows of
  128 bytes, or 256 for short K loops without c (c's ring takes that SMEM)."""
  out_dtype, c_dtype = _kernel_dtypes(cfg, out_dtype, c_dtype)
  short = _SHORT_K_BLOCKS_WIDE_TILE if cfg.tile_n == 256 else _SHORT_K_BLOCKS
  short_k = pl.cdiv(k, K_BLOCK) <= short
  row_bytes = 256 if short_k and c_dtype is None else 128
  widest = row_bytes // np.dtype(out_dtype).itemsize
  return dataclasses.replace(cfg, epi_tile_n=min(widest, cfg.chunk()[1]))


def default_config(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16,
                   c_dtype=None) -> HopperConfig:
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
  num_sms = _num_sms()
  decode_split = _decode_split_k(m, n, k, num_sms)
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
      tiles = pl.cdiv(m, tm) * pl.cdiv(n, tn)
      # A chained tile's fixed part is about half: the next tile's loads run
      # under its epilogue (H100, 128x24576x1536: chained 128 x 64 tiles 506
      # TFLOP/s, unchained 128 x 256 457, which this model otherwise ties).
      ring = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, consumers=consumers,
                          stages=_ring_stages(tm, tn))
      fixed = 16 if chains_tiles(ring, m, n, k) else 32
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
    shared_a = (tm == 128 and k_blocks >= _SHARED_A_K_BLOCKS
                and pl.cdiv(n, tn) <= num_sms)
    cfg = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, grid_minor="m",
                       consumers=consumers, cluster_n=2 if shared_a else 1,
                       scale_product=m > _SEPARATE_SCALES_MAX_M)
    if k_blocks >= _K_STEP_MIN_BLOCKS:
      # One stage more where a single wave of CTAs pairs up over a long K
      # (128x7168x16384: 611 TFLOP/s at 3 stages of 2 blocks, 643 at 4).
      cfg, max_stages = _two_block_steps(cfg, max_stages, extra=1 if shared_a else 0)
  else:
    def score(t):
      tm, tn, _, _, eff = t
      tiles = pl.cdiv(m, tm) * pl.cdiv(n, tn)
      padding = m / (pl.cdiv(m, tm) * tm) * n / (pl.cdiv(n, tn) * tn)
      return eff * padding * tiles / (pl.cdiv(tiles, num_sms) * num_sms)
    order = "n" if m >= 1024 else "m"
    tm, tn, split, consumers = _SHORT_K_TILE
    if 2 <= k_blocks <= _CHAIN_K_BLOCKS and m / (pl.cdiv(m, tm) * tm) >= 0.95:
      chained = _with_epilogue(HopperConfig(tile_m=tm, tile_n=tn, wg_split=split,
                                            consumers=consumers, grid_minor=order),
                               out_dtype, k, c_dtype)
      chained = _fit_stages(chained, out_dtype, c_dtype, max_stages=k_blocks)
      if chains_tiles(chained, m, n, k):
        return chained
    tm, tn, split, consumers, _ = max(_LARGE_M_TILES, key=score)
    max_stages = _ring_stages(tm, tn)
    cfg = HopperConfig(tile_m=tm, tile_n=tn, wg_split=split, grid_minor=order,
                       consumers=consumers)
  cfg = _with_epilogue(cfg, out_dtype, k, c_dtype)
  cfg = _with_registers(cfg)
  if m > 128 and (tm, tn) == (128, 256) and k_blocks >= _LONG_K_BLOCKS:
    deep = _fit_stages(cfg, out_dtype, c_dtype, max_stages=_LONG_K_STAGES)
    if deep.stages == _LONG_K_STAGES and chains_tiles(deep, m, n, k):
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
    fn = functools.partial(blockwise_fp8_dot, beta=beta, out_dtype=out_dtype, config=cfg)
    return autotune.kernel_time_ms(fn, args, iters=iters, check=check)

  if candidates is None:
    candidates = candidate_configs(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  return autotune.tune(_tune_key(m, n, k, out_dtype, c_dtype), candidates, time_config)


def _config_for(m, n, k, out_dtype, c_dtype) -> HopperConfig:
  """The autotuned config if this shape was tuned on this device (tuning it now
  under JAX_FP8_AUTOTUNE=1), else the heuristic's."""
  cached = autotune.lookup(_tune_key(m, n, k, out_dtype, c_dtype), config_type=HopperConfig)
  if cached is not None:
    return cached
  if autotune.enabled():
    # We may be inside a jit trace: run the tuning calls eagerly, outside it.
    with jax_core.eval_context():
      return tune(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  return default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)


def _num_sms() -> int:
  return device.num_sms(default=132)  # H100 SXM; also what lowering without a GPU assumes


def _kernel(a_gmem, as_gmem, b_gmem, bs_gmem, c_gmem, out_gmem, *, cfg: HopperConfig,
            m: int, n: int, k_blocks: int, beta: float, chain: bool):
  """One CTA of the persistent grid. With split_k > 1, k_blocks is one split's
  K range and out_gmem stacks the splits' partial outputs along its rows."""
  tile_m, tile_n = cfg.tile_m, cfg.tile_n
  wm, wn = cfg.wg_tile()
  cm, cn = cfg.chunk()
  chunks = [(r, c) for r in range(0, wm, cm) for c in range(0, wn, cn)]
  epi_n = cfg.epi_tile_n
  cl_m, cl_n = cfg.cluster_m, cfg.cluster_n
  # Cluster tiles along M and N.
  m_iters, n_iters = pl.cdiv(pl.cdiv(m, tile_m), cl_m), pl.cdiv(pl.cdiv(n, tile_n), cl_n)
  split_rows = out_gmem.shape[0] // cfg.split_k  # one split's partial output
  n_scale_blocks = bs_gmem.shape[0]
  scale_rows = as_gmem.shape[0]  # a multiple of CHUNK_M
  out_dtype = out_gmem.dtype

  op_transforms = tiled(a_gmem.dtype, K_BLOCK)  # 128 fp8 = 128 B: swizzle 128
  k_step = cfg.k_step
  step_k = K_BLOCK * k_step  # K columns of one pipeline step
  # A last step past K reads zeros (TMA bounds); its blocks promote with scale 0.
  k_steps = pl.cdiv(k_blocks, k_step)

  def make_pipeline(body, compute_context, state=None, k0=0):
    """The tile's K loop over blocks k0 .. k0 + k_blocks - 1, k_step per step
    (k0 is a multiple of k_step: with K splits, k_step divides a split's blocks)."""
    return plgpu.emit_pipeline_warp_specialized(
        body,
        grid=(k_steps,),
        memory_registers=cfg.producer_registers,
        in_specs=[
            plgpu.BlockSpec((tile_m, step_k), lambda ks: (0, k0 // k_step + ks),
                            transforms=op_transforms,
                            collective_axes=("cluster",) if cl_n > 1 else ()),
            plgpu.BlockSpec((tile_n, step_k), lambda ks: (0, k0 // k_step + ks),
                            transforms=op_transforms,
                            collective_axes=("cluster",) if cl_m > 1 else ()),
        ],
        wg_axis="wg",
        num_compute_wgs=cfg.consumers,
        max_concurrent_steps=cfg.stages,
        compute_context=compute_context,
        pipeline_state=state,
    )

  out_slots = cfg.out_slots()
  ignore = lambda *_, **__: None
  scratch = dict(
      pipeline_allocs=make_pipeline(ignore, ignore).get_allocations(
          a_gmem.at[:tile_m], b_gmem.at[:tile_n]),
      out_smem=plgpu.SMEM((cfg.consumers, out_slots, cm, epi_n), out_dtype, transforms=tiled(out_dtype, epi_n)),
  )
  if c_gmem is not None:
    # Per warpgroup, a 2-slot ring of c pieces (one piece = one epilogue store).
    scratch["c_smem"] = plgpu.SMEM((cfg.consumers, 2, cm, epi_n), c_gmem.dtype,
                                   transforms=tiled(c_gmem.dtype, epi_n))
    scratch["c_barrier"] = plgpu.Barrier(num_barriers=2 * cfg.consumers)  # [warpgroup * 2 + slot]

  @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
  def _scope(pipeline_allocs, out_smem, c_smem=None, c_barrier=None):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop((cfg.split_k * m_iters * n_iters,), collective_axes="sm")
    def _tile_loop(info):
      (lin,) = info.index
      split, lin = lin // (m_iters * n_iters), lin % (m_iters * n_iters)
      k0 = split * k_blocks  # this tile's first K block
      minor = 1 if cfg.grid_minor == "n" else 0
      mi, ni = plgpu.planar_snake(lin, (m_iters, n_iters), minor, cfg.group)
      # The cluster's CTAs stack vertically (cluster_m) or side by side
      # (cluster_n); a CTA past M or N loads zeros and its stores are dropped,
      # but it must still take part in the multicast.
      if cl_m > 1:
        mi = mi * cl_m + lax.axis_index("cluster")
      if cl_n > 1:
        ni = ni * cl_n + lax.axis_index("cluster")
      m0, n0 = mi * tile_m, ni * tile_n
      # This warpgroup's corner inside the CTA tile.
      if cfg.wg_split == "m":
        wr, wc = wg * wm, 0
      else:
        wr, wc = 0, wg * wn

      # A warpgroup's chunks share rows (wg_split "n") or columns ("m"): the
      # scales are loaded once per distinct row offset and column offset and
      # multiplied per chunk at promotion (fewer live registers in the K loop).
      # A single chunk may carry the product instead (cfg.scale_product).
      chunk_rows = sorted({r for r, _ in chunks})
      chunk_cols = sorted({c for _, c in chunks})

      def k_block_scales(kb):
        """(a_scale of each chunk row offset (one value per row), b_scale of each
        chunk column offset) for K block kb; for one chunk ((their product,), ()).
        A block past the tile's K range (the zeros of a partial last step)
        gets b_scale 0, and reads the last block's scales."""
        valid = kb < k0 + k_blocks
        kb = jnp.minimum(kb, k0 + k_blocks - 1)
        row_scales = []
        for r in chunk_rows:
          # The A-scale rows are padded to whole chunks only: a chunk wholly past
          # them (past M, its rows are never stored) reads the last chunk's.
          row0 = jnp.minimum(m0 + wr + r, scale_rows - cm)
          row_scales.append(plgpu.load(as_gmem.at[pl.ds(row0, cm), kb],
                                       layout=plgpu.Layout.WGMMA.reduce(1), optimized=False))
        col_scales = [bs_gmem[jnp.minimum((n0 + wc + c) // SCALE_N, n_scale_blocks - 1), kb]
                      for c in chunk_cols]
        if k_blocks % k_step:
          col_scales = [jnp.where(valid, s, 0.0) for s in col_scales]
        if len(chunks) == 1 and cfg.scale_product:
          return (row_scales[0] * col_scales[0],), ()
        return tuple(row_scales), tuple(col_scales)

      def chunk_scale(scales, r, c):
        """a_scale[rows] * b_scale of chunk (r, c), from k_block_scales."""
        row_scales, col_scales = scales
        if not col_scales:
          return row_scales[0]
        return row_scales[chunk_rows.index(r)] * col_scales[chunk_cols.index(c)]

      def step_scales(ks):
        """k_block_scales of the K blocks of step ks."""
        return tuple(k_block_scales(k0 + ks * k_step + j) for j in range(k_step))

      def body(idx, a_smem, b_smem, carry):
        (ks,) = idx
        acc, scales = carry
        next_step = k0 + jnp.minimum(ks + 1, k_steps - 1) * k_step
        # Issued now, used in the next step: the loads overlap this step's WGMMAs.
        # With several blocks per step, block j's are issued after block j - 1's
        # promotion (its scales are dead by then): no more live registers than one block's.
        next_scales = [k_block_scales(next_step)] if k_step == 1 else []
        for j in range(k_step):
          if j > 0:
            next_scales.append(k_block_scales(next_step + j - 1))
          new_acc = []
          for (r, c), acc_c in zip(chunks, acc):
            rows, cols, kcols = wr + r, wc + c, pl.ds(j * K_BLOCK, K_BLOCK)

            def mma(block_ref, rows=rows, cols=cols, kcols=kcols):
              plgpu.wgmma(block_ref, a_smem.at[pl.ds(rows, cm), kcols],
                          b_smem.at[pl.ds(cols, cn), kcols].T)
              return block_ref[...]

            block = pl.run_scoped(mma, plgpu.ACC((cm, cn), jnp.float32))
            s = chunk_scale(scales[j], r, c)
            # promote: the f32 sum over K blocks runs outside the tensor cores.
            new_acc.append(acc_c + block * lax.broadcast_in_dim(s, block.shape, [0]))
          acc = tuple(new_acc)
        if k_step > 1:
          next_scales.append(k_block_scales(next_step + k_step - 1))
        # Only WGMMA (the async proxy) read this slot, so releasing it to the
        # producer's TMA needs no proxy fence.
        return acc, tuple(next_scales)

      # The epilogue's pieces, one (64, epi_tile_n) store each, chunk by chunk:
      # (chunk index, column offset inside the chunk).
      pieces = [(ci, e) for ci in range(len(chunks)) for e in range(0, cn, epi_n)]

      def window(i, split=0):
        """The GMEM rows and columns of piece i (in c, and in the output with
        split: its partial output)."""
        ci, e = pieces[i]
        r, c = chunks[ci]
        return pl.ds(split * split_rows + m0 + wr + r, cm), pl.ds(n0 + wc + c + e, epi_n)

      def load_c(i):
        """Starts the TMA of c for piece i into its ring slot."""
        slot = i % 2
        plgpu.copy_gmem_to_smem(c_gmem.at[window(i)], c_smem.at[wg, slot],
                                c_barrier.at[wg * 2 + slot])

      def compute_context(run_pipeline):
        if c_gmem is not None:
          load_c(0)  # c's first piece arrives while the K loop runs
        zero = plgpu.layout_cast(jnp.zeros((cm, cn), jnp.float32), plgpu.Layout.WGMMA)
        acc, _ = run_pipeline((tuple(zero for _ in chunks), step_scales(0)))
        # Epilogue: (+ beta * c), cast, SMEM, TMA store; stores are double-buffered,
        # and c piece i + 1 loads while piece i is computed.
        for i, (ci, e) in enumerate(pieces):
          val = acc[ci][:, e:e + epi_n]
          if c_gmem is not None:
            if i + 1 < len(pieces):
              # Its slot was last read for piece i - 1, before that piece's
              # commit_smem (a warpgroup barrier and proxy fence).
              load_c(i + 1)
            plgpu.barrier_wait(c_barrier.at[wg * 2 + i % 2])
            val = val + c_smem[wg, i % 2].astype(jnp.float32) * beta
          slot = i % out_slots
          plgpu.wait_smem_to_gmem(out_slots - 1, wait_read_only=True)
          out_smem[wg, slot] = val.astype(out_dtype)
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(out_smem.at[wg, slot], out_gmem.at[window(i, split)])

      state = None
      if chain:
        # One pipeline per tile, chained: the producer runs on into the next
        # tile's K blocks instead of draining the ring at every tile's end, so
        # the next tile's first loads overlap this one's last WGMMAs and epilogue.
        first = info.local_index == 0
        last = info.local_index == info.num_local_steps - 1
        state = jnp.where(first, int(plgpu.PipelinePipeline.START),
                          jnp.where(last, int(plgpu.PipelinePipeline.STOP),
                                    int(plgpu.PipelinePipeline.STEADY)))
      make_pipeline(body, compute_context, state, k0)(
          a_gmem.at[pl.ds(m0, tile_m)],
          b_gmem.at[pl.ds(n0, tile_n)],
          allocations=pipeline_allocs,
      )

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _cluster_tiles(cfg: HopperConfig, m: int, n: int) -> int:
  """Units of work of the persistent grid: (cluster) output tiles x K splits."""
  return (pl.cdiv(pl.cdiv(m, cfg.tile_m), cfg.cluster_m)
          * pl.cdiv(pl.cdiv(n, cfg.tile_n), cfg.cluster_n) * cfg.split_k)


def _grid_size(cfg: HopperConfig, m: int, n: int) -> int:
  """Entries of the persistent grid, one per cluster (of cluster_m x cluster_n CTAs)."""
  return min((cfg.num_sms or _num_sms()) // (cfg.cluster_m * cfg.cluster_n),
             _cluster_tiles(cfg, m, n))


def chains_tiles(cfg: HopperConfig, m: int, n: int, k: int) -> bool:
  """Whether the kernel chains its per-tile pipelines: every CTA must run >= 2
  tiles (the first starts the chain, the last stops it) and the ring must wrap
  exactly at a tile's end."""
  return (cfg.chain_tiles and _cluster_tiles(cfg, m, n) >= 2 * _grid_size(cfg, m, n)
          and pl.cdiv(pl.cdiv(k, K_BLOCK) // cfg.split_k, cfg.k_step) % cfg.stages == 0)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype,
                      config: HopperConfig | None = None):
  """2-D blockwise FP8 matmul on an H100 (or in GPU interpret mode)."""
  out_dtype = np.dtype(out_dtype)
  m, k = a.shape
  n = b.shape[0]
  reason = unsupported_reason("blockwise_fp8_dot", m, n, k, out_dtype=out_dtype,
                              has_c=c is not None)
  if reason is not None:
    raise ValueError(reason)
  k_blocks = pl.cdiv(k, K_BLOCK)
  if c is not None and np.dtype(c.dtype) not in C_DTYPES:
    c = c.astype(jnp.float32)
  cfg = config or _config_for(m, n, k, out_dtype, None if c is None else np.dtype(c.dtype))
  cfg.check()
  split_k = cfg.split_k
  if k_blocks % split_k:
    raise ValueError(f"split_k={split_k} must divide the {k_blocks} K blocks of K={k}")
  if split_k > 1 and (k_blocks // split_k) % cfg.k_step:
    raise ValueError(f"k_step={cfg.k_step} must divide each split's {k_blocks // split_k} "
                     f"K blocks (K={k}, split_k={split_k})")
  kernel_dtype, _ = _kernel_dtypes(cfg, out_dtype, None)
  c_in = c
  if split_k > 1:
    c = None  # each split writes float32 partials; c joins in the reduction below

  ops = pad_for_tma(a, a_scale, b, c, tile_m=cfg.tile_m, tile_n=cfg.tile_n,
                    out_cols_multiple=64, transpose_a_scale=False,
                    a_scale_rows_multiple=CHUNK_M)
  cl = cfg.cluster_m * cfg.cluster_n
  grid = _grid_size(cfg, m, n)
  chain = chains_tiles(cfg, m, n, k)
  # A split's partial output has whole tiles of rows: the TMA stores of its
  # last row tile must not land in the next split's rows.
  split_rows = pl.cdiv(m, cfg.tile_m) * cfg.tile_m if split_k > 1 else ops.rows
  kernel = plgpu.kernel(
      functools.partial(_kernel, cfg=cfg, m=m, n=n, k_blocks=k_blocks // split_k,
                        beta=float(beta), chain=chain),
      out_type=jax.ShapeDtypeStruct((split_k * split_rows, ops.out_cols), kernel_dtype),
      grid=(grid,),
      grid_names=("sm",),
      cluster=(cl,),
      cluster_names=("cluster",),
      num_threads=cfg.consumers + 1,
      thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=False),
  )
  out = kernel(ops.a, ops.a_scale, ops.b, b_scale, ops.c)
  if split_k > 1:
    # One fused XLA reduction, in a fixed order (deterministic).
    out = out.reshape(split_k, split_rows, ops.out_cols)[:, :m, :n].sum(axis=0)
    if c_in is not None:
      out = out + beta * c_in.astype(jnp.float32)
    return out.astype(out_dtype)
  if out.shape != (m, n):
    out = out[:m, :n]
  return out
