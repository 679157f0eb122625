"""Blockwise-scaled FP8 matmul for Blackwell (sm_100a) in Pallas Mosaic GPU.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[n // 128, kb]  (+ beta * c)

Structure (the design's SM100 split; one CTA per SM, persistent over output
tiles in a static round-robin order):

  warpgroup 0, warp 0  TMA load warp: per K block, the A tile (tile_m, 128), the
                       B tile (tile_n, 128) and the A-scales of the tile rows (a
                       (1, tile_m) block of the transposed scales) into an SMEM
                       ring of `input_stages` slots (`ProducerConsumerPipeline`).
  warpgroup 0, warp 1  MMA warp (`MmaContext`): per K block, one tcgen05 MMA
                       into a fresh TMEM stage (accumulate=False) out of
                       `tmem_stages`; the MMA's completion frees the A/B slot,
                       `tcgen05_commit_arrive` signals the TMEM stage.
  warpgroup 0, warp 2  epilogue-load warp (`EpiLoadPipeline`): streams the C tile
                       in (tile_m, epi_tile_n) pieces through `c_stages` slots.
  warpgroup 1          epilogue (128 threads, `EpilogueKContext`): per K block,
                       TMEM -> registers, * a_scale[row] * b_scale, += into the
                       float32 register accumulator ("promote"), then releases
                       the TMEM stage and the input stage together. At the end of
                       a tile: + beta * c, cast, SMEM, TMA store.

With several TMEM stages the MMA of K block k+1 (and k+2 ...) runs while the
epilogue promotes block k. b_scale is one scalar per (128 columns, K block),
read from GMEM; tiles wider than 128 columns are promoted per 128-column half
(in fact per epi_tile_n-wide piece, each with its own b_scale).

Edges as in the Hopper kernel: TMA reads out of bounds give zeros (exact for
the partial last K block and partial M/N tiles), TMA writes out of bounds are
dropped, and the wrapper zero-pads what Mosaic's tiled TMA cannot take (K to
128, M and N to 8 rows and to at least one tile, the output's N to epi_tile_n).
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

from jax_fp8.pallas import common, device
from jax_fp8.pallas.common import (C_DTYPES, K_BLOCK, SCALE_N, SMEM_BYTES, pad_for_tma, tiled,
                                   unsupported_reason)
from jax_fp8.pallas.pipeline import (EpiLoadPipeline, EpilogueKContext, MmaContext,
                                     ProducerConsumerPipeline)

# K_BLOCK (common.py): one scale block of K = one pipeline step = one TMEM stage.
TMEM_COLS = 512        # f32 columns of TMEM per SM

TMA_WARP, MMA_WARP, EPI_LOAD_WARP = 0, 1, 2
CONTROL_WG, EPILOGUE_WG = 0, 1


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

  def smem_bytes(self, out_dtype, c_dtype=None) -> int:
    stage = (self.tile_m + self.tile_n) * K_BLOCK + self.tile_m * 4
    epi = 2 * self.tile_m * self.epi_tile_n * np.dtype(out_dtype).itemsize
    if c_dtype is not None:
      epi += self.c_stages * self.tile_m * self.epi_tile_n * np.dtype(c_dtype).itemsize
    return self.input_stages * stage + epi + 1024  # barriers and alignment slack


def _num_sms() -> int:
  return device.num_sms(default=148)  # B200


def default_config(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16,
                   c_dtype=None) -> BlackwellConfig:
  """128 x 128 tiles (the register accumulator is tile_n floats per thread),
  as many input stages as fit in SMEM (<= 6); untuned (no Blackwell to measure).

  Cross-compiled for sm_100a on an H100 (ptxas): 128 x 128 uses 252-255
  registers and no spills (bf16 out with epi_tile_n=64, f32 out with 32; f32
  out with 64 spills 88 B); 128 x 256 spills ~800 B (the register accumulator
  alone is 256 floats per thread), so it is not a default.
  """
  del m, n, k
  # A float32 output piece needs twice the registers and SMEM of a bf16 one.
  cfg = BlackwellConfig(epi_tile_n=32 if np.dtype(out_dtype) == np.dtype(jnp.float32) else 64)
  stages = 6
  while stages > 2 and dataclasses.replace(cfg, input_stages=stages).smem_bytes(
      out_dtype, c_dtype) > SMEM_BYTES:
    stages -= 1
  return dataclasses.replace(cfg, input_stages=stages)


def _kernel(a_gmem, as_gmem, b_gmem, bs_gmem, c_gmem, out_gmem,
            a_smem, b_smem, as_smem, out_smem, acc_tmem,
            in_full, in_empty, tmem_full, tmem_empty,
            c_smem=None, c_full=None, c_empty=None, *,
            cfg: BlackwellConfig, n: int, k_blocks: int, beta: float):
  tile_m, tile_n, epi_n = cfg.tile_m, cfg.tile_n, cfg.epi_tile_n
  m_iters, n_iters = pl.cdiv(a_gmem.shape[0], tile_m), pl.cdiv(n, tile_n)
  n_tiles = m_iters * n_iters
  n_pieces = tile_n // epi_n              # epilogue pieces of one tile
  n_scale_blocks = bs_gmem.shape[0]
  out_dtype = out_gmem.dtype
  out_slots = 2 if n_pieces % 2 == 0 else 1

  # Static round-robin over output tiles: CTA p takes tiles p, p + G, p + 2G, ...
  cta, num_ctas = lax.axis_index("sm"), lax.axis_size("sm")
  local_tiles = lax.div(n_tiles - cta + num_ctas - 1, num_ctas)
  total_k_steps = local_tiles * k_blocks

  def tile_origin(local):
    lin = cta + local * num_ctas
    return lax.div(lin, n_iters) * tile_m, lax.rem(lin, n_iters) * tile_n

  inputs = ProducerConsumerPipeline(in_full, in_empty, cfg.input_stages)
  tmem_pipe = ProducerConsumerPipeline(tmem_full, tmem_empty, cfg.tmem_stages)
  mma_ctx = MmaContext(acc_tmem, tmem_pipe, stage_cols=tile_n, total_steps=total_k_steps)
  epi_k = EpilogueKContext(mma_ctx, inputs)
  epi_load = None if c_gmem is None else EpiLoadPipeline(c_full, c_empty, cfg.c_stages)

  def for_each_k_step(body):
    """body(step, m0, n0, kb) over this CTA's (tile, K block) steps, in order."""
    def tile_body(local, _):
      m0, n0 = tile_origin(local)

      def k_body(kb, _):
        body(local * k_blocks + kb, m0, n0, kb)

      lax.fori_loop(0, k_blocks, k_body, None)

    lax.fori_loop(0, local_tiles, tile_body, None)

  wg = lax.axis_index("wg")

  @pl.when(wg == CONTROL_WG)
  def _control():
    @plgpu.warp_map
    def _per_warp(warp):

      @pl.when(warp == TMA_WARP)
      def _tma_load_warp():
        def load(step, m0, n0, kb):
          with inputs.produce(step) as st:
            bar = inputs.producer_mbar(st)
            k0 = kb * K_BLOCK
            plgpu.copy_gmem_to_smem(a_gmem.at[pl.ds(m0, tile_m), pl.ds(k0, K_BLOCK)],
                                    a_smem.at[st.index], bar)
            plgpu.copy_gmem_to_smem(b_gmem.at[pl.ds(n0, tile_n), pl.ds(k0, K_BLOCK)],
                                    b_smem.at[st.index], bar)
            plgpu.copy_gmem_to_smem(as_gmem.at[pl.ds(kb, 1), pl.ds(m0, tile_m)],
                                    as_smem.at[st.index], bar)
        for_each_k_step(load)
        inputs.drain_producer(total_k_steps)

      @pl.when(warp == MMA_WARP)
      def _mma_warp():
        with mma_ctx:
          def mma(step, m0, n0, kb):
            del m0, n0, kb
            with mma_ctx.per_k_stage(step) as (_, acc_stage):
              # The MMA's completion frees the A/B slot (one of the slot's two
              # releases; the epilogue gives the other when done with the A-scales).
              with inputs.consume(step, release=False) as st:
                plgpu.tcgen05_mma(acc_stage, a_smem.at[st.index],
                                  b_smem.at[st.index].T,  # K-major B
                                  inputs.consumer_mbar(st), accumulate=False)
          for_each_k_step(mma)

      if epi_load is not None:
        @pl.when(warp == EPI_LOAD_WARP)
        def _epilogue_load_warp():
          def tile_body(local, _):
            m0, n0 = tile_origin(local)
            for p in range(n_pieces):
              with epi_load.produce(local * n_pieces + p) as st:
                plgpu.copy_gmem_to_smem(
                    c_gmem.at[pl.ds(m0, tile_m), pl.ds(n0 + p * epi_n, epi_n)],
                    c_smem.at[st.index], epi_load.producer_mbar(st))
          lax.fori_loop(0, local_tiles, tile_body, None)
          epi_load.drain_producer(local_tiles * n_pieces)

  @pl.when(wg == EPILOGUE_WG)
  def _epilogue():
    row_layout = plgpu.Layout.TCGEN05.reduce(1)
    zero = plgpu.layout_cast(jnp.zeros((tile_m, epi_n), jnp.float32), plgpu.Layout.TCGEN05)

    def tile_body(local, _):
      m0, n0 = tile_origin(local)

      def k_body(kb, acc):
        with epi_k.per_k_stage(local * k_blocks + kb) as ks:
          s_a = plgpu.load(as_smem.at[ks.input_stage.index, 0], layout=row_layout)
          new_acc = []
          for p, acc_p in enumerate(acc):
            nb = jnp.minimum(lax.div(n0 + p * epi_n, SCALE_N), n_scale_blocks - 1)
            scale = lax.broadcast_in_dim(s_a * bs_gmem[nb, kb], acc_p.shape, [0])
            part = plgpu.async_load_tmem(ks.tmem.at[:, pl.ds(p * epi_n, epi_n)],
                                         layout=plgpu.Layout.TCGEN05)
            # promote: the f32 sum over K blocks runs outside the tensor cores.
            new_acc.append(acc_p + part * scale)
        return tuple(new_acc)

      acc = lax.fori_loop(0, k_blocks, k_body, tuple(zero for _ in range(n_pieces)))

      for p, acc_p in enumerate(acc):
        val = acc_p
        if epi_load is not None:
          with epi_load.consume(local * n_pieces + p) as st:
            c = plgpu.load(c_smem.at[st.index], layout=plgpu.Layout.TCGEN05)
            val = val + c.astype(jnp.float32) * beta
        slot = p % out_slots
        plgpu.wait_smem_to_gmem(out_slots - 1, wait_read_only=True)
        out_smem[slot] = val.astype(out_dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem.at[slot],
                                out_gmem.at[pl.ds(m0, tile_m), pl.ds(n0 + p * epi_n, epi_n)])

    lax.fori_loop(0, local_tiles, tile_body, None)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype,
                      config: BlackwellConfig | None = None):
  """2-D blockwise FP8 matmul on a B200-class GPU (or in GPU interpret mode)."""
  out_dtype = np.dtype(out_dtype)
  m, k = a.shape
  n = b.shape[0]
  reason = unsupported_reason("blockwise_fp8_dot", m, n, k, out_dtype=out_dtype,
                              has_c=c is not None)
  if reason is not None:
    raise ValueError(reason)
  if c is not None and np.dtype(c.dtype) not in C_DTYPES:
    c = c.astype(jnp.float32)
  cfg = config or default_config(m, n, k, out_dtype=out_dtype,
                                 c_dtype=None if c is None else c.dtype)
  cfg.check()
  smem = cfg.smem_bytes(out_dtype, None if c is None else c.dtype)
  if smem > SMEM_BYTES:
    raise ValueError(f"config needs ~{smem} bytes of shared memory (> {SMEM_BYTES}): lower "
                     "input_stages, c_stages, epi_tile_n or tile_n")
  k_blocks = pl.cdiv(k, K_BLOCK)

  ops = pad_for_tma(a, a_scale.astype(jnp.float32), b, c, tile_m=cfg.tile_m,
                    tile_n=cfg.tile_n, out_cols_multiple=cfg.epi_tile_n)

  tiles = pl.cdiv(ops.rows, cfg.tile_m) * pl.cdiv(n, cfg.tile_n)
  grid = min(cfg.num_ctas or _num_sms(), tiles)
  fp8 = a.dtype
  scratch = dict(
      a_smem=plgpu.SMEM((cfg.input_stages, cfg.tile_m, K_BLOCK), fp8,
                        transforms=tiled(fp8, K_BLOCK)),
      b_smem=plgpu.SMEM((cfg.input_stages, cfg.tile_n, K_BLOCK), fp8,
                        transforms=tiled(fp8, K_BLOCK)),
      as_smem=plgpu.SMEM((cfg.input_stages, 1, cfg.tile_m), jnp.float32),
      out_smem=plgpu.SMEM((2 if (cfg.tile_n // cfg.epi_tile_n) % 2 == 0 else 1,
                           cfg.tile_m, cfg.epi_tile_n), out_dtype,
                          transforms=tiled(out_dtype, cfg.epi_tile_n)),
      acc_tmem=plgpu.TMEM((cfg.tile_m, cfg.tmem_stages * cfg.tile_n), jnp.float32),
  )
  # Input ring: full = 3 TMA copies (A, B, A-scales); empty = 2 releases (the
  # MMA's completion for A/B, the epilogue for the A-scales), tensor-core ordered.
  ins = ProducerConsumerPipeline.barriers(cfg.input_stages, full_arrivals=3, empty_arrivals=2,
                                          empty_orders_tensor_core=True)
  scratch.update(in_full=ins["full"], in_empty=ins["empty"])
  tm = MmaContext.barriers(cfg.tmem_stages)
  scratch.update(tmem_full=tm["full"], tmem_empty=tm["empty"])
  if c is not None:
    cb = EpiLoadPipeline.barriers(cfg.c_stages)
    scratch.update(
        c_smem=plgpu.SMEM((cfg.c_stages, cfg.tile_m, cfg.epi_tile_n), c.dtype,
                          transforms=tiled(c.dtype, cfg.epi_tile_n)),
        c_full=cb["full"], c_empty=cb["empty"])

  kernel = plgpu.kernel(
      functools.partial(_kernel, cfg=cfg, n=n, k_blocks=k_blocks, beta=float(beta)),
      out_type=jax.ShapeDtypeStruct((ops.rows, ops.out_cols), out_dtype),
      grid=(grid,),
      grid_names=("sm",),
      num_threads=2,
      thread_name="wg",
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(approx_math=False),
  )
  out = kernel(ops.a, ops.a_scale, ops.b, b_scale.astype(jnp.float32), ops.c)
  if out.shape != (m, n):
    out = out[:m, :n]
  return out
