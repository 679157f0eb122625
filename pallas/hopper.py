"""Blockwise-scaled FP8 matmul for Hopper (sm_90a) in Pallas Mosaic GPU.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[<n>, kb]  (+ beta * c)

One kernel serves every variant: a tile scheduler (pallas/scheduler.py) says
which output tile a persistent CTA computes at each step (dense with K splits,
masked groups, ragged groups) and a scale recipe (pallas/recipe.py) says how
the scales of a K block enter the sum (128x128 or per-row b scales).

Warp roles (one CTA per SM, persistent; every role walks the scheduler itself):
- `producer` (the last warpgroup): per pipeline step, TMA of the A tile
  (tile_m, k_step * 128) and the B tile (tile_n, k_step * 128) into an SMEM
  ring of `stages` slots; in clusters, the shared operand is multicast. The
  ring runs on across tiles: the next tile's loads overlap this tile's last
  WGMMAs and its epilogue. With `tma_scales` (the rules' choice from M = 2048)
  a slot also holds its K block's a-scales (a_scale transposed to [kb, M]) and
  per-row b scales, brought by the same TMA barrier.
- `consumer` (1-3 warpgroups, each a (wm, wn) part of the tile, or, with
  wg_split "k", the whole tile over every consumers-th K step, the first
  warpgroup summing the others' accumulators through SMEM before its epilogue):
  `consumer_k_step` issues one WGMMA per 128-deep K block into a fresh
  accumulator (`plgpu.ACC`) and promotes it into the float32 register
  accumulator: acc += block * factor (two-level accumulation: FP8 tensor cores
  sum 128 products with ~14 bits; the sum over K blocks runs in float32). The
  scales come from the slot's SMEM at the step's top (tma_scales), else the
  next step's load from GMEM while this step's WGMMAs run.
  `epilogue`: (+ beta * c), rows outside the problem zeroed, cast, SMEM, TMA
  store in (64, epi_tile_n) pieces, c prefetched piece by piece (a ragged
  piece's rows only: OutputStores.store_rows).

Both operands are K-major in SMEM (FP8 WGMMA takes no transposes). Edges: TMA
reads out of bounds give zeros (exact for the partial last K block and partial
M/N tiles) and TMA writes out of bounds are dropped. Mosaic's tiled TMA needs
every dimension to be a multiple of its SMEM tile (or smaller), so the wrapper
zero-pads what is not (K to 128, M and N to 8, the output's N to 64, the
A-scale rows to whole 64-row chunks, or transposed for tma_scales); padding is
exact and sliced off. Where A's rows end inside its last row tile, that tile's
TMA box is short (whole 8-row tiles; the tile's other rows are never stored): A
is not padded to a tile, and not at all up to 8 rows; A-scales of at most
FEW_A_SCALE_ROWS rows are not padded either (read one by one).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import device, problem, proxy_fence, quant_math, wgmma_desc
from jax_fp8.pallas.common import (C_DTYPES, FP8_OUT, K_BLOCK, SCALE_N, copy_a_rows,
                                   TMA_SMEM_ALIGN, gate_activation, pad_for_tma,
                                   rows_buffer_shape, tiled, unsupported_reason)
# kernel_dtypes: also imported from here by earlier revisions' hopper_tiling.py
# (tools/tiling_picks.py --rev loads them against this tree).
from jax_fp8.pallas.hopper_config import CHUNK_M, HopperConfig, kernel_dtypes  # noqa: F401
from jax_fp8.pallas.pipeline import (OutputStores, PartialSums, PrefetchRing,
                                     ProducerConsumerPipeline, Stage)
from jax_fp8.pallas.recipe import zero_unless

i32 = jnp.int32

__all__ = ["HopperConfig", "blockwise_fp8_dot", "masked_dot", "ragged_dot",
           "unsupported_reason"]


def num_sms() -> int:
  return device.num_sms(default=132)  # H100 SXM; also what lowering without a GPU assumes


# ----------------------------------------------------------------------------- the kernel

def _kernel(a_gmem, as_gmem, b_gmem, bs_gmem, c_gmem, meta, *outs,
            cfg: HopperConfig, prob: problem.Problem):
  """One CTA. Shapes (every operand carries a leading group axis):
  a [Ga, rows, K], as [Ga, scale_rows, kb], b [Gb, N', K], bs [Gb, nb, kb] or
  (per-row b scales) [Gb, kb, N'], c [1, rows, cols] or None; outs: out [Go, rows, cols]
  (FP8 output: and its scales [Go, cols / 128, rows'])."""
  out_gmem = outs[0] if len(outs) == 1 else outs
  consumers, stages, k_step = cfg.consumers, cfg.stages, cfg.k_step
  storing = cfg.storing_warpgroups  # warpgroups with an epilogue: store buffers, c's ring
  tile_m, tile_n, step_k = cfg.tile_m, cfg.tile_n, K_BLOCK * cfg.k_step
  k_steps = pl.cdiv(prob.k_blocks, k_step)
  window = cfg.window_steps(k_steps)  # K steps per staged a-scale window, or 0
  cluster_axes = ("cluster",) if cfg.cluster_m * cfg.cluster_n > 1 else ()
  sched = dataclasses.replace(prob.scheduler, **meta)  # its GMEM refs (tables; _run: units_ref)
  out_dtype = (out_gmem[0] if prob.quantize_out else out_gmem).dtype
  fp8 = a_gmem.dtype
  cm, cn = cfg.chunk()
  stage_b_scales = cfg.tma_scales and prob.recipe.per_row_b
  full_arrivals = (3 if prob.glu_rows else 2) + cfg.tma_scales + stage_b_scales
  scratch = dict(
      a_smem=plgpu.SMEM((stages, tile_m, step_k), fp8, transforms=tiled(fp8, K_BLOCK)),
      b_smem=plgpu.SMEM((stages, tile_n, step_k), fp8, transforms=tiled(fp8, K_BLOCK)),
      out_smem=plgpu.SMEM((storing, cfg.out_slots(glu=bool(prob.glu_rows)), cm, cfg.epi_tile_n),
                          out_dtype, transforms=tiled(out_dtype, cfg.epi_tile_n)),
      # With a K split among the warpgroups each slot is consumed by one of them.
      **ProducerConsumerPipeline.barriers(stages, full_arrivals=full_arrivals,
                                          empty_arrivals=consumers // cfg.k_stride,
                                          cluster_axes=cluster_axes),
  )
  if cfg.k_stride > 1:  # the other warpgroups' accumulators, summed by the first's
    scratch["k_sum"] = plgpu.SMEM((consumers - 1, len(_parts(cfg)), cm, cfg.piece_n()),
                                  jnp.float32)
    scratch["k_sum_full"] = plgpu.Barrier(num_arrivals=consumers - 1)
    scratch["k_sum_free"] = plgpu.Barrier(num_arrivals=1)
  if cfg.tma_scales:  # each slot's K block's scales, TMA destinations like the operands
    scratch["a_scales"] = plgpu.SMEM((stages, 1, tile_m), jnp.float32)
    if stage_b_scales:
      scratch["b_scales"] = plgpu.SMEM((stages, 1, tile_n), jnp.float32)
  if prob.exact_rows:  # a piece's rows, sliced anywhere by the partial stores
    scratch["rows_smem"] = plgpu.SMEM((storing, *rows_buffer_shape(cm, cfg.epi_tile_n,
                                                                   out_dtype)), out_dtype)
  if window:
    scratch["a_stage"] = plgpu.SMEM((2, window * k_step, tile_m), jnp.float32)
    scratch.update({f"stage_{name}": bar for name, bar in ProducerConsumerPipeline.barriers(
        2, full_arrivals=1, empty_arrivals=consumers).items()})
  if c_gmem is not None:
    scratch["c_smem"] = plgpu.SMEM((storing, 2, cm, cfg.epi_tile_n), c_gmem.dtype,
                                   transforms=tiled(c_gmem.dtype, cfg.epi_tile_n))
    scratch["c_barrier"] = plgpu.Barrier(num_barriers=2 * storing)  # [warpgroup * 2 + slot]

  @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
  def _scope(a_smem, b_smem, out_smem, full, empty, c_smem=None, c_barrier=None, a_stage=None,
             stage_full=None, stage_empty=None, rows_smem=None, a_scales=None, b_scales=None,
             k_sum=None, k_sum_full=None, k_sum_free=None):
    inputs = ProducerConsumerPipeline(full, empty, stages)
    # a-scale windows: a 2-slot ring the producer fills with generic stores
    scale_ring = ProducerConsumerPipeline(stage_full, stage_empty, 2) if window else None
    cta, num_ctas = lax.axis_index("sm"), lax.axis_size("sm")
    cluster_index = lax.axis_index("cluster") if cluster_axes else i32(0)
    wg = lax.axis_index("wg")
    # The producer's walk. Where _run gives the unit count as a GMEM ref, the
    # consumers read it; the producer walks the same units by the constant count
    # (its unrolled walk stayed within its registers; with the loaded count it
    # spilled at 72).
    walk = dataclasses.replace(sched, units_ref=None)

    def for_each_pass(body, step):
      """body(tile, tile_pass, step0) over this CTA's tiles and K passes, in
      order; step0 is the pass's first pipeline step. Returns the steps run."""
      def tile_body(i, step):
        tile = walk.tile(cta + i * num_ctas, cluster_index)
        if walk.static_passes:
          body(tile, walk.tile_pass(tile, 0), step)
          return step + i32(k_steps)
        if walk.single_pass:
          pl.when(tile.passes > 0)(lambda: body(tile, walk.tile_pass(tile, 0), step))
          return step + tile.passes * i32(k_steps)

        def pass_body(p, step):
          body(tile, walk.tile_pass(tile, p), step)
          return step + i32(k_steps)
        return lax.fori_loop(i32(0), tile.passes, pass_body, step)
      return lax.fori_loop(i32(0), walk.local_units(cta, num_ctas), tile_body, step)

    def _loads():
      """The producer's loop: every ring step's TMA copies, unit after unit."""
      total = walk.steps(cta, num_ctas, k_steps)
      with contextlib.ExitStack() as rings:
        produce = rings.enter_context(inputs.producer(total))
        if window:
          produce_window = rings.enter_context(scale_ring.producer(lax.div(total, i32(window))))

        def load_a_scales(tile, w):
          """The a-scales of window w of the tile's pass: a (tile_m,) column per K block."""
          blocks = window * k_step
          last = tile.k0 + prob.k_blocks - 1
          return [plgpu.load(as_gmem.at[tile.a_group, pl.ds(tile.m0, tile_m),
                                        jnp.minimum(tile.k0 + w * blocks + j, last)],
                             layout=plgpu.Layout.WG_STRIDED((tile_m,), 1), optimized=False)
                  for j in range(blocks)]

        def load_pass(tile, tp, step0):
          def load_step(ks):
            with produce(step0 + ks) as st:
              bar = inputs.producer_mbar(st)
              kcols = pl.ds((tile.k0 + ks * k_step) * K_BLOCK, step_k)
              if cfg.tma_scales:
                # The consumers' reads of this slot's scales (generic proxy) are
                # ordered before the TMA that overwrites them (async proxy).
                if cfg.producer_warp:
                  proxy_fence.async_proxy_fence()
                else:
                  plgpu.commit_smem()
                kb = pl.ds(tile.k0 + ks, 1)
                plgpu.copy_gmem_to_smem(as_gmem.at[tile.a_group, kb, pl.ds(tile.m0, tile_m)],
                                        a_scales.at[st.index], bar)
                if stage_b_scales:
                  plgpu.copy_gmem_to_smem(bs_gmem.at[tp.b_group, kb, pl.ds(tile.n0, tile_n)],
                                          b_scales.at[st.index], bar)
              copy_a_rows(a_gmem, tile.a_group, tile.m0, kcols, a_smem.at[st.index], bar,
                          tile_m=tile_m,
                          collective_axes=cluster_axes if cfg.cluster_n > 1 else None)
              if prob.glu_rows:  # gate rows beside the same up rows
                half = tile_n // 2
                for i, row0 in enumerate((tile.n0, prob.glu_rows + tile.n0)):
                  plgpu.copy_gmem_to_smem(b_gmem.at[tp.b_group, pl.ds(row0, half), kcols],
                                          b_smem.at[st.index, pl.ds(i * half, half)], bar)
              else:
                plgpu.copy_gmem_to_smem(
                    b_gmem.at[tp.b_group, pl.ds(tile.n0, tile_n), kcols], b_smem.at[st.index],
                    bar, collective_axes=cluster_axes if cfg.cluster_m > 1 else None)
          if not window:
            lax.fori_loop(i32(0), i32(k_steps), lambda ks, _: load_step(ks), None)
            return

          # The window's scale loads are in flight while the TMAs of its first
          # `lead` steps are issued (the consumers are a ring behind: they reach
          # the window after them); then they are stored and the window is full.
          lead = min(stages - 1, window)

          def load_window(w, _):
            cols = load_a_scales(tile, w)
            lax.fori_loop(i32(0), i32(lead), lambda i, _: load_step(w * window + i), None)
            with produce_window(lax.div(step0, i32(window)) + w) as wst:
              for j, col in enumerate(cols):
                a_stage.at[wst.index, j][...] = col
              plgpu.barrier_arrive(scale_ring.producer_mbar(wst))
            lax.fori_loop(i32(lead), i32(window), lambda i, _: load_step(w * window + i), None)
          lax.fori_loop(i32(0), i32(k_steps // window), load_window, None)
        for_each_pass(load_pass, i32(0))

    @pl.when(wg == consumers)
    def _producer():
      plgpu.set_max_registers(cfg.producer_registers, action="decrease")
      if cfg.producer_warp:
        @plgpu.warp_map
        def _one_warp(warp):
          pl.when(warp == 0)(_loads)
      else:
        _loads()

    @pl.when(wg < consumers)
    def _consumer():
      plgpu.set_max_registers(cfg.consumer_registers(), action="increase")
      # This warpgroup's store buffers and c ring (a K split's first warpgroup's).
      ew = wg if storing == consumers else i32(0)
      c_ring = None
      if c_gmem is not None:
        c_ring = PrefetchRing(c_smem.at[ew], c_barrier, first_barrier=ew * 2)
      stores = OutputStores(out_smem.at[ew], None if rows_smem is None else rows_smem.at[ew])
      fields = ((wgmma_desc.address_field(a_smem), wgmma_desc.address_field(b_smem))
                if _carries_descriptors(cfg) else None)
      warpgroup = _Warpgroup(cfg, prob, wg, as_gmem, bs_gmem, window, a_stage, scale_ring,
                             a_scales, b_scales, fields)
      partial_sums = PartialSums(k_sum, k_sum_full, k_sum_free) if cfg.k_stride > 1 else None

      def tile_body(i, step):
        tile = sched.tile(cta + i * num_ctas, cluster_index)
        if c_ring is not None:  # c lands during the K loop
          def start_c():
            c_ring.start(0, c_gmem.at[0, *warpgroup.window(tile, 0)])
          if cfg.k_stride > 1:  # the first warpgroup stores the tile
            pl.when(wg == 0)(start_c)
          else:
            start_c()
        acc = warpgroup.zero_accumulator()

        def pass_body(p, carry):
          step, acc = carry
          tp = sched.tile_pass(tile, p)
          acc = warpgroup.run_pass(inputs, a_smem, b_smem, tile, tp, step, acc, k_steps)
          return step + i32(k_steps), acc

        if sched.static_passes:
          step, acc = pass_body(i32(0), (step, acc))
        elif sched.single_pass:
          step, acc = lax.cond(tile.passes > 0, functools.partial(pass_body, i32(0)),
                               lambda carry: carry, (step, acc))
        else:
          step, acc = lax.fori_loop(i32(0), tile.passes, pass_body, (step, acc))
        if cfg.k_stride == 1:
          with jax.named_scope("epilogue"):
            warpgroup.epilogue(tile, acc, out_gmem, stores, c_gmem, c_ring)
          return step
        # K split among the warpgroups: the others hand their sums to the first,
        # which stores the tile.
        pl.when(wg > 0)(lambda: partial_sums.hand_over(wg, acc, handed_before=i > 0))

        @pl.when(wg == 0)
        def _sum_and_store():
          total = partial_sums.add_to(acc)
          with jax.named_scope("epilogue"):
            warpgroup.epilogue(tile, total, out_gmem, stores, c_gmem, c_ring)
        return step

      units = sched.local_units(cta, num_ctas)
      lax.fori_loop(i32(0), units, tile_body, i32(0))
      if cfg.k_stride > 1:
        partial_sums.finish(handed_over=(wg > 0) & (units > 0))
      OutputStores.finish()


def _carries_descriptors(cfg: HopperConfig) -> bool:
  """Whether the consumers' K loop carries its WGMMA descriptors (desc_carry;
  GPU interpret mode runs Pallas's wgmma instead: pallas/wgmma_desc.py)."""
  return cfg.desc_carry and not device.interpret_mode_active()


def _chunks(cfg: HopperConfig):
  """(row, column) offsets of a warpgroup's WGMMA chunks."""
  wm, wn = cfg.wg_tile()
  cm, cn = cfg.chunk()
  return [(r, c) for r in range(0, wm, cm) for c in range(0, wn, cn)]


def _parts(cfg: HopperConfig):
  """(row, column) offsets of a warpgroup's accumulator pieces, chunk by chunk:
  the float32 accumulator is one (64, piece_n) array per part."""
  cn, pn = cfg.chunk()[1], cfg.piece_n()
  return [(r, c + p) for r, c in _chunks(cfg) for p in range(0, cn, pn)]


@dataclasses.dataclass(frozen=True)
class _Warpgroup:
  """A consumer warpgroup's part of the tile and what it does with it."""
  cfg: HopperConfig
  prob: problem.Problem
  wg: object
  as_gmem: object
  bs_gmem: object
  a_window: int = 0        # K steps per staged a-scale window (0: a-scales from GMEM)
  a_stage: object = None   # the windows' SMEM ring, [2, window * k_step, tile_m]
  scale_ring: object = None
  a_scales: object = None  # tma_scales: the ring's a-scales, [stages, 1, tile_m]
  b_scales: object = None  # ... and per-row b scales, [stages, 1, tile_n]
  ring_fields: object = None  # desc_carry: the A and B rings' address fields

  def slot_fields(self, slot):
    """The descriptor address fields (pallas/wgmma_desc.py) of this warpgroup's
    first A and B rows in ring slot `slot`."""
    wr, wc = self.corner()
    a, b = self.ring_fields
    row = wgmma_desc.ROW_FIELD
    return (a + (slot * self.cfg.tile_m + wr) * row, b + (slot * self.cfg.tile_n + wc) * row)

  @property
  def chunks(self):
    return _chunks(self.cfg)

  @property
  def parts(self):
    return _parts(self.cfg)

  def corner(self):
    """This warpgroup's (row, column) offset inside the CTA tile."""
    wm, wn = self.cfg.wg_tile()
    if self.cfg.wg_split == "m":
      return self.wg * wm, i32(0)
    if self.cfg.wg_split == "n":
      return i32(0), self.wg * wn
    return i32(0), i32(0)  # "k": every warpgroup the whole tile

  def b_row(self, tile, col):
    """The row of b behind column `col` of the CTA's B tile (a GLU's B tile is
    tile_n / 2 gate rows beside the same up rows)."""
    if not self.prob.glu_rows:
      return tile.n0 + col
    half = self.cfg.tile_n // 2
    return jnp.where(col < half, tile.n0 + col, self.prob.glu_rows + tile.n0 + col - half)

  def zero_accumulator(self):
    cm, pn = self.cfg.chunk()[0], self.cfg.piece_n()
    zero = plgpu.layout_cast(jnp.zeros((cm, pn), jnp.float32), plgpu.Layout.WGMMA)
    return tuple(zero for _ in self.parts)

  # -- scales ------------------------------------------------------------------
  def k_block_scales(self, tile, tp, kb, a_staged=None, b_staged=None):
    """(row factors of the chunk row offsets, b scales of the part column
    offsets) of K block kb; with one part carrying the product: ((product,), ()).
    a_staged: the block's a-scales staged in SMEM ([tile_m], the tile's rows),
    else they load from GMEM; b_staged: its per-row b scales ([tile_n]).
    A block past the unit's K range (the zeros of a partial last step) gets
    factor 0 (never inf * 0)."""
    cfg, recipe = self.cfg, self.prob.recipe
    cm = cfg.chunk()[0]
    wr, wc = self.corner()
    chunks = self.chunks
    valid = kb < tile.k0 + self.prob.k_blocks
    kb = jnp.minimum(kb, tile.k0 + self.prob.k_blocks - 1)
    scale_rows = self.as_gmem.shape[1]  # a multiple of CHUNK_M, or FEW_A_SCALE_ROWS at most
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    rows_scales = []
    for r in sorted({r for r, _ in chunks}):
      row0 = tile.m0 + wr + r
      if a_staged is not None:
        s = plgpu.load(a_staged.at[pl.ds(wr + r, cm)], layout=row_layout, optimized=False)
      elif scale_rows < cm:
        s = self.few_rows_scales(tile.a_group, kb, cm, row_layout)
      else:
        # Rows are padded to whole chunks only: a chunk wholly past them (past M:
        # its rows are never stored) reads the last chunk's.
        s = plgpu.load(self.as_gmem.at[tile.a_group,
                                       pl.ds(jnp.minimum(row0, scale_rows - cm), cm), kb],
                       layout=row_layout, optimized=False)
      if self.partial_last_step:
        s = zero_unless(valid, s)
      rows_scales.append(s)
    col_scales = []
    shared = self.shared_b_blocks(tile, tp, kb)  # (None with per-row b scales)
    for c in sorted({c for _, c in self.parts}):
      if shared is not None:
        b = shared(c)
      elif b_staged is not None:
        b = plgpu.load(b_staged.at[pl.ds(wc + c, cfg.piece_n())],
                       layout=plgpu.Layout.WGMMA.reduce(0), optimized=False)
      else:
        b = recipe.load_b(self.bs_gmem, tp.b_group, kb, self.b_row(tile, wc + c),
                          cfg.piece_n(), plgpu.Layout.WGMMA.reduce(0))
      col_scales.append(zero_unless(valid, b) if self.partial_last_step else b)
    if len(self.parts) == 1 and cfg.scale_product and not recipe.per_row_b:
      return (recipe.row_factor(rows_scales[0], col_scales[0]),), ()
    return tuple(rows_scales), tuple(col_scales)

  def few_rows_scales(self, group, kb, cm, row_layout):
    """K block kb's a-scales where a_scale holds only FEW_A_SCALE_ROWS rows or
    fewer (not padded to a chunk): each read on its own (a scalar) and selected
    into its row of the chunk; the chunk's rows past them (past M, never stored)
    take the last one's. (Every row through a select: a scalar broadcast cast to
    the row layout on its own leaves Mosaic's layout inference without a
    solution.)"""
    def row(r):
      return lax.broadcast_in_dim(self.as_gmem[group, r, kb], (cm,), ())
    rows = plgpu.broadcasted_iota(jnp.int32, (cm,), 0, layout=row_layout)
    n = self.as_gmem.shape[1]
    s = jnp.where(rows == 0, row(0), row(n - 1))
    for r in range(1, n - 1):
      s = jnp.where(rows == r, row(r), s)
    return s

  def b_blocks_spanned(self) -> int:
    """The most 128-row blocks of b a warpgroup's columns can span, over the
    column offsets its tiles can start at (multiples of gcd(tile_n, wn, 128))."""
    wn = self.cfg.wg_tile()[1]
    step = np.gcd.reduce([self.cfg.tile_n, wn, SCALE_N])
    return max((o + wn - 1) // SCALE_N + 1 for o in range(0, SCALE_N, int(step)))

  def shared_b_blocks(self, tile, tp, kb):
    """128x128 b scales of a warpgroup whose parts outnumber the blocks of b its
    columns span: one load per block (not per part), and column c's scale
    picked by a select on c's block (the parts of a 128 x 160 tile's warpgroup:
    5 of 32 columns over 2 blocks). None where each part loads its own."""
    cols = sorted({c for _, c in self.parts})
    span = self.b_blocks_spanned()
    if self.prob.recipe.per_row_b or self.prob.glu_rows or len(cols) <= span:
      return None
    first = self.b_row(tile, self.corner()[1])
    block0 = lax.div(first, i32(SCALE_N))
    last = i32(self.bs_gmem.shape[1] - 1)
    loads = [self.bs_gmem[tp.b_group, jnp.minimum(block0 + d, last), kb] for d in range(span)]

    def pick(c):
      d = lax.div(first + c, i32(SCALE_N)) - block0
      b = loads[0]
      for j in range(1, span):
        b = jnp.where(d == j, loads[j], b)
      return b
    return pick

  @property
  def partial_last_step(self) -> bool:
    """Whether the last step of a K pass holds blocks past K (k_step does not
    divide the K blocks): their factors must be 0, selected, not multiplied."""
    return self.prob.k_blocks % self.cfg.k_step != 0

  def factor(self, scales, r, c, shape):
    """The factor of part (r, c)'s block sum, from k_block_scales."""
    rows_scales, col_scales = scales
    if not col_scales:  # the carried product
      return lax.broadcast_in_dim(rows_scales[0], shape, [0])
    a = rows_scales[sorted({r for r, _ in self.chunks}).index(r)]
    b = col_scales[sorted({c for _, c in self.parts}).index(c)]
    recipe = self.prob.recipe
    return recipe.factor(recipe.row_factor(a, b), b, shape)

  def step_scales(self, tile, tp, ks, a_staged=None, b_staged=None):
    """The scales of step ks's K blocks; a_staged: their a-scales in SMEM
    ([k_step, tile_m]); b_staged: their per-row b scales ([k_step, tile_n])."""
    k_step = self.cfg.k_step
    return tuple(self.k_block_scales(tile, tp, tile.k0 + ks * k_step + j,
                                     None if a_staged is None else a_staged.at[j],
                                     None if b_staged is None else b_staged.at[j])
                 for j in range(k_step))

  # -- the K loop ----------------------------------------------------------------
  def run_pass(self, inputs, a_smem, b_smem, tile, tp, step0, acc, k_steps: int):
    """One K pass over the tile: k_steps pipeline steps from step0."""
    if self.a_window:
      return self.run_staged_pass(inputs, a_smem, b_smem, tile, tp, step0, acc, k_steps)
    if self.cfg.tma_scales:
      return self.run_tma_scales_pass(inputs, a_smem, b_smem, tile, tp, step0, acc, k_steps)

    def k_step(slot, ks, carry, fields=None):
      acc, scales = carry
      return self.consumer_k_step(a_smem.at[slot], b_smem.at[slot], tile, tp, ks, acc, scales,
                                  k_steps, fields=fields)
    carry = (acc, self.step_scales(tile, tp, self.first_step(step0)))
    return self.k_loop(inputs, step0, k_steps, k_step, carry)[0]

  def first_step(self, step0):
    """The first K step of a pass (from pipeline step step0) this warpgroup
    takes: 0, or with a K split the first whose ring step is its own (a ring
    slot always goes to the same warpgroup: stages is a multiple of consumers)."""
    stride = self.cfg.k_stride
    if stride == 1:
      return i32(0)
    return lax.rem(self.wg - lax.rem(step0, i32(stride)) + stride, i32(stride))

  def run_tma_scales_pass(self, inputs, a_smem, b_smem, tile, tp, step0, acc, k_steps: int):
    """run_pass with each slot's scales in SMEM beside its operands
    (HopperConfig.tma_scales): a step reads them at its top, before its WGMMA,
    or with step_top_overlap once its first WGMMA is issued."""
    def k_step(slot, ks, acc, after_last_wgmma=None, fields=None):
      b_staged = None if self.b_scales is None else self.b_scales.at[slot]
      scales = functools.partial(self.step_scales, tile, tp, ks, self.a_scales.at[slot],
                                 b_staged)
      return self.consumer_k_step(a_smem.at[slot], b_smem.at[slot], tile, tp, ks, acc,
                                  scales if self.cfg.step_top_overlap else scales(), k_steps,
                                  load_next=False, after_last_wgmma=after_last_wgmma,
                                  fields=fields)[0]
    return self.k_loop(inputs, step0, k_steps, k_step, acc)

  def k_loop(self, inputs, step0, k_steps: int, k_step, carry):
    """carry = k_step(slot, ks, carry) over the pass's k_steps ring steps from
    step0, each inside its slot's wait and release. Dense passes carry the slot
    index, and so do grouped ones with HopperConfig.carried_slot (the rules give
    it to ragged tilings of one chunk a warpgroup); other grouped passes (a loop
    of K passes, or a branch, around this one) take it from the step: with the
    slot carried, ptxas made the masked 4 x 256 7168x2048 kernel (then 128 x 256
    tiles) 2.9x slower, and the ragged ones of two chunks a warpgroup 3.4-4.2x
    slower. (The staged pass below carries it: measured faster on the ragged
    128 x 192 tiles.)

    With step_top_overlap a carrying pass's k_step(slot, ks, carry, hook) runs
    the hook's probe after its last WGMMA's wait (with probe_in_flight once that
    WGMMA is issued): the warpgroup tests the next slot's barrier there, without
    blocking, and waits at the next step's top only where the test failed
    (pallas/barrier_probe.py): the barrier's round trip overlaps the last
    promotion instead of following it.

    With a K split among the warpgroups (cfg.k_stride > 1) this warpgroup takes
    every k_stride-th step from first_step(step0); the slot is carried. With
    HopperConfig.desc_carry a pass also carries the next step's WGMMA descriptor
    fields (slot_fields), from which k_step(..., fields=...) issues its WGMMAs."""
    stride = self.cfg.k_stride
    carried = self.ring_fields is not None  # desc_carry: the next step's fields
    if stride > 1:
      first = self.first_step(step0)

      def strided_body(j, carry_slot):
        carry, slot = carry_slot
        with inputs.consume_slot(slot):
          carry = k_step(slot, first + j * stride, carry)
        nxt = slot + stride
        return carry, jnp.where(nxt >= inputs.num_stages, nxt - inputs.num_stages, nxt)
      count = lax.div(i32(k_steps) - first + stride - 1, i32(stride))
      slot = inputs.stage(step0 + first).index
      return lax.fori_loop(i32(0), count, strided_body, (carry, slot))[0]

    if not (self.prob.scheduler.static_passes or self.cfg.carried_slot):
      def step_body(ks, state):
        carry, fields = state
        with inputs.consume(step0 + ks) as st:
          carry = k_step(st.index, ks, carry, fields=fields)
        return carry, self.slot_fields(inputs.stage(step0 + ks + 1).index) if carried else None
      first = self.slot_fields(inputs.stage(step0).index) if carried else None
      return lax.fori_loop(i32(0), i32(k_steps), step_body, (carry, first))[0]

    # A dense (or carried_slot) pass carries its slot; with step_top_overlap the
    # non-blocking test of the next slot's barrier, made after the step's last WGMMA
    # (`ready`); with desc_carry the next step's WGMMA descriptor fields (slot_fields),
    # formed ahead of the back edge and the ring wait's branch (pallas/wgmma_desc.py).
    overlap = self.cfg.step_top_overlap

    def body(ks, state):
      carry, slot, ready, fields = state
      # (the plain loop advances its slot after the step: as measured)
      # With probe_in_flight the probe also forms the next index.
      top = (overlap or carried) and not self.cfg.probe_in_flight
      nxt = inputs.next_index(slot) if top else None
      probed = []

      def probe():  # -> (next index, its barrier tested); run where the step puts it
        n = inputs.next_index(slot) if nxt is None else nxt
        return n, inputs.full_ready(n)
      hook = ((probe, probed.append),) if overlap else ()
      with inputs.consume_slot(slot, ready if overlap else None):
        carry = k_step(slot, ks, carry, *hook, fields=fields)
      if probed:
        nxt, ready = probed[0]
      elif nxt is None:
        nxt = inputs.next_index(slot)
      return carry, nxt, ready, self.slot_fields(nxt) if carried else None
    first = inputs.stage(step0).index
    # False: a pass's first step waits (a loop value, unread, in carrying loops
    # without the overlap: as measured).
    ready = jnp.bool_(False) if overlap or carried else None
    state = (carry, first, ready, self.slot_fields(first) if carried else None)
    return lax.fori_loop(i32(0), i32(k_steps), body, state)[0]

  def run_staged_pass(self, inputs, a_smem, b_smem, tile, tp, step0, acc, k_steps: int):
    """run_pass with the a-scales staged by the producer, a window of steps at a
    time: a step's scales load at its top (SMEM, and b's L1-resident GMEM) and
    are used after its WGMMA wait. One loop over the steps (a nested loop over
    a window's few steps would be unrolled), carrying the step's place in its
    window and the window's slot."""
    window, k_step = self.a_window, self.cfg.k_step
    ring = self.scale_ring

    def body(ks, carry):
      acc, slot, i, wslot = carry

      @pl.when(i == 0)
      def _():
        ring.wait_producer(Stage(None, wslot, None))
      with inputs.consume_slot(slot):
        scales = self.step_scales(tile, tp, ks, self.a_stage.at[wslot, pl.ds(i * k_step, k_step)])
        acc, _ = self.consumer_k_step(a_smem.at[slot], b_smem.at[slot], tile, tp, ks, acc,
                                      scales, k_steps, load_next=False)
      last = i == window - 1

      @pl.when(last)
      def _():
        ring.release(Stage(None, wslot, None))
      return (acc, inputs.next_index(slot), jnp.where(last, i32(0), i + 1),
              jnp.where(last, ring.next_index(wslot), wslot))
    carry = (acc, inputs.stage(step0).index, i32(0),
             ring.stage(lax.div(step0, i32(window))).index)
    return lax.fori_loop(i32(0), i32(k_steps), body, carry)[0]

  def consumer_k_step(self, a_slot, b_slot, tile, tp, ks, acc, scales, k_steps, *,
                      load_next=True, after_last_wgmma=None, fields=None):
    """WGMMA and promotion of step ks's K blocks; returns (acc, next step's scales)
    (None unless load_next).

    The next step's scales load now and are used then. Block j's loads follow
    block j - 1's promotion, whose scales are then dead: they land in the
    loop-carried registers (loaded before, a copy into those waited for them
    ahead of the WGMMA wait). Decode (scale_product False) and per-row b scales
    (a vector of column scales per part, not one value) load a one-block step's
    at its top instead, the longest lead: loaded after the promotion, the
    weight gradient's per-row b scales made its K loop 13% slower at 16384
    tokens (RESULTS.md, 2026-11-26).

    scales may be a function returning them (step_top_overlap): it is called
    once the step's first WGMMA is issued. after_last_wgmma (if given) is a pair
    (probe, keep): keep(probe()), probe called once the step's last WGMMA is
    waited for, before that chunk's promotion, or with probe_in_flight once it
    is issued."""
    cfg = self.cfg
    cm, cn = cfg.chunk()
    pn = cfg.piece_n()
    wr, wc = self.corner()
    k_step = cfg.k_step
    next_kb = tile.k0 + jnp.minimum(ks + cfg.k_stride, k_steps - 1) * k_step
    early = k_step == 1 and (not cfg.scale_product or self.prob.recipe.per_row_b)
    next_scales = [self.k_block_scales(tile, tp, next_kb)] if early and load_next else []
    for j in range(k_step):
      if j > 0 and load_next:
        next_scales.append(self.k_block_scales(tile, tp, next_kb + j - 1))
      new_acc = []
      for r, c in self.chunks:
        rows, cols, kcols = wr + r, wc + c, pl.ds(j * K_BLOCK, K_BLOCK)

        read_scales = callable(scales)

        last = after_last_wgmma is not None and j == k_step - 1 and (r, c) == self.chunks[-1]
        hook_in_flight = last and cfg.probe_in_flight

        def mma(block_ref, rows=rows, cols=cols, kcols=kcols, read_scales=read_scales,
                hook_in_flight=hook_in_flight):
          plgpu.wgmma(block_ref, a_slot.at[pl.ds(rows, cm), kcols],
                      b_slot.at[pl.ds(cols, cn), kcols].T)
          read = scales() if read_scales else None  # while the WGMMA runs
          hooked = after_last_wgmma[0]() if hook_in_flight else None
          return block_ref[...], read, hooked

        with jax.named_scope("wgmma"):  # issue to wait (pallas/hopper.profiled)
          if fields is not None:  # descriptors carried (one-block steps)
            row = wgmma_desc.ROW_FIELD
            in_flight = wgmma_desc.issue(fields[0] + r * row, fields[1] + c * row, cm, cn)
            read = scales() if read_scales else None  # while the WGMMA runs
            hooked = after_last_wgmma[0]() if hook_in_flight else None
            block = wgmma_desc.done(in_flight)
          else:
            block, read, hooked = pl.run_scoped(mma, plgpu.ACC((cm, cn), jnp.float32))
        if read_scales:
          scales = read
        if last:
          after_last_wgmma[1](hooked if hook_in_flight else after_last_wgmma[0]())
        # promote: the f32 sum over K blocks runs outside the tensor cores, a
        # part (each within one 128-row block of b) at a time.
        for p in range(0, cn, pn):
          part = block if pn == cn else block[:, p:p + pn]
          acc_p = acc[len(new_acc)]
          new_acc.append(acc_p + part * self.factor(scales[j], r, c + p, part.shape))
      acc = tuple(new_acc)
    if not load_next:
      return acc, None
    if not early:
      next_scales.append(self.k_block_scales(tile, tp, next_kb + k_step - 1))
    # Only WGMMA (the async proxy) read this slot: releasing it to the
    # producer's TMA needs no proxy fence.
    return acc, tuple(next_scales)

  # -- the epilogue ----------------------------------------------------------------
  def pieces(self):
    """The epilogue's pieces, one (64, epi_tile_n) store each: (part, column offset)
    (a GLU's: the gate parts', each with its up part tile_n / 2 columns on)."""
    pn, epi_n = self.cfg.piece_n(), self.cfg.epi_tile_n
    out = [pi for pi, (_, c) in enumerate(self.parts)
           if not self.prob.glu_rows or c < self.cfg.tile_n // 2]
    return [(pi, e) for pi in out for e in range(0, pn, epi_n)]

  def up_part(self, pi):
    r, c = self.parts[pi]
    return self.parts.index((r, c + self.cfg.tile_n // 2))

  def window(self, tile, i):
    """(rows, columns) of piece i of this warpgroup in the tile's output group."""
    pi, e = self.pieces()[i]
    r, c = self.parts[pi]
    wr, wc = self.corner()
    return pl.ds(tile.m0 + wr + r, CHUNK_M), pl.ds(tile.n0 + wc + c + e, self.cfg.epi_tile_n)

  def epilogue(self, tile, acc, out_gmem, stores: OutputStores, c_gmem, c_ring):
    """acc (+ beta * c), rows outside the problem zeroed, cast, stored piece by
    piece; c piece i + 1 loads while piece i is computed."""
    epi_n = self.cfg.epi_tile_n
    pieces = self.pieces()
    for i, (pi, e) in enumerate(pieces):
      val = acc[pi][:, e:e + epi_n]
      if self.prob.glu_rows:
        up = acc[self.up_part(pi)][:, e:e + epi_n]
        val = gate_activation(self.prob.activation, val) * up
      rows, cols = self.window(tile, i)
      if c_ring is not None:
        if i + 1 < len(pieces):
          # Its slot was last read for piece i - 1, before that piece's store.
          c_ring.start(i + 1, c_gmem.at[0, *self.window(tile, i + 1)])
        val = val + c_ring.wait(i)[...].astype(jnp.float32) * self.prob.beta
      if self.prob.zero_rows:
        row = rows.start + plgpu.broadcasted_iota(i32, val.shape, 0, layout=plgpu.Layout.WGMMA)
        val = zero_unless(row < tile.row_end, val)
      dst = out_gmem
      if self.prob.quantize_out:
        # FP8 output: a piece is a whole 128-column part, one 1x128 group per row.
        dst, s_gmem = out_gmem
        layout = plgpu.Layout.WGMMA
        scale = quant_math.scale(quant_math.row_amax(val), self.prob.power_of_two, layout)
        # The row's reciprocal and its corrections, not a div.rn.f32 per element.
        val = quant_math.quantize_rows(val, scale, layout, power_of_two=self.prob.power_of_two,
                                       division="reciprocal")
        s_gmem.at[tile.out_group, lax.div(cols.start, i32(SCALE_N)), rows][...] = scale
      if self.prob.exact_rows:  # a ragged piece: its rows only
        stores.store_rows(i, val, lambda start, n: dst.at[tile.out_group,
                                                          pl.ds(rows.start + start, n), cols],
                          tile.row_lo - rows.start, tile.row_end - rows.start,
                          in_bounds=stores.piece_in_bounds(cols.start, dst.shape[-1],
                                                           self.cfg.tile_n))
      else:
        stores.store(i, val, dst.at[tile.out_group, rows, cols])


# ----------------------------------------------------------------------------- launch

_PROFILE = contextvars.ContextVar("jax_fp8_hopper_profile", default=None)


@contextlib.contextmanager
def profiled(directory: str, events: int = 1024):
  """Kernels traced inside record Mosaic GPU's on-device profile: per warpgroup,
  the clock (%clock) at which it enters and leaves each named phase (the ring's
  waits, each WGMMA chunk, the epilogue; at most `events` phases a warpgroup,
  later ones dropped), written as a Chrome trace to `directory` after each call.
  A diagnostic (tools/kernel_timeline.py): the records take SMEM (16 bytes a
  phase a warpgroup) and cycles."""
  token = _PROFILE.set((directory, events))
  try:
    yield
  finally:
    _PROFILE.reset(token)


def _profile_params() -> dict:
  if (profile := _PROFILE.get()) is None:
    return {}
  directory, events = profile
  return dict(profile_space=events, profile_dir=directory, profile_bounds_check=True)


def _run(cfg: HopperConfig, launch: problem.Launch):
  """Runs the kernel for a prepared launch (pallas/problem.py); returns the result."""
  if cfg.tma_scales and launch.problem.recipe.per_row_b and (cfg.tile_n * 4) % TMA_SMEM_ALIGN:
    # Each ring slot's per-row b scales are a TMA destination of tile_n floats.
    raise ValueError(f"tma_scales with per-row b scales needs tile_n a multiple of "
                     f"{TMA_SMEM_ALIGN // 4} (each slot's scales a {TMA_SMEM_ALIGN}-byte "
                     f"aligned TMA destination), got tile_n={cfg.tile_n}")
  cl = cfg.cluster_m * cfg.cluster_n
  units = launch.problem.scheduler.num_units
  grid = min((cfg.num_sms or num_sms()) // cl, units)
  a, a_scale, b, b_scale, c, meta = launch.args
  if (launch.problem.scheduler.static_units and units % grid == 0
      and cfg.chunks_per_warpgroup() >= 2):
    # Every CTA runs units / grid tiles: with that a constant, LLVM unrolled the
    # consumers' tile loop into straight-line code, where ptxas spilled the K
    # loop of warpgroups holding two chunks (128 x 256 tiles). The count is read
    # at run time instead (scheduler._Walk.units_ref). Tiles of one chunk per
    # warpgroup (decode) keep the constant: their straight-line code is faster.
    meta = dict(meta, units_ref=np.full((1,), units, np.int32))
  kernel = plgpu.kernel(
      functools.partial(_kernel, cfg=cfg, prob=launch.problem),
      out_type=launch.out_type,
      grid=(grid,),
      grid_names=("sm",),
      cluster=(cl,),
      cluster_names=("cluster",),
      num_threads=cfg.consumers + 1,
      thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=False, **_profile_params()),
  )
  return launch.finish(kernel(a, a_scale, b, b_scale, c, meta))


# A-scales of at most this many rows (batch-1 and -2 decode) are read one by one
# (few_rows_scales) instead of padded to a 64-row chunk by an XLA pad beside the
# kernel: 1.10-1.20x per call at 1 / 2 rows of 2112x7168, 7168x2048, 4096x7168; the
# kernel itself 1.0-1.1 us slower at 4 rows and 1.5x slower at 8 (each row one more
# scalar load and select a K block; H100 2026-11-28).
FEW_A_SCALE_ROWS = 2


def _tiling(cfg: HopperConfig, exact_rows: bool = False) -> problem.Tiling:
  cfg.check()
  def pad(a, a_scale, b, c, out_dtype, out_n=None):
    # The A-scales are loaded from GMEM as given, rows padded to whole chunks
    # (staged: to whole tiles, which the producer loads), or transposed for the
    # ring's TMA (a K block's scales of a tile are one contiguous box); the
    # output's columns to whole tiles of its SMEM layout, and with row-exact
    # stores (exact_rows) to whole epilogue pieces: their unswizzled one-row
    # boxes are contiguous, a copy Mosaic bounds only at the array's end, so a
    # piece's columns past the output's would land in the next row (pieces
    # wholly past it are skipped: OutputStores.store_rows).
    (tiling, _) = tiled(out_dtype, cfg.epi_tile_n)
    multiple = max(64, tiling.tiling[1], cfg.epi_tile_n if exact_rows else 0)
    return pad_for_tma(a, a_scale, b, c, tile_m=cfg.tile_m, tile_n=cfg.tile_n,
                       out_cols_multiple=multiple,
                       transpose_a_scale=cfg.tma_scales,
                       a_scale_rows_multiple=cfg.tile_m if cfg.a_scale_window else CHUNK_M,
                       few_a_scale_rows=0 if cfg.a_scale_window else FEW_A_SCALE_ROWS,
                       out_n=out_n, short_a_box=cfg.cluster_n == 1)
  return problem.Tiling(cfg.tile_m, cfg.tile_n, pad, cfg.grid_minor, cfg.group, cfg.split_k,
                        cfg.cluster_m, cfg.cluster_n, cfg.live_first)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype, config: HopperConfig,
                      b_scale_rows=SCALE_N, power_of_two_scales=False):
  """2-D blockwise FP8 matmul with the tiling `config` (sm90.py chooses one).
  out_dtype float8_e4m3fn: returns (q, scale), quantised 1x128 in the epilogue;
  every piece of the epilogue must then be a whole 128-column chunk."""
  m, k = a.shape
  reason = unsupported_reason("blockwise_fp8_dot", m, b.shape[0], k, out_dtype=out_dtype,
                              has_c=c is not None, b_scale_rows=b_scale_rows)
  if reason is not None:
    raise ValueError(reason)
  if np.dtype(out_dtype) == FP8_OUT and (config.piece_n(), config.epi_tile_n) != (128, 128):
    raise ValueError("FP8 output needs 128-column warpgroup chunks stored whole "
                     f"(chunk width and epi_tile_n 128), got {config}")
  split_blocks = pl.cdiv(k, K_BLOCK) // config.split_k
  if config.split_k > 1 and split_blocks % config.k_step:
    raise ValueError(f"k_step={config.k_step} must divide each split's {split_blocks} "
                     f"K blocks (K={k}, split_k={config.split_k})")
  return _run(config, problem.dense(_tiling(config), a, a_scale, b, b_scale, c, beta=beta,
                                    out_dtype=out_dtype, b_scale_rows=b_scale_rows,
                                    power_of_two_scales=power_of_two_scales))


def ragged_dot(a, a_scale, b, b_scale, group_sizes, *, out_dtype, config: HopperConfig):
  """Rows of a [M, K] cut into G contiguous groups, group g times b[g] [N, K]
  (b_scale [G, nb, kb]); rows past the groups are zeros. [M, N]."""
  return _run(config, problem.ragged(_tiling(config, exact_rows=True), a, a_scale, b, b_scale,
                                     group_sizes, out_dtype=out_dtype))


def masked_dot(a, a_scale, b, b_scale, masked_m, *, out_dtype, config: HopperConfig):
  """G GEMMs a[g] [M, K] x b[g] [N, K] of which only the first masked_m[g] rows
  exist (the rest are stored as zeros). [G, M, N]."""
  return _run(config, problem.masked(_tiling(config), a, a_scale, b, b_scale, masked_m,
                                     out_dtype=out_dtype))


def glu(a, a_scale, b, b_scale, *, activation: str, out_dtype, config: HopperConfig,
        power_of_two_scales=False):
  """act(a @ gate.T) * (a @ up.T) with b [2F, K] = [gate; up] (b_scale [2F/128, kb]),
  gate and up tiles side by side in one CTA; out_dtype float8_e4m3fn: (q, scale)."""
  if config.wg_split != "m" or config.tile_n != 256:
    raise ValueError("a fused GLU needs 128 x 256 (or 192 x 256) tiles whose warpgroups "
                     f"split M (each holds a gate chunk and its up chunk), got {config}")
  return _run(config, problem.dense(_tiling(config), a, a_scale, b, b_scale, None, beta=1.0,
                                    out_dtype=out_dtype, b_scale_rows=SCALE_N,
                                    power_of_two_scales=power_of_two_scales,
                                    activation=activation))
