"""The Hopper kernel's tiling of one CTA: `HopperConfig`, validated in one place
(`check`), and what follows from it (registers per warpgroup, SMEM, the a-scale
window of a pass). pallas/hopper.py runs a config; pallas/hopper_tiling.py picks one.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jax_fp8.pallas.common import K_BLOCK, SCALE_N, rows_buffer_bytes

CHUNK_M = 64           # rows of one WGMMA accumulator (one warpgroup's m64 instructions)
WIDE_PIECE_N = 64      # columns of a promoted piece of a wide chunk (at most)
MIN_PIECE_N = 32       # ... at least (a tile of 160 columns: 32, as its offsets)


@dataclasses.dataclass(frozen=True)
class HopperConfig:
  """Tiling of one CTA.

  tile_m x tile_n: the CTA's output tile. The `consumers` (1, 2 or 3) consumer
  warpgroups split it along `wg_split` ("m": each takes tile_m/consumers rows;
  "n": each takes tile_n/consumers columns; "k": each takes the whole tile and
  every consumers-th K step, the ring's slots dealt out in turn, and the first
  warpgroup sums the others' accumulators through SMEM before its epilogue: a
  K split inside the CTA, with no partial outputs and no reduction after the
  kernel). A warpgroup's part is computed as
  (64, min(cols, 128)) WGMMA chunks, each within one 128-column b_scale block,
  so that only one chunk's temporary accumulator is live next to the float32
  accumulator (register budget).
  stages: SMEM ring depth. grid_minor / group: tile order (planar snake over
  bands of `group` tiles along the minor dimension). epi_tile_n: column width
  of one epilogue store. num_sms: CTAs of the persistent grid (None: the
  device's SM count). cluster_m=2: pairs of CTAs take vertically adjacent
  tiles and share the B tile through TMA multicast; cluster_n=2: horizontally
  adjacent tiles sharing the A tile (at most one of the two is 2).
  producer_registers: registers per thread the TMA warpgroup keeps
  (setmaxnreg); the consumers share the rest. split_k: the K blocks are cut
  into this many equal ranges, each its own unit of work writing a float32
  partial output; a fused XLA reduction sums them (and adds beta * c). k_step:
  K blocks per pipeline step (one slot holds k_step blocks of A and B): fewer
  barrier waits between a warpgroup's last promotion of one step and its
  first WGMMA of the next. scale_product: a warpgroup of one accumulator part
  forms a_scale * b_scale when the scales load and carries the product, and
  every warpgroup loads the next step's scales after its promotion; False
  (decode): a one-part warpgroup carries both and multiplies at promotion, off
  the step's tail, and one-block steps load the next step's scales at their top.
  wide_chunks: a warpgroup's whole column range (up to 256, a multiple of 32) is
  one WGMMA chunk, promoted in pieces of 64 columns, or of 32 where the tile's
  width is not a multiple of 64 (each piece within one 128-row block of b,
  whatever the tile's offset): fewer, wider WGMMAs than 128-column chunks (B is
  read from SMEM once for them all), e.g. 128 x 192 tiles split by rows; tiles
  of 160 columns balance the waves of masked groups (26 column tiles where
  N = 4096). The pieces' b scales load once per 128-row block of b.
  a_scale_window: 0, or the most K steps whose a-scales the producer stages at
  once: it loads the tile's (tile_m, window) block of a_scale from GMEM and
  stores it transposed into a 2-slot SMEM ring, so that a consumer's scales of
  a K block are one contiguous SMEM load instead of a strided GMEM load per
  step (window_steps: the largest divisor of a pass's K steps up to this).
  tma_scales: each ring slot also holds its K block's scales, brought by the
  slot's TMA: the a-scales (of a_scale transposed to [kb, M], a (1, tile_m)
  box) and, for per-row b scales, b's (a (1, tile_n) box); a consumer reads
  them from SMEM at the step's top. Before refilling a slot the producer
  fences the consumers' generic-proxy reads of it (ordered before its TMA
  write through the "empty" barrier).
  live_first (masked GEMMs; the other schedulers ignore it): the CTAs walk the
  tiles holding rows first, group after group, then the tiles past masked_m
  (pallas/scheduler.MaskedScheduler), so that the round robin shares the live
  tiles evenly however masked_m falls.
  step_top_overlap (with tma_scales): a consumer's step top overlaps its
  tensor-core work: it reads a step's scales from the ring once the step's
  first WGMMA is issued and, in K loops carrying their slot (dense ones, and
  grouped ones with carried_slot), tests the next slot's barrier without
  blocking after the step's last WGMMA (before that chunk's promotion), so that
  the next step waits only where the test failed (pallas/barrier_probe.py).
  desc_carry (K loops of one-block steps, no K split among warpgroups): the
  loop forms each step's WGMMA descriptor fields in the step before and
  carries them, so that a step's WGMMAs issue without forming them from the
  slot's SMEM address after its ring wait (pallas/wgmma_desc.py; GPU interpret
  mode runs Pallas's wgmma instead).
  carried_slot (grouped schedulers' K loops; dense ones, K splits among the
  warpgroups and staged a-scale windows always carry it): a unit's K loop
  carries its ring slot from step to step (and with step_top_overlap tests the
  next slot's barrier ahead), as a dense pass does, instead of deriving the
  slot from the pipeline step.
  probe_in_flight (with step_top_overlap, in loops carrying their slot): the
  next slot's barrier test (and the next slot's index) is made once the step's
  last WGMMA is issued, while it runs, instead of once it is waited for: off
  the chain from the WGMMA's completion to the next step's first WGMMA.
  producer_warp: one warp of the producer warpgroup issues the ring's loads
  (plgpu.warp_map; the other three idle at once), so that its instructions
  a step (the slot's wait, the proxy fence before refilling the ring's
  scales, the TMA issues) leave three of the four schedulers to the
  consumers' promotions; without it the four warps run the loop in step
  (warpgroup barriers around every copy); with clusters its multicast copies
  arrive on the barriers as the warpgroup's would. Not with a staged a-scale
  window (a warpgroup's loads).
  """
  tile_m: int = 128
  tile_n: int = 256
  wg_split: str = "n"
  stages: int = 4
  grid_minor: str = "n"
  group: int = 8
  epi_tile_n: int = 64
  num_sms: int | None = None
  cluster_m: int = 1
  cluster_n: int = 1
  consumers: int = 2
  producer_registers: int = 40
  split_k: int = 1
  k_step: int = 1
  scale_product: bool = True
  wide_chunks: bool = False
  a_scale_window: int = 0
  tma_scales: bool = False
  live_first: bool = False
  step_top_overlap: bool = False
  desc_carry: bool = False
  carried_slot: bool = False
  producer_warp: bool = False
  probe_in_flight: bool = False

  def wg_tile(self) -> tuple[int, int]:
    if self.wg_split == "m":
      return self.tile_m // self.consumers, self.tile_n
    if self.wg_split == "k":
      return self.tile_m, self.tile_n
    return self.tile_m, self.tile_n // self.consumers

  @property
  def storing_warpgroups(self) -> int:
    """Consumer warpgroups with an epilogue (store buffers, c's ring): all, or with
    a K split among them the first only."""
    return 1 if self.wg_split == "k" else self.consumers

  @property
  def k_stride(self) -> int:
    """K steps between two of a consumer warpgroup's steps (wg_split "k": each
    takes every consumers-th)."""
    return self.consumers if self.wg_split == "k" else 1

  def can_carry_descriptors(self) -> bool:
    """Whether the K loop's steps allow desc_carry: one K block each (the carried
    address fields are a block's), no K split among the warpgroups and no a-scale
    window (their loops do not carry them)."""
    return self.k_step == 1 and self.k_stride == 1 and not self.a_scale_window

  def can_use_producer_warp(self) -> bool:
    """Whether producer_warp is allowed: one warp's loads take no staged a-scale
    window (a warpgroup's scale loads)."""
    return not self.a_scale_window

  def chunk(self) -> tuple[int, int]:
    """(rows, columns) of one WGMMA chunk."""
    _, wn = self.wg_tile()
    return CHUNK_M, (wn if self.wide_chunks else min(wn, SCALE_N))

  def chunks_per_warpgroup(self) -> int:
    """WGMMA chunks (float32 accumulators of 64 rows) a consumer warpgroup holds."""
    wm, wn = self.wg_tile()
    return (wm // CHUNK_M) * -(-wn // self.chunk()[1])

  def piece_n(self) -> int:
    """Columns of one promoted piece of a chunk (one float32 accumulator array):
    the chunk, or up to 64 of a wide chunk: every piece's columns lie in one
    128-row block of b when the piece width divides 128, the tile's width (the
    tiles' offsets) and the warpgroup's."""
    if not self.wide_chunks:
      return self.chunk()[1]
    return min(WIDE_PIECE_N, math.gcd(SCALE_N, self.tile_n, self.wg_tile()[1]))

  def check(self):
    """Raises ValueError naming the field if this tiling cannot be built."""
    if self.wg_split not in ("m", "n", "k"):
      raise ValueError(f"wg_split must be 'm', 'n' or 'k', got {self.wg_split!r}")
    if self.grid_minor not in ("m", "n"):
      raise ValueError(f"grid_minor must be 'm' or 'n', got {self.grid_minor!r}")
    if self.consumers not in (1, 2, 3) or (self.wg_split == "k" and self.consumers == 1):
      raise ValueError(f"consumers must be 1, 2 or 3 (2 or 3 to split K), got "
                       f"{self.consumers} with wg_split={self.wg_split!r}")
    wm, wn = self.wg_tile()
    split_dim = self.tile_m if self.wg_split == "m" else self.tile_n
    if self.wg_split != "k" and split_dim % self.consumers:
      raise ValueError(f"the split dimension ({split_dim}) must divide among {self.consumers} "
                       "consumer warpgroups")
    if wm % CHUNK_M or wm < CHUNK_M:
      raise ValueError(f"each warpgroup's rows ({wm}) must be a multiple of {CHUNK_M}")
    if self.wide_chunks:
      if wn % MIN_PIECE_N:  # (tile_n <= 256 below: one WGMMA)
        raise ValueError(f"wide_chunks: each warpgroup's columns ({wn}) must be a multiple of "
                         f"{MIN_PIECE_N}")
    elif wn < 16 or (wn > SCALE_N and wn % SCALE_N) or (wn < SCALE_N and SCALE_N % wn):
      raise ValueError(f"each warpgroup's columns ({wn}) must be >= 16 and divide or be a "
                       "multiple of 128")
    if self.tile_m > 256 or self.tile_n > 256:
      raise ValueError("tile_m and tile_n must be <= 256 (TMA box limit)")
    pn = self.piece_n()
    if pn % self.epi_tile_n or self.epi_tile_n < 16:
      raise ValueError(f"epi_tile_n={self.epi_tile_n} must be >= 16 and divide the width of "
                       f"an accumulator piece, {pn}")
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
    if self.a_scale_window and (self.a_scale_window > 32 or self.tile_m not in (128, 256)):
      raise ValueError(f"a_scale_window={self.a_scale_window} needs tile_m 128 or 256 (a "
                       "row or two per producer thread) and at most 32 steps")
    if self.tma_scales and (self.a_scale_window or self.k_step != 1):
      raise ValueError("tma_scales stages one K block's scales per slot: it needs k_step=1 "
                       "and no a_scale_window")
    if self.wg_split == "k" and (self.stages % self.consumers or self.a_scale_window
                                 or self.step_top_overlap):
      # A ring slot must always go to the same warpgroup: a barrier's waiter
      # tracks its parity by waiting on every phase.
      raise ValueError(f"wg_split='k' needs stages ({self.stages}) a multiple of consumers "
                       f"({self.consumers}), and no a_scale_window or step_top_overlap")
    if self.desc_carry and not self.can_carry_descriptors():
      raise ValueError("desc_carry needs one-block steps (k_step=1), no K split among the "
                       "warpgroups and no a_scale_window")
    if self.probe_in_flight and not self.step_top_overlap:
      raise ValueError("probe_in_flight moves step_top_overlap's barrier test: it needs "
                       "step_top_overlap")
    if self.step_top_overlap and not self.tma_scales:
      raise ValueError("step_top_overlap reads a step's scales from its ring slot: it needs "
                       "tma_scales")
    if self.producer_warp and not self.can_use_producer_warp():
      raise ValueError("producer_warp: one warp's loads take no a_scale_window (a "
                       "warpgroup's scale loads)")
    if not 24 <= self.producer_registers <= 256 or self.producer_registers % 8:
      raise ValueError(f"producer_registers must be a multiple of 8 in [24, 256], got "
                       f"{self.producer_registers}")
    # setmaxnreg only moves registers the CTA was launched with: asking for
    # more than that pool makes the consumers' setmaxnreg.inc wait forever.
    pool = launch_registers(self.consumers + 1) * (self.consumers + 1)
    used = self.producer_registers + self.consumers * self.consumer_registers()
    if used > pool:
      raise ValueError(f"producer_registers={self.producer_registers} leaves the "
                       f"{self.consumers} consumer warpgroups {self.consumer_registers()} "
                       f"registers each: {used} per thread of a warpgroup > the {pool} the CTA "
                       "is launched with (the kernel would hang)")

  def consumer_registers(self) -> int:
    """Registers per consumer thread after setmaxnreg: what the producer leaves of
    512 per warpgroup lane, evenly, in multiples of 8, at most 256."""
    return int(min(256, (512 - self.producer_registers) / self.consumers) // 8 * 8)

  def out_slots(self, glu: bool = False) -> int:
    """Store buffers per warpgroup: 2 where the pieces a tile stores pair up (a
    fused GLU stores half its chunks), else 1 (a tile's first store must not find
    its buffer still read by the last tile's)."""
    wm, wn = self.wg_tile()
    cm, cn = self.chunk()
    pieces = (wm // cm) * (wn // cn) * (cn // self.epi_tile_n) // (2 if glu else 1)
    return 2 if pieces % 2 == 0 else 1

  def smem_bytes(self, out_dtype, c_dtype=None, exact_rows: bool = False) -> int:
    """exact_rows: the ragged GEMM's row-exact stores (their buffer)."""
    out_dtype, c_dtype = kernel_dtypes(self, out_dtype, c_dtype)
    stage = (self.tile_m + self.tile_n) * K_BLOCK * self.k_step
    epi = (self.storing_warpgroups * self.out_slots() * CHUNK_M
           * self.epi_tile_n * np.dtype(out_dtype).itemsize)
    if exact_rows:
      epi += self.storing_warpgroups * rows_buffer_bytes(CHUNK_M, self.epi_tile_n, out_dtype)
    if c_dtype is not None:  # a 2-slot ring of c pieces per warpgroup
      epi += (self.storing_warpgroups * 2 * CHUNK_M * self.epi_tile_n
              * np.dtype(c_dtype).itemsize)
    if self.wg_split == "k":  # the other warpgroups' float32 accumulators
      epi += (self.consumers - 1) * self.tile_m * self.tile_n * 4
    staged = 2 * self.a_scale_window * self.k_step * self.tile_m * 4  # at most
    if self.tma_scales:  # (b's per-row scales too, at most)
      staged += self.stages * (self.tile_m + self.tile_n) * 4
    return self.stages * stage + epi + staged + 1024  # barriers and alignment slack

  def window_steps(self, k_steps: int) -> int:
    """K steps per staged a-scale window of a pass of k_steps: the largest divisor
    of k_steps up to a_scale_window; 0 (a-scales from GMEM) if not staged or if
    that is under half the window asked for (e.g. a prime number of steps)."""
    want = min(self.a_scale_window, k_steps)
    window = max((w for w in range(1, want + 1) if k_steps % w == 0), default=0)
    return window if 2 * window >= want else 0


def launch_registers(warpgroups: int) -> int:
  """Registers per thread a CTA of this many warpgroups is launched with: the
  64K register file over its threads, in multiples of 8 (384 threads: 168)."""
  return min(255, 65536 // (128 * warpgroups)) // 8 * 8


def kernel_dtypes(cfg: HopperConfig, out_dtype, c_dtype):
  """(output dtype, c dtype) of the kernel itself: split-K kernels write float32
  partials and leave c to the reduction."""
  if cfg.split_k > 1:
    return np.dtype(jnp.float32), None
  return np.dtype(out_dtype), c_dtype
