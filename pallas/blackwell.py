"""Blockwise-scaled FP8 matmul for Blackwell (sm_100a) in Pallas Mosaic GPU.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[<n>, kb]  (+ beta * c)

One kernel for every variant, driven like the Hopper kernel by a tile
scheduler (pallas/scheduler.py: dense, masked and ragged groups) and a scale
recipe (pallas/recipe.py: 128x128 or per-row b scales). Warp roles (the
design's SM100 split; one CTA per SM, persistent; each role walks the
scheduler itself):

  warpgroup 0, warp 0  `tma_load_warp`: per K block, the A tile (tile_m, 128),
                       the B tile (tile_n, 128) and the A-scales of the tile
                       rows (a (1, tile_m) block of the transposed scales) into
                       an SMEM ring of `input_stages` slots.
  warpgroup 0, warp 1  `mma_warp` (`MmaContext`): per K block, one tcgen05 MMA
                       into a fresh TMEM stage (accumulate=False) out of
                       `tmem_stages`; the MMA's completion frees the A/B slot,
                       `tcgen05_commit_arrive` signals the TMEM stage.
  warpgroup 0, warp 2  `epilogue_load_warp` (`EpiLoadPipeline`): streams the C
                       tile in (tile_m, epi_tile_n) pieces through `c_stages` slots.
  warpgroup 1          `epilogue` (128 threads, `EpilogueKContext`): per K block,
                       TMEM -> registers, * factor, += into the float32 register
                       accumulator ("promote"), then releases the TMEM stage and
                       the input stage together. At the end of a tile: + beta * c,
                       rows outside the problem zeroed, cast, SMEM, TMA store.

With several TMEM stages the MMA of K block k+1 (and k+2 ...) runs while the
epilogue promotes block k. A tile wider than 128 columns is promoted per
epi_tile_n-wide piece, each with its own b scale(s).

Edges as in the Hopper kernel: TMA reads out of bounds give zeros, TMA writes
out of bounds are dropped, and the wrapper zero-pads what Mosaic's tiled TMA
cannot take.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import device, problem, quant_math
from jax_fp8.pallas.common import (K_BLOCK, SCALE_N, SMEM_BYTES, copy_a_rows, gate_activation,
                                   pad_for_tma, rows_buffer_bytes, rows_buffer_shape,
                                   tiled, unsupported_reason)
from jax_fp8.pallas.pipeline import (EpiLoadPipeline, EpilogueKContext, MmaContext,
                                     OutputStores, ProducerConsumerPipeline)
from jax_fp8.pallas.recipe import zero_unless

TMEM_COLS = 512        # f32 columns of TMEM per SM
TMA_WARP, MMA_WARP, EPI_LOAD_WARP = 0, 1, 2
CONTROL_WG, EPILOGUE_WG = 0, 1
i32 = jnp.int32

__all__ = ["BlackwellConfig", "blockwise_fp8_dot", "masked_dot", "ragged_dot",
           "unsupported_reason"]


@dataclasses.dataclass(frozen=True)
class BlackwellConfig:
  """Tiling and pipeline depths of one CTA.

  tile_m x tile_n: the output tile (tile_m = 128: one TMEM lane per row, one
  epilogue thread per row). input_stages: depth of the A/B/A-scale SMEM ring.
  tmem_stages: TMEM accumulator stages (tmem_stages * tile_n <= 512 columns).
  c_stages: depth of the C (residual) ring. epi_tile_n: column width of one
  promotion piece, C piece and output store. num_ctas: CTAs of the persistent
  grid (None: the device's SM count).
  """
  tile_m: int = 128
  tile_n: int = 128
  input_stages: int = 4
  tmem_stages: int = 2
  c_stages: int = 2
  epi_tile_n: int = 64
  num_ctas: int | None = None

  def check(self):
    """Raises ValueError naming the field if this configuration cannot be built."""
    if self.tile_m != 128:
      raise ValueError(f"tile_m must be 128 (one TMEM lane per row), got {self.tile_m}")
    if self.tile_n not in (32, 64, 128, 256):
      raise ValueError(f"tile_n must be 32, 64, 128 or 256, got {self.tile_n}")
    if self.epi_tile_n < 32 or self.tile_n % self.epi_tile_n or SCALE_N % self.epi_tile_n:
      raise ValueError(f"epi_tile_n={self.epi_tile_n} must be >= 32 and divide tile_n "
                       f"({self.tile_n}) and {SCALE_N}")
    if self.tmem_stages < 1 or self.tmem_stages * self.tile_n > TMEM_COLS:
      raise ValueError(f"tmem_stages * tile_n must be in [tile_n, {TMEM_COLS}], got "
                       f"{self.tmem_stages} * {self.tile_n}")
    for field in ("input_stages", "c_stages"):
      if getattr(self, field) < 1:
        raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
    if self.num_ctas is not None and self.num_ctas < 1:
      raise ValueError(f"num_ctas must be >= 1 or None, got {self.num_ctas}")

  def out_slots(self, glu: bool = False) -> int:
    """2 store buffers where the pieces a tile stores pair up (a fused GLU stores
    half its pieces), else 1."""
    pieces = self.tile_n // self.epi_tile_n // (2 if glu else 1)
    return 2 if pieces % 2 == 0 else 1

  def smem_bytes(self, out_dtype, c_dtype=None, exact_rows: bool = False) -> int:
    """exact_rows: the ragged GEMM's row-exact stores (their buffer)."""
    stage = (self.tile_m + self.tile_n) * K_BLOCK + self.tile_m * 4
    epi = self.out_slots() * self.tile_m * self.epi_tile_n * np.dtype(out_dtype).itemsize
    if exact_rows:
      epi += rows_buffer_bytes(self.tile_m, self.epi_tile_n, out_dtype)
    if c_dtype is not None:
      epi += self.c_stages * self.tile_m * self.epi_tile_n * np.dtype(c_dtype).itemsize
    return self.input_stages * stage + epi + 1024  # barriers and alignment slack


def num_sms() -> int:
  return device.num_sms(default=148)  # B200


def _kernel(a_gmem, as_gmem, b_gmem, bs_gmem, c_gmem, meta, *outs,
            cfg: BlackwellConfig, prob: problem.Problem):
  """One CTA. Shapes: a [Ga, rows, K], as [Ga, kb, rows] (transposed), b [Gb, N', K],
  bs [Gb, nb, kb] or (per-row b scales) [Gb, kb, N'], c [1, rows, cols] or None; outs:
  out [Go, rows, cols] (FP8 output: and its scales [Go, cols / 128, rows'])."""
  out_gmem = outs[0] if len(outs) == 1 else outs
  tile_m, tile_n, epi_n = cfg.tile_m, cfg.tile_n, cfg.epi_tile_n
  k_blocks = prob.k_blocks
  n_pieces = tile_n // epi_n
  sched = dataclasses.replace(prob.scheduler, **meta)
  fp8 = a_gmem.dtype
  out_dtype = (out_gmem[0] if prob.quantize_out else out_gmem).dtype
  scratch = dict(
      a_smem=plgpu.SMEM((cfg.input_stages, tile_m, K_BLOCK), fp8, transforms=tiled(fp8, K_BLOCK)),
      b_smem=plgpu.SMEM((cfg.input_stages, tile_n, K_BLOCK), fp8, transforms=tiled(fp8, K_BLOCK)),
      as_smem=plgpu.SMEM((cfg.input_stages, 1, tile_m), jnp.float32),
      out_smem=plgpu.SMEM((cfg.out_slots(glu=bool(prob.glu_rows)), tile_m, epi_n), out_dtype,
                          transforms=tiled(out_dtype, epi_n)),
      acc_tmem=plgpu.TMEM((tile_m, cfg.tmem_stages * tile_n), jnp.float32),
      # Input ring: full = 3 TMA copies (A, B, A-scales); empty = 2 releases (the
      # MMA's completion for A/B, the epilogue for the A-scales), tensor-core ordered.
      inputs=ProducerConsumerPipeline.barriers(cfg.input_stages,
                                               full_arrivals=4 if prob.glu_rows else 3,
                                               empty_arrivals=2, empty_orders_tensor_core=True),
      tmem=MmaContext.barriers(cfg.tmem_stages),
  )
  if prob.exact_rows:  # a piece's rows, sliced anywhere by the partial stores
    scratch["rows_smem"] = plgpu.SMEM(rows_buffer_shape(tile_m, epi_n, out_dtype), out_dtype)
  if c_gmem is not None:
    scratch.update(c_smem=plgpu.SMEM((cfg.c_stages, tile_m, epi_n), c_gmem.dtype,
                                     transforms=tiled(c_gmem.dtype, epi_n)),
                   c_bars=EpiLoadPipeline.barriers(cfg.c_stages))

  @functools.partial(pl.run_scoped, **scratch, collective_axes="wg")
  def _scope(a_smem, b_smem, as_smem, out_smem, acc_tmem, inputs, tmem, c_smem=None,
             c_bars=None, rows_smem=None):
    cta, num_ctas = lax.axis_index("sm"), lax.axis_size("sm")
    local_units = sched.local_units(cta, num_ctas)
    total_steps = sched.steps(cta, num_ctas, k_blocks)
    ring = ProducerConsumerPipeline(inputs["full"], inputs["empty"], cfg.input_stages)
    tmem_pipe = ProducerConsumerPipeline(tmem["full"], tmem["empty"], cfg.tmem_stages)
    mma_ctx = MmaContext(acc_tmem, tmem_pipe, stage_cols=tile_n, total_steps=total_steps)
    epi_k = EpilogueKContext(mma_ctx, ring)
    epi_load = (None if c_gmem is None
                else EpiLoadPipeline(c_bars["full"], c_bars["empty"], cfg.c_stages))

    def tile_of(i):
      return sched.tile(cta + i * num_ctas, i32(0))

    def for_each_k_block(body):
      """body(step, tile, tile_pass, kb) over this CTA's K blocks, in order."""
      def tile_body(i, step):
        tile = tile_of(i)

        def pass_body(p, step):
          tp = sched.tile_pass(tile, p)

          def k_body(kb, _):
            body(step + kb, tile, tp, tile.k0 + kb)
          lax.fori_loop(i32(0), i32(k_blocks), k_body, None)
          return step + i32(k_blocks)
        if sched.static_passes:
          return pass_body(i32(0), step)
        return lax.fori_loop(i32(0), tile.passes, pass_body, step)
      lax.fori_loop(i32(0), local_units, tile_body, i32(0))

    def tma_load_warp():
      with ring.producer(total_steps) as produce:
        def load(step, tile, tp, kb):
          with produce(step) as st:
            bar = ring.producer_mbar(st)
            kcols = pl.ds(kb * K_BLOCK, K_BLOCK)
            copy_a_rows(a_gmem, tile.a_group, tile.m0, kcols, a_smem.at[st.index], bar,
                        tile_m=tile_m)
            if prob.glu_rows:  # gate rows beside the same up rows
              half = tile_n // 2
              for j, row0 in enumerate((tile.n0, prob.glu_rows + tile.n0)):
                plgpu.copy_gmem_to_smem(b_gmem.at[tp.b_group, pl.ds(row0, half), kcols],
                                        b_smem.at[st.index, pl.ds(j * half, half)], bar)
            else:
              plgpu.copy_gmem_to_smem(b_gmem.at[tp.b_group, pl.ds(tile.n0, tile_n), kcols],
                                      b_smem.at[st.index], bar)
            plgpu.copy_gmem_to_smem(as_gmem.at[tile.a_group, pl.ds(kb, 1), pl.ds(tile.m0, tile_m)],
                                    as_smem.at[st.index], bar)
        for_each_k_block(load)

    def mma_warp():
      with mma_ctx:
        def mma(step, tile, tp, kb):
          del tile, tp, kb
          with mma_ctx.per_k_stage(step) as (_, acc_stage):
            # The MMA's completion frees the A/B slot (one of the slot's two
            # releases; the epilogue gives the other when done with the A-scales).
            with ring.consume(step, release=False) as st:
              plgpu.tcgen05_mma(acc_stage, a_smem.at[st.index], b_smem.at[st.index].T,
                                ring.consumer_mbar(st), accumulate=False)
        for_each_k_block(mma)

    def epilogue_load_warp():
      with epi_load.producer(local_units * n_pieces) as produce:
        def tile_body(i, _):
          tile = tile_of(i)
          for p in range(n_pieces):
            with produce(i * n_pieces + p) as st:
              plgpu.copy_gmem_to_smem(
                  c_gmem.at[0, pl.ds(tile.m0, tile_m), pl.ds(tile.n0 + p * epi_n, epi_n)],
                  c_smem.at[st.index], epi_load.producer_mbar(st))
        lax.fori_loop(i32(0), local_units, tile_body, None)

    wg = lax.axis_index("wg")

    @pl.when(wg == CONTROL_WG)
    def _control():
      @plgpu.warp_map
      def _per_warp(warp):
        pl.when(warp == TMA_WARP)(tma_load_warp)
        pl.when(warp == MMA_WARP)(mma_warp)
        if epi_load is not None:
          pl.when(warp == EPI_LOAD_WARP)(epilogue_load_warp)

    @pl.when(wg == EPILOGUE_WG)
    def _epilogue():
      epilogue(cfg, prob, sched, tile_of, local_units, epi_k, as_smem, bs_gmem, out_gmem,
               OutputStores(out_smem, rows_smem), epi_load, c_smem)


def epilogue(cfg, prob, sched, tile_of, local_units, epi_k, as_smem, bs_gmem, out_gmem,
             stores, epi_load, c_smem):
  """The epilogue warpgroup: per K block, promote every piece of the tile; at the
  tile's end, + beta * c, rows outside the problem zeroed, cast and store."""
  tile_m, epi_n, k_blocks = cfg.tile_m, cfg.epi_tile_n, prob.k_blocks
  n_pieces = cfg.tile_n // epi_n
  recipe = prob.recipe
  layout = plgpu.Layout.TCGEN05
  row_layout, col_layout = layout.reduce(1), layout.reduce(0)
  zero = plgpu.layout_cast(jnp.zeros((tile_m, epi_n), jnp.float32), layout)

  def promote_pass(tile, tp, step0, acc):
    def k_body(kb, acc):
      with epi_k.per_k_stage(step0 + kb) as ks:
        s_a = plgpu.load(as_smem.at[ks.input_stage.index, 0], layout=row_layout)
        new_acc = []
        for p, acc_p in enumerate(acc):
          b = recipe.load_b(bs_gmem, tp.b_group, tile.k0 + kb, b_row(cfg, prob, tile, p * epi_n),
                            epi_n,
                            col_layout)
          part = plgpu.async_load_tmem(ks.tmem.at[:, pl.ds(p * epi_n, epi_n)], layout=layout)
          factor = recipe.factor(recipe.row_factor(s_a, b), b, acc_p.shape)
          # promote: the f32 sum over K blocks runs outside the tensor cores.
          new_acc.append(acc_p + part * factor)
      return tuple(new_acc)
    return lax.fori_loop(i32(0), i32(k_blocks), k_body, acc)

  def tile_body(i, step):
    tile = tile_of(i)
    acc = tuple(zero for _ in range(n_pieces))

    def pass_body(p, carry):
      step, acc = carry
      return step + i32(k_blocks), promote_pass(tile, sched.tile_pass(tile, p), step, acc)
    if sched.static_passes:
      step, acc = pass_body(i32(0), (step, acc))
    else:
      step, acc = lax.fori_loop(i32(0), tile.passes, pass_body, (step, acc))

    vals = []
    for p, val in enumerate(acc):
      if epi_load is not None:
        with epi_load.consume(i * n_pieces + p) as st:
          c = plgpu.load(c_smem.at[st.index], layout=layout)
          val = val + c.astype(jnp.float32) * prob.beta
      if prob.zero_rows:
        rows = tile.m0 + plgpu.broadcasted_iota(i32, val.shape, 0, layout=layout)
        val = zero_unless(rows < tile.row_end, val)
      vals.append(val)
    if prob.glu_rows:  # the gate pieces, each times its up piece tile_n / 2 columns on
      half = len(vals) // 2
      vals = [gate_activation(prob.activation, g) * u for g, u in zip(vals[:half], vals[half:])]
    dst = out_gmem
    if prob.quantize_out:
      dst, s_gmem = out_gmem

      def store_scale(group, scale):
        nb = lax.div(tile.n0, i32(SCALE_N)) + group
        s_gmem.at[tile.out_group, nb, pl.ds(tile.m0, tile_m)][...] = scale
      vals = quantize_pieces(vals, epi_n, prob.power_of_two, store_scale)
    for p, val in enumerate(vals):
      cols = pl.ds(tile.n0 + p * epi_n, epi_n)
      if prob.exact_rows:  # a ragged piece: its rows only
        stores.store_rows(p, val, lambda start, n: dst.at[tile.out_group,
                                                          pl.ds(tile.m0 + start, n), cols],
                          tile.row_lo - tile.m0, tile.row_end - tile.m0,
                          in_bounds=stores.piece_in_bounds(cols.start, dst.shape[-1],
                                                           cfg.tile_n))
      else:
        stores.store(p, val, dst.at[tile.out_group, pl.ds(tile.m0, tile_m), cols])
    return step

  lax.fori_loop(i32(0), local_units, tile_body, i32(0))
  OutputStores.finish()


def b_row(cfg: BlackwellConfig, prob: problem.Problem, tile, col: int):
  """The row of b behind column `col` of the CTA's B tile (a GLU's B tile is
  tile_n / 2 gate rows beside the same up rows)."""
  half = cfg.tile_n // 2
  if not prob.glu_rows or col < half:
    return tile.n0 + col
  return prob.glu_rows + tile.n0 + col - half


def quantize_pieces(vals, epi_n: int, power_of_two: bool, store_scale):
  """FP8 output: the pieces of each 128-column group (one thread per row holds
  a row's values) quantised with the group's row scales; store_scale(group,
  scales) writes the scales. Returns the e4m3 pieces."""
  per_group = SCALE_N // epi_n
  out = []
  for g in range(0, len(vals), per_group):
    group = vals[g:g + per_group]
    # The max of the pieces' magnitude bits: NaN-propagating (a float max is not).
    bits = functools.reduce(jnp.maximum, [jnp.max(quant_math.magnitude_bits(v), axis=-1)
                                          for v in group])
    scale = quant_math.scale(quant_math.as_amax(bits, jnp.float32), power_of_two,
                             plgpu.Layout.TCGEN05)
    store_scale(g // per_group, scale)
    out += [quant_math.quantize_rows(v, scale, plgpu.Layout.TCGEN05, power_of_two=power_of_two,
                                     division="reciprocal") for v in group]
  return out


def _run(cfg: BlackwellConfig, launch: problem.Launch):
  """Runs the kernel for a prepared launch (pallas/problem.py); returns the result."""
  c = launch.args[4]
  smem = cfg.smem_bytes(launch.out_dtype, None if c is None else c.dtype,
                        launch.problem.exact_rows)
  if smem > SMEM_BYTES:
    raise ValueError(f"config needs ~{smem} bytes of shared memory (> {SMEM_BYTES}): lower "
                     "input_stages, c_stages, epi_tile_n or tile_n")
  grid = min(cfg.num_ctas or num_sms(), launch.problem.scheduler.num_units)
  kernel = plgpu.kernel(
      functools.partial(_kernel, cfg=cfg, prob=launch.problem),
      out_type=launch.out_type,
      grid=(grid,),
      grid_names=("sm",),
      num_threads=2,
      thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=False),
  )
  return launch.finish(kernel(*launch.args))


def _tiling(cfg: BlackwellConfig) -> problem.Tiling:
  cfg.check()
  # The A-scales go through the TMA ring transposed: a tile's rows are one box.
  def pad(a, a_scale, b, c, out_dtype, out_n=None):
    del out_dtype  # every output dtype's pieces are epi_tile_n columns
    return pad_for_tma(a, a_scale.astype(jnp.float32), b, c, tile_m=cfg.tile_m,
                       tile_n=cfg.tile_n, out_cols_multiple=cfg.epi_tile_n, out_n=out_n,
                       short_a_box=True)
  return problem.Tiling(cfg.tile_m, cfg.tile_n, pad)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype, config: BlackwellConfig,
                      b_scale_rows=SCALE_N, power_of_two_scales=False):
  """2-D blockwise FP8 matmul with the tiling `config` (sm100.py chooses one).
  out_dtype float8_e4m3fn: returns (q, scale), quantised 1x128 in the epilogue."""
  m, k = a.shape
  reason = unsupported_reason("blockwise_fp8_dot", m, b.shape[0], k, out_dtype=out_dtype,
                              has_c=c is not None, b_scale_rows=b_scale_rows)
  if reason is not None:
    raise ValueError(reason)
  return _run(config, problem.dense(_tiling(config), a, a_scale, b, b_scale, c, beta=beta,
                                    out_dtype=out_dtype, b_scale_rows=b_scale_rows,
                                    power_of_two_scales=power_of_two_scales))


def ragged_dot(a, a_scale, b, b_scale, group_sizes, *, out_dtype, config: BlackwellConfig):
  """Rows of a [M, K] cut into G contiguous groups, group g times b[g] [N, K]
  (b_scale [G, nb, kb]); rows past the groups are zeros. [M, N]."""
  return _run(config, problem.ragged(_tiling(config), a, a_scale, b, b_scale, group_sizes,
                                     out_dtype=out_dtype))


def masked_dot(a, a_scale, b, b_scale, masked_m, *, out_dtype, config: BlackwellConfig):
  """G GEMMs a[g] [M, K] x b[g] [N, K] of which only the first masked_m[g] rows
  exist (the rest are stored as zeros). [G, M, N]."""
  return _run(config, problem.masked(_tiling(config), a, a_scale, b, b_scale, masked_m,
                                     out_dtype=out_dtype))


def glu(a, a_scale, b, b_scale, *, activation: str, out_dtype, config: BlackwellConfig,
        power_of_two_scales=False):
  """act(a @ gate.T) * (a @ up.T) with b [2F, K] = [gate; up] (b_scale [2F/128, kb]),
  gate and up tiles side by side in one CTA; out_dtype float8_e4m3fn: (q, scale)."""
  if config.tile_n != 256:
    raise ValueError(f"a fused GLU needs tile_n=256 (128 gate and 128 up columns), got {config}")
  return _run(config, problem.dense(_tiling(config), a, a_scale, b, b_scale, None, beta=1.0,
                                    out_dtype=out_dtype, b_scale_rows=SCALE_N,
                                    power_of_two_scales=power_of_two_scales,
                                    activation=activation))
