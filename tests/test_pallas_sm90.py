"""backend="pallas_sm90": the Hopper Pallas Mosaic GPU kernel (pallas/hopper.py).

CPU (CI): the kernel runs in GPU interpret mode with race detection; kernel
outputs start as NaN there (uninitialized_memory="nan"), so an unwritten tile
fails. Small tiles and a persistent grid of 2-4 CTAs make each CTA walk
several output tiles. Lowering for CUDA is checked without a GPU.
GPU: correctness at the DeepSeek-V3 shapes and odd shapes, and determinism;
skipped without a Hopper GPU.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
import numpy as np
import pytest
from conftest import requires_gpu

import jax_fp8
from jax_fp8 import testing
from jax_fp8.pallas import hopper, hopper_cost, hopper_tiling, pipeline

FP8 = jnp.float8_e4m3fn
BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float32)

# 2 consumer warpgroups, each a 64 x 64 piece of a 64 x 128 tile; 2 stages so
# that K > 256 reuses pipeline slots; 2 CTAs so that each walks several tiles.
SMALL = hopper.HopperConfig(tile_m=64, tile_n=128, wg_split="n", stages=2, num_sms=2)
# Warpgroups split M (each 64 x 128).
SPLIT_M = hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=2, num_sms=2)
# The large-M default structure: 128 x 256 tiles, each warpgroup 128 x 128 in two
# 64-row chunks, 4 stages, grouped tile order.
DEFAULT_LARGE = dataclasses.replace(hopper.HopperConfig(), num_sms=2)
# Chained per-tile pipelines (the producer runs on into the next tile): 2 stages
# dividing the K blocks, several tiles per CTA, CTAs with unequal tile counts.
CHAIN = hopper.HopperConfig(tile_m=64, tile_n=64, wg_split="n", stages=2, num_sms=2,
                            epi_tile_n=32)
CHAIN_3 = dataclasses.replace(SPLIT_M, stages=3)
# Three consumer warpgroups, each 64 x 128 of a 192 x 128 tile.
THREE_WG = hopper.HopperConfig(tile_m=192, tile_n=128, wg_split="m", consumers=3, stages=2,
                               num_sms=2)
# The narrowest decode tile: 64 x 32, each warpgroup 64 x 16 (WGMMA n=16), 16-column
# epilogue stores; 3 CTAs over 4 N tiles.
NARROW = hopper.HopperConfig(tile_m=64, tile_n=32, wg_split="n", stages=3, num_sms=3,
                             epi_tile_n=16, grid_minor="m")
# Three consumer warpgroups side by side (the wide decode tile): 64 x 192, each 64
# columns; a 192-column tile straddles 128-column b_scale blocks, its warpgroups do not.
WIDE_3 = hopper.HopperConfig(tile_m=64, tile_n=192, wg_split="n", consumers=3, stages=2,
                             num_sms=2, grid_minor="m")
# Split-K: two K ranges per output tile, each writing float32 partials; 16 units
# of work on 3 CTAs, chained (2 stages divide each split's 2 K blocks).
SPLIT_K = dataclasses.replace(CHAIN, num_sms=3, split_k=2)
# K split among the warpgroups (the decode rules' K_SPLIT_DECODE_TILES): each holds the
# whole 64 x 64 tile and every other K step; the second hands its sums to the first
# through SMEM, tile after tile (3 CTAs over several tiles each).
K_SPLIT = hopper.HopperConfig(tile_m=64, tile_n=64, wg_split="k", stages=2, num_sms=3,
                              epi_tile_n=32, scale_product=False, grid_minor="m")
K_SPLIT_3 = dataclasses.replace(K_SPLIT, consumers=3, stages=3)


def _interpret(fn, *args):
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    return jax.block_until_ready(jax.jit(fn)(*args))


def _run_kernel(m, n, k, cfg, *, with_c, out_dtype, beta=1.0, c_dtype=jnp.float32, seed=0):
  ops = testing.random_operands(seed, m, n, k, with_c=with_c, c_dtype=c_dtype)

  def fn(a, sa, b, sb, c):
    return hopper.blockwise_fp8_dot(a, sa, b, sb, c, beta=beta, out_dtype=out_dtype, config=cfg)

  out = _interpret(fn, *ops.args())
  assert out.shape == (m, n)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=beta), out_dtype)


@pytest.mark.parametrize("m,n,k,cfg,with_c,out_dtype,beta,c_dtype", [
    # unaligned M and N, partial last K block (300 = 2*128 + 44), several tiles per CTA
    (70, 200, 300, SMALL, True, F32, 0.5, jnp.float32),
    (70, 200, 300, SMALL, False, BF16, 1.0, None),
    # decode-sized M, K not a multiple of 16 (padded), N below one tile
    (7, 100, 488, SMALL, True, BF16, -1.5, jnp.bfloat16),
    (200, 200, 200, SPLIT_M, True, BF16, 2.0, jnp.float32),
    (130, 136, 384, SPLIT_M, False, F32, 1.0, None),
    (256, 512, 256, DEFAULT_LARGE, False, BF16, 1.0, None),
    (136, 264, 200, DEFAULT_LARGE, True, F32, 0.25, jnp.float32),
    (200, 150, 512, CHAIN, True, F32, 0.5, jnp.float32),
    (130, 300, 500, CHAIN, False, BF16, 1.0, None),
    (130, 200, 384, CHAIN_3, True, BF16, -1.0, jnp.bfloat16),
    # 256-byte epilogue rows (the short-K default): bf16 out 128 wide, f32 out 64 wide
    (136, 264, 256, dataclasses.replace(DEFAULT_LARGE, stages=2, epi_tile_n=128), True, BF16,
     0.5, jnp.bfloat16),
    (70, 200, 300, dataclasses.replace(SMALL, epi_tile_n=64), True, F32, 1.0, jnp.float32),
    (200, 300, 300, THREE_WG, True, F32, 0.5, jnp.float32),
    (400, 260, 512, THREE_WG, False, BF16, 1.0, None),  # chained: 9 tiles on 2 CTAs
    # the dense rules' form over long K loops: 4 stages, scales in the ring, step top
    # overlapped (descriptors carried on the GPU; interpret mode runs Pallas's wgmma)
    (400, 260, 1000, dataclasses.replace(THREE_WG, stages=4, tma_scales=True,
                                         step_top_overlap=True, desc_carry=True),
     False, BF16, 1.0, None),
    (400, 260, 1000, dataclasses.replace(THREE_WG, stages=4, tma_scales=True,
                                         step_top_overlap=True, desc_carry=True,
                                         probe_in_flight=True),
     True, F32, 0.5, jnp.float32),
    (70, 100, 300, NARROW, True, F32, 0.5, jnp.float32),
    (5, 128, 640, NARROW, False, BF16, 1.0, None),
    # 2-CTA clusters sharing B by TMA multicast; 3 M tiles: one CTA runs past M
    (130, 300, 300, dataclasses.replace(SMALL, num_sms=4, cluster_m=2), True, F32, 0.5, jnp.float32),
    # 2-CTA clusters sharing A (side by side); 5 N tiles: one CTA runs past N
    (130, 300, 500, dataclasses.replace(CHAIN, num_sms=4, cluster_n=2), True, F32, 0.5,
     jnp.float32),
    (7, 300, 512, dataclasses.replace(CHAIN, num_sms=4, cluster_n=2, split_k=2), False, BF16,
     1.0, None),
    # split-K: a partial last K block in the last split; c added in the reduction
    (70, 200, 500, SPLIT_K, True, BF16, 0.5, jnp.bfloat16),
    (7, 100, 488, dataclasses.replace(NARROW, split_k=4), False, F32, 1.0, None),
    # two K blocks per pipeline step: 7 blocks (the last partial), so the last
    # step's second block lies past K; two chunks per warpgroup (scales per row/column)
    (136, 264, 850, dataclasses.replace(DEFAULT_LARGE, stages=2, k_step=2), True, F32, 0.5,
     jnp.float32),
    # wide chunks: 128 x 192 tiles split by rows (one 64 x 192 WGMMA per warpgroup,
    # promoted in 64-column pieces; the second column tile starts mid-way through a
    # 128-row block of b), N and K partial, c; then two-block steps past K
    (136, 400, 850, dataclasses.replace(DEFAULT_LARGE, tile_n=192, wg_split="m", stages=2,
                                        wide_chunks=True), True, F32, 0.5, jnp.float32),
    (70, 330, 850, dataclasses.replace(DEFAULT_LARGE, tile_n=192, wg_split="m", stages=2,
                                       k_step=2, wide_chunks=True, epi_tile_n=32), True, BF16,
     -1.0, jnp.bfloat16),
    # 128 x 160 wide tiles (five 32-column pieces over two 128-row blocks of b, one
    # b-scale load per block): tiles at all four offsets within b's blocks (N = 680)
    (136, 680, 850, dataclasses.replace(DEFAULT_LARGE, tile_n=160, wg_split="m", stages=2,
                                        wide_chunks=True, epi_tile_n=32), True, F32, 0.5,
     jnp.float32),
    # 128 x 192 split by columns: each warpgroup's 96 columns in three 32-column pieces
    (70, 400, 300, dataclasses.replace(DEFAULT_LARGE, tile_n=192, wg_split="n", stages=2,
                                       wide_chunks=True, epi_tile_n=32), False, BF16, 1.0, None),
    # a 64 x 128 wide chunk per warpgroup of 64 x 256 tiles split by columns
    (70, 300, 300, dataclasses.replace(DEFAULT_LARGE, tile_m=64, stages=2, wide_chunks=True),
     False, BF16, 1.0, None),
    # chained: 4 K blocks = 2 steps on a 2-deep ring, 8 tiles on 2 CTAs
    (200, 150, 512, dataclasses.replace(CHAIN, k_step=2), False, BF16, 1.0, None),
    # with split-K: each split's 4 blocks in 2 steps (the last block partial); c in
    # the reduction
    (70, 200, 1000, dataclasses.replace(SPLIT_K, k_step=2), True, F32, 0.5, jnp.float32),
    # 64 x 192 tiles: 2 x 3 tiles (N partial), c; two-block steps past K, bf16 c
    (70, 400, 300, WIDE_3, True, F32, 0.5, jnp.float32),
    (7, 450, 850, dataclasses.replace(WIDE_3, k_step=2), True, BF16, -1.0, jnp.bfloat16),
    # one-chunk warpgroups multiplying the scales at promotion (the decode default):
    # one- and two-block steps, the last step's second block past K; with split-K
    (70, 200, 300, dataclasses.replace(NARROW, scale_product=False), True, F32, 0.5,
     jnp.float32),
    (7, 200, 850, dataclasses.replace(SMALL, tile_n=64, epi_tile_n=32, k_step=2,
                                      scale_product=False), True, BF16, -1.0, jnp.bfloat16),
    (70, 100, 1024, dataclasses.replace(NARROW, split_k=2, k_step=2, scale_product=False),
     False, F32, 1.0, None),
    # a-scales staged by the producer in windows of K steps (SMEM, transposed): two
    # 4-step windows per pass, several tiles per CTA (the window ring runs across
    # tiles); then 128 x 256 tiles (two chunk rows per warpgroup), two-block steps,
    # the last step's second block past K (its staged column clamped, factor 0)
    (200, 330, 1024, dataclasses.replace(DEFAULT_LARGE, tile_n=192, wg_split="m", stages=3,
                                         wide_chunks=True, a_scale_window=4), True, F32, 0.5,
     jnp.float32),
    (136, 264, 850, dataclasses.replace(DEFAULT_LARGE, stages=2, k_step=2, a_scale_window=2),
     False, BF16, 1.0, None),
    # 256-row tiles (two staged rows per producer thread), one 13-step window per pass
    (300, 200, 1664, dataclasses.replace(DEFAULT_LARGE, tile_m=256, tile_n=128, wg_split="m",
                                         stages=2, a_scale_window=16), True, BF16, -1.0,
     jnp.bfloat16),
    # every slot's scales brought by its TMA (tma_scales, a-scales transposed): 128 x 256
    # tiles chained over 3 tiles per CTA with c (N, K partial); wide 128 x 192 tiles;
    # 64-row tiles in B-sharing pairs (each CTA brings its own a-scales); a K split
    (300, 520, 850, dataclasses.replace(DEFAULT_LARGE, stages=2, tma_scales=True), True, BF16,
     -1.0, jnp.bfloat16),
    (136, 400, 850, dataclasses.replace(DEFAULT_LARGE, tile_n=192, wg_split="m", stages=3,
                                        wide_chunks=True, tma_scales=True), True, F32, 0.5,
     jnp.float32),
    (200, 150, 512, dataclasses.replace(CHAIN, num_sms=4, cluster_m=2, tma_scales=True), False,
     F32, 1.0, None),
    (70, 200, 1000, dataclasses.replace(SPLIT_K, tma_scales=True), True, F32, 0.5, jnp.float32),
    # the rules' long-K tiling at large M: 256 x 128 tiles split by rows in pairs sharing
    # A (the second row tile partial, 3 column tiles: one CTA of a pair past N), the
    # scales in the ring, two tiles per cluster, the step top overlapped (its scales read
    # after the first WGMMA's issue; interpret mode has no barrier test: every step waits)
    (300, 330, 850, dataclasses.replace(DEFAULT_LARGE, tile_m=256, tile_n=128, wg_split="m",
                                        stages=2, num_sms=4, cluster_n=2, tma_scales=True,
                                        producer_registers=72, step_top_overlap=True), True,
     BF16, -1.0, jnp.bfloat16),
    # ... alone (SCALED_RING_TILES, 1024-2047 rows), over a partial row tile, with a
    # float32 residual
    (300, 330, 850, dataclasses.replace(DEFAULT_LARGE, tile_m=256, tile_n=128, wg_split="m",
                                        stages=3, num_sms=3, tma_scales=True,
                                        producer_registers=72, step_top_overlap=True), True,
     F32, 0.5, jnp.float32),
    # ... on 128 x 256 tiles side by side (two chunks per warpgroup, the rules' short-K
    # tiling at large M), with a residual
    (200, 330, 850, dataclasses.replace(DEFAULT_LARGE, stages=2, num_sms=3, tma_scales=True,
                                        producer_registers=72, step_top_overlap=True), True,
     F32, 0.5, jnp.float32),
    # ... and with one wide chunk per warpgroup (its first WGMMA is its last)
    (136, 400, 850, dataclasses.replace(DEFAULT_LARGE, tile_n=192, wg_split="m", stages=3,
                                        wide_chunks=True, tma_scales=True,
                                        step_top_overlap=True), False, BF16, 1.0, None),
    # one producer warp filling the ring (producer_warp; the rules' 128 x 160, 128 x 192
    # and 192 x 128 tiles), its proxy fence before it refills a slot's scales: 128 x 160
    # over all four offsets in b's blocks with c, and 192 x 128 of three consumers
    (200, 680, 850, dataclasses.replace(DEFAULT_LARGE, tile_n=160, wg_split="m", stages=3,
                                        epi_tile_n=32, wide_chunks=True, tma_scales=True,
                                        step_top_overlap=True, producer_warp=True), True,
     BF16, -1.0, jnp.bfloat16),
    (400, 300, 850, dataclasses.replace(DEFAULT_LARGE, tile_m=192, tile_n=128, wg_split="m",
                                        consumers=3, stages=3, tma_scales=True,
                                        step_top_overlap=True, producer_warp=True), False,
     F32, 1.0, None),
    # ... issuing the multicast copies of pairs: 256 x 128 tiles sharing A (the rules'
    # pairs over N >= 7168; one CTA of a pair past N), and 64 x 128 tiles sharing B
    (300, 330, 850, dataclasses.replace(DEFAULT_LARGE, tile_m=256, tile_n=128, wg_split="m",
                                        stages=2, num_sms=4, cluster_n=2, tma_scales=True,
                                        producer_registers=72, step_top_overlap=True,
                                        producer_warp=True), True, BF16, -1.0, jnp.bfloat16),
    (130, 300, 300, dataclasses.replace(SMALL, num_sms=4, cluster_m=2, producer_warp=True),
     True, F32, 0.5, jnp.float32),
    # K split among the warpgroups: 3 K blocks (the last partial) of which the first
    # warpgroup takes 2; two-block steps, the last one's second block past K; three
    # warpgroups over 8 blocks (3, 3, 2 steps), and over one (two hand over zeros);
    # 128-row tiles (two chunk rows each); a K split across CTAs as well
    (70, 200, 300, K_SPLIT, True, F32, 0.5, jnp.float32),
    (7, 200, 850, dataclasses.replace(K_SPLIT, k_step=2), True, BF16, -1.0, jnp.bfloat16),
    (130, 100, 1000, K_SPLIT_3, True, BF16, 2.0, jnp.float32),
    (70, 100, 128, K_SPLIT_3, False, F32, 1.0, None),
    (130, 100, 1000, dataclasses.replace(K_SPLIT, tile_m=128, stages=4), True, BF16, -1.0,
     jnp.bfloat16),
    (7, 100, 1024, dataclasses.replace(K_SPLIT, split_k=2, k_step=2), True, F32, 0.5,
     jnp.float32),
    (70, 200, 300, dataclasses.replace(K_SPLIT, tma_scales=True), False, BF16, 1.0, None),
    # ... in CTA pairs sharing B (3 row tiles: one CTA runs past M) or A
    (130, 300, 500, dataclasses.replace(K_SPLIT, num_sms=4, cluster_m=2), True, F32, 0.5,
     jnp.float32),
    (130, 300, 500, dataclasses.replace(K_SPLIT, num_sms=4, cluster_n=2), False, BF16, 1.0,
     None),
    # ... in 64 x 16 tiles (WGMMA n=16, 16-column stores) of three warpgroups
    (7, 100, 1024, dataclasses.replace(K_SPLIT_3, tile_n=16, epi_tile_n=16, k_step=2), True,
     BF16, 0.5, jnp.float32),
    # the narrow tiles of one wave between decode and large M (MID_M_FORMS): 64 x 64
    # tiles splitting K in two-block steps on a 6-slot ring (3 slots a warpgroup, the
    # ring running on across 2 tiles a CTA); 64 x 96 tiles splitting K, a wide 64 x 96
    # chunk a warpgroup promoted in 32-column pieces (the second column tile straddles
    # two b-scale blocks, the third is partial; the last step's second block past K);
    # 128 x 64 and 128 x 128 tiles split by rows in two-block steps, the scales
    # multiplied at promotion; 256 x 64 tiles (two 64-row chunks a warpgroup, the second
    # row tile partial)
    (130, 100, 850, dataclasses.replace(K_SPLIT, k_step=2, stages=6), True, F32, 0.5,
     jnp.float32),
    (130, 250, 850, dataclasses.replace(K_SPLIT, tile_n=96, wide_chunks=True, k_step=2,
                                        stages=4), True, BF16, -1.0, jnp.bfloat16),
    (256, 200, 850, dataclasses.replace(SPLIT_M, tile_n=64, k_step=2, stages=4, num_sms=3,
                                        scale_product=False), False, BF16, 1.0, None),
    (256, 300, 850, dataclasses.replace(SPLIT_M, k_step=2, stages=3, num_sms=3,
                                        scale_product=False), True, F32, 0.5, jnp.bfloat16),
    (300, 130, 900, dataclasses.replace(SPLIT_M, tile_m=256, tile_n=64, stages=4), True,
     BF16, -1.0, jnp.bfloat16),
    # one consumer warpgroup holding the whole tile (DeepGEMM's pick between decode and
    # large M where N is narrow; an explicit config, no rule takes it): 64 x 128 over
    # chained tiles, in two-block steps, 128 x 64 (two chunks), 64 x 96 (a wide chunk
    # promoted in 32-column parts: the second tile straddles two b-scale blocks)
    (130, 300, 850, dataclasses.replace(SMALL, consumers=1, stages=4, num_sms=3,
                                        scale_product=False), True, F32, 0.5, jnp.float32),
    (200, 200, 850, dataclasses.replace(SMALL, consumers=1, num_sms=3, k_step=2,
                                        scale_product=False), False, BF16, 1.0, None),
    (200, 200, 600, dataclasses.replace(SPLIT_M, tile_n=64, consumers=1, stages=3), True,
     BF16, -1.0, jnp.bfloat16),
    (130, 200, 600, dataclasses.replace(SMALL, tile_n=96, consumers=1, stages=3,
                                        wide_chunks=True, epi_tile_n=32, scale_product=False),
     True, F32, 0.5, jnp.float32),
    # the decode form in B-sharing pairs (an autotuning candidate for 64 < M <= 128):
    # the two 64-row tiles (the second partial) of 4 column tiles, 2 clusters, chained
    (100, 200, 850, dataclasses.replace(SMALL, tile_n=64, epi_tile_n=32, k_step=2, num_sms=4,
                                        cluster_m=2, scale_product=False), True, BF16, -1.0,
     jnp.bfloat16),
])
def test_kernel_interpret(m, n, k, cfg, with_c, out_dtype, beta, c_dtype):
  _run_kernel(m, n, k, cfg, with_c=with_c, out_dtype=out_dtype, beta=beta,
              c_dtype=c_dtype or jnp.float32)


@pytest.mark.parametrize("m,n,k,with_c,out_dtype", [
    (33, 160, 264, True, F32),
    (96, 72, 128, False, BF16),
    (5, 100, 4096, True, BF16),  # the heuristic splits K in 4: c joins the reduction
])
def test_public_api_interpret(m, n, k, with_c, out_dtype):
  """Through jax_fp8.blockwise_fp8_dot(..., backend="pallas_sm90") and the heuristic config."""
  ops = testing.random_operands(1, m, n, k, with_c=with_c)
  beta = 0.75 if with_c else 1.0

  def fn(a, sa, b, sb, c):
    return jax_fp8.blockwise_fp8_dot(a, sa, b, sb, c, beta=beta, out_dtype=out_dtype,
                                     backend="pallas_sm90")

  out = _interpret(fn, *ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=beta), out_dtype)


def test_public_api_batched_interpret():
  ops = testing.random_operands(2, 24, 136, 256, batch=(2,))
  out = _interpret(lambda a, sa, b, sb: jax_fp8.blockwise_fp8_dot(
      a, sa, b, sb, backend="pallas_sm90"), ops.a, ops.a_scale, ops.b, ops.b_scale)
  assert out.shape == (2, 24, 136)
  testing.assert_close(out, testing.reference_f64(ops.a, ops.a_scale, ops.b, ops.b_scale), BF16)


def _avals(m, n, k, c_dtype=None):
  kb, nb = -(-k // 128), -(-n // 128)
  avals = [jax.ShapeDtypeStruct((m, k), FP8), jax.ShapeDtypeStruct((m, kb), jnp.float32),
           jax.ShapeDtypeStruct((n, k), FP8), jax.ShapeDtypeStruct((nb, kb), jnp.float32)]
  if c_dtype is not None:
    avals.append(jax.ShapeDtypeStruct((m, n), c_dtype))
  return avals


@pytest.mark.parametrize("m,n,k,c_dtype,out_dtype", [
    (4096, 7168, 2048, None, BF16),       # large M: 128 x 256 tiles
    (128, 2112, 7168, None, BF16),        # M = 128
    (64, 24576, 1536, None, BF16),        # decode, wide N
    (1, 2112, 7168, None, BF16),          # decode, narrow tiles
    (7, 7000, 1000, jnp.float32, F32),    # odd everything, padded K and output N
    (4097, 2112, 7168, jnp.bfloat16, BF16),
])
def test_lowers_for_cuda(m, n, k, c_dtype, out_dtype):
  """Tracing, layout inference and Mosaic lowering for sm_90a, without a GPU."""
  beta = 0.5 if c_dtype is not None else 1.0

  def fn(a, sa, b, sb, c=None):
    return jax_fp8.blockwise_fp8_dot(a, sa, b, sb, c, beta=beta, out_dtype=out_dtype,
                                     backend="pallas_sm90")

  lowered = jax.jit(fn).trace(*_avals(m, n, k, c_dtype)).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


def _assert_every_wgmma_carried(call, avals, cfg):
  """With cfg's desc_carry every WGMMA of the kernel is issued from the descriptors
  its K loop carries (pallas/wgmma_desc.py), none through Pallas's wgmma (whose
  lowering forms them from the slot's SMEM address and commits with an inline
  `wgmma.commit_group` of its own); without it, through Pallas's.
  call(*operands, config=...) runs the kernel."""
  def text(config):
    fn = lambda *x: call(*x, config=config)
    return jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  assert cfg.desc_carry
  pallas_commit = "wgmma.commit_group.sync.aligned;"
  carried = text(cfg)
  assert "wgmma.mma_async" in carried and pallas_commit not in carried
  assert pallas_commit in text(dataclasses.replace(cfg, desc_carry=False))


def _grouped_avals(lead, m, n, k, g):
  kb, nb = -(-k // 128), -(-n // 128)
  return (jax.ShapeDtypeStruct((*lead, m, k), FP8), jax.ShapeDtypeStruct((*lead, m, kb), F32),
          jax.ShapeDtypeStruct((g, n, k), FP8), jax.ShapeDtypeStruct((g, nb, kb), F32),
          jax.ShapeDtypeStruct((g,), jnp.int32))


# (one wide chunk a warpgroup with the scales from GMEM; 192 x 128 of three consumers with
# them in the ring and the step top overlapped; 256 x 128 tiles in pairs sharing A)
@pytest.mark.parametrize("m,n,k", [(1280, 4096, 7168), (4096, 2112, 7168), (4096, 4096, 7168)])
def test_carried_descriptors_are_not_formed_from_slot_addresses(m, n, k):
  _assert_every_wgmma_carried(
      lambda a, sa, b, sb, config: hopper.blockwise_fp8_dot(a, sa, b, sb, None, beta=1.0,
                                                            out_dtype=BF16, config=config),
      _avals(m, n, k), hopper_tiling.default_config(m, n, k))


def _masked_case(g, cap, n, k, expected_m):
  """The rules' masked tiling for the case and its operands' avals."""
  cfg = hopper_tiling.default_config(cap, n, k, groups=g, grouped=True, expected_m=expected_m)
  return cfg, _grouped_avals((g,), cap, n, k, g)


# (192 x 128 of three consumers; the decode 128 x 256 split by columns)
@pytest.mark.parametrize("g,cap,n,k,expected_m", [(1, 1408, 4096, 7168, 1024),
                                                  (32, 128, 4096, 7168, 64)])
def test_masked_carried_descriptors_are_not_formed_from_slot_addresses(g, cap, n, k,
                                                                       expected_m):
  """The masked scheduler's K loop (its slot from the step) with desc_carry."""
  cfg, avals = _masked_case(g, cap, n, k, expected_m)
  _assert_every_wgmma_carried(functools.partial(hopper.masked_dot, out_dtype=BF16), avals, cfg)


def test_ragged_loops_carry_their_descriptors():
  """The ragged rules' 128 x 192 tiles and 192 x 128 tiles of three consumers (their
  ring slot carried too) and 256 x 128 tiles of two chunks a warpgroup (an explicit
  config)."""
  m, n, k = 32768, 4096, 7168
  cfg = hopper_tiling.default_config(m, n, k, groups=8, grouped=True, row_masks=True)
  assert (cfg.tile_m, cfg.tile_n, cfg.carried_slot) == (128, 192, True)
  three = hopper_tiling.default_config(m, n, k, groups=4, grouped=True, row_masks=True)
  assert (three.tile_m, three.tile_n, three.consumers, three.carried_slot) == (192, 128, 3, True)
  wide = dataclasses.replace(cfg, tile_m=256, tile_n=128, producer_registers=72,
                             wide_chunks=False, carried_slot=False, producer_warp=False)
  for g, config in ((8, cfg), (4, three), (8, wide)):
    _assert_every_wgmma_carried(functools.partial(hopper.ragged_dot, out_dtype=BF16),
                                _grouped_avals((), m, n, k, g), config)


@pytest.mark.parametrize("power_of_two", [False, True])
def test_fp8_output_epilogue_divides_by_the_rows_reciprocal(power_of_two):
  """The FP8 output's epilogue divides by each row's reciprocal (quant_math.quantize_rows:
  mul.rn per element, two fma.rn corrections for other scales than powers of two), not by
  a div.rn.f32 per element (its fast path and slow branch cost the fused GLU ~4%)."""
  def fn(a, sa, b, sb):
    return jax_fp8.blockwise_fp8_dot(a, sa, b, sb, out_dtype=FP8, backend="pallas_sm90",
                                     power_of_two_scales=power_of_two)

  text = jax.jit(fn).trace(*_avals(4096, 4096, 7168)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mul.rn.f32" in text
  assert ("fma.rn.f32" in text) == (not power_of_two)


@pytest.mark.parametrize("wait", ["wait_full", "wait_free"])
def test_k_split_hand_over_without_a_wait_is_reported(monkeypatch, wait):
  """Proof that the K-split tests can fail: the first warpgroup reading the others'
  sums before they are there, or one of them overwriting its slot before the first
  read it, breaks the interpreter's barrier checks (or its race detector)."""
  monkeypatch.setattr(pipeline.PartialSums, wait, lambda self: None)
  with pytest.raises(Exception, match="phase|race|RACE"):
    _run_kernel(70, 200, 300, K_SPLIT, with_c=False, out_dtype=F32)


def test_config_validation():
  with pytest.raises(ValueError, match="wg_split"):
    hopper.HopperConfig(wg_split="x").check()
  # A K split among the warpgroups: a ring slot always goes to the same one.
  hopper.HopperConfig(wg_split="k", consumers=3, stages=6).check()
  for fields in (dict(stages=3), dict(consumers=3, stages=4), dict(a_scale_window=4),
                 dict(tma_scales=True, step_top_overlap=True)):
    with pytest.raises(ValueError, match="wg_split='k'"):
      hopper.HopperConfig(wg_split="k", **fields).check()
  with pytest.raises(ValueError, match="multiple of 64"):
    hopper.HopperConfig(tile_m=64, wg_split="m").check()
  with pytest.raises(ValueError, match="epi_tile_n"):
    hopper.HopperConfig(epi_tile_n=96).check()
  with pytest.raises(ValueError, match="consumers"):
    hopper.HopperConfig(consumers=4).check()
  # One consumer warpgroup holds the whole tile; it cannot split K with itself.
  hopper.HopperConfig(tile_m=64, tile_n=128, consumers=1).check()
  with pytest.raises(ValueError, match="consumers"):
    hopper.HopperConfig(tile_m=64, tile_n=64, wg_split="k", consumers=1).check()
  with pytest.raises(ValueError, match="divide among 3"):
    hopper.HopperConfig(tile_m=128, wg_split="m", consumers=3).check()
  with pytest.raises(ValueError, match="not both"):
    hopper.HopperConfig(cluster_m=2, cluster_n=2).check()
  with pytest.raises(ValueError, match="k_step"):
    hopper.HopperConfig(k_step=3).check()
  for fields in (dict(k_step=2), dict(a_scale_window=4)):
    with pytest.raises(ValueError, match="tma_scales"):
      hopper.HopperConfig(tma_scales=True, **fields).check()
  hopper.HopperConfig(tma_scales=True).check()
  # One producer warp: no staged a-scale windows; multicast copies allowed.
  with pytest.raises(ValueError, match="producer_warp"):
    hopper.HopperConfig(producer_warp=True, a_scale_window=4).check()
  for fields in (dict(), dict(cluster_m=2), dict(cluster_n=2)):
    hopper.HopperConfig(producer_warp=True, **fields).check()
  with pytest.raises(ValueError, match="a_scale_window"):
    hopper.HopperConfig(tile_m=64, a_scale_window=4).check()
  with pytest.raises(ValueError, match="a_scale_window"):
    hopper.HopperConfig(a_scale_window=33).check()
  # Wide chunks: a warpgroup's columns in parts of 64, or of 32 where the tile's
  # offsets are multiples of 32 only (a part never straddles two b-scale blocks).
  with pytest.raises(ValueError, match="multiple of 32"):
    hopper.HopperConfig(tile_n=176, wg_split="m", wide_chunks=True).check()
  wide = lambda tn, split="m": hopper.HopperConfig(tile_n=tn, wg_split=split, wide_chunks=True)
  assert [wide(tn).piece_n() for tn in (160, 192, 224, 256)] == [32, 64, 32, 64]
  assert wide(192, "n").piece_n() == 32 and wide(256, "n").piece_n() == 64   # 96 / 128 each
  # Registers past the 168 per thread a 3-warpgroup CTA launches with would make
  # the consumers' setmaxnreg.inc wait forever (it hung on the H100).
  with pytest.raises(ValueError, match="hang"):
    hopper.HopperConfig(producer_registers=64).check()
  with pytest.raises(ValueError, match="multiple of 8"):
    hopper.HopperConfig(producer_registers=44).check()
  for p, regs in ((24, 240), (40, 232), (72, 216), (88, 208)):
    cfg = hopper.HopperConfig(producer_registers=p)
    cfg.check()
    assert cfg.consumer_registers() == regs


@pytest.mark.parametrize("window,k_steps,expected", [
    (0, 56, 0), (4, 56, 4), (8, 56, 8), (16, 56, 14), (4, 3, 3), (16, 13, 13), (4, 6, 3),
    (4, 5, 0), (4, 7, 0),  # no divisor near the window: GMEM a-scales
])
def test_a_scale_window_divides_the_pass(window, k_steps, expected):
  assert hopper.HopperConfig(a_scale_window=window).window_steps(k_steps) == expected


def test_split_k_must_divide_the_k_blocks():
  ops = testing.random_operands(0, 64, 64, 384)
  with pytest.raises(ValueError, match="split_k=2 must divide the 3 K blocks"):
    hopper.blockwise_fp8_dot(*ops.args()[:4], None, beta=1.0, out_dtype=BF16,
                             config=dataclasses.replace(CHAIN, split_k=2))
  with pytest.raises(ValueError, match="split_k"):
    dataclasses.replace(CHAIN, split_k=2, cluster_m=2).check()
  # Two-block steps must not straddle two splits (6 blocks: 3 per split).
  ops = testing.random_operands(0, 64, 64, 768)
  with pytest.raises(ValueError, match="k_step=2 must divide each split's 3 K blocks"):
    hopper.blockwise_fp8_dot(*ops.args()[:4], None, beta=1.0, out_dtype=BF16,
                             config=dataclasses.replace(CHAIN, split_k=2, k_step=2))


def test_unsupported_reason():
  assert hopper.unsupported_reason("blockwise_fp8_dot", 4096, 7168, 2048, out_dtype=BF16, has_c=True) is None
  assert hopper.unsupported_reason("blockwise_fp8_dot", 1, 1, 1, out_dtype=F32, has_c=False) is None
  assert "out_dtype" in hopper.unsupported_reason("blockwise_fp8_dot", 8, 8, 8, out_dtype=np.dtype(np.float16),
                                                  has_c=False)


# ---- GPU (Hopper) ---------------------------------------------------------------

DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
               (7168, 2048))
# FP8 WGMMA on Hopper adds the products of a 128-deep block in a reduced-precision
# (about 14-bit) accumulator: a float32 output carries ~1.3e-4 relative error
# against float64 (cuBLAS blockwise FP8 shows the same), above the interpret-mode
# bound of 1e-5. bf16 outputs keep the project bound.
GPU_TOL = {BF16: testing.TOLERANCE[BF16], F32: 2.5e-4}


def _random_operands(keys, a_shape, sa_shape, b_shape, sb_shape):
  """a, a_scale, b, b_scale made on the device from keys[:4] (fast there), the
  scales spanning binades."""
  a = (jax.random.normal(keys[0], a_shape) * 64).astype(FP8)
  b = (jax.random.normal(keys[1], b_shape) * 64).astype(FP8)
  sa = jnp.exp2(jax.random.uniform(keys[2], sa_shape, minval=-12.0, maxval=-4.0))
  sb = jnp.exp2(jax.random.uniform(keys[3], sb_shape, minval=-12.0, maxval=-4.0))
  return a, sa, b, sb


def _gpu_operands(m, n, k, seed, with_c):
  keys = jax.random.split(jax.random.key(seed), 5)
  kb, nb = -(-k // 128), -(-n // 128)
  a, sa, b, sb = _random_operands(keys, (m, k), (m, kb), (n, k), (nb, kb))
  c = jax.random.normal(keys[4], (m, n)) if with_c else None
  return a, sa, b, sb, c


def _gpu_rel_error(out, a, sa, b, sb, c, beta):
  """Relative Frobenius error against the float64 contract, evaluated on the GPU."""
  with jax.enable_x64(True):
    n, k = b.shape
    a64 = a.astype(jnp.float64) * jnp.repeat(sa.astype(jnp.float64), 128, axis=1)[:, :k]
    sbf = jnp.repeat(jnp.repeat(sb.astype(jnp.float64), 128, 0), 128, 1)[:n, :k]
    ref = jnp.dot(a64, (b.astype(jnp.float64) * sbf).T, precision="highest")
    if c is not None:
      ref = ref + beta * c.astype(jnp.float64)
    o = out.astype(jnp.float64)
    if not bool(jnp.all(jnp.isfinite(o))):
      return float("nan")
    return float(jnp.linalg.norm(o - ref) / jnp.linalg.norm(ref))


def _gpu_check(m, n, k, out_dtype, with_c, seed=0):
  a, sa, b, sb, c = _gpu_operands(m, n, k, seed, with_c)
  beta = 0.5 if with_c else 1.0
  out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
      *x, beta=beta, out_dtype=out_dtype, backend="pallas_sm90"))(a, sa, b, sb, c)
  assert out.shape == (m, n) and np.dtype(out.dtype) == out_dtype
  err = _gpu_rel_error(out, a, sa, b, sb, c, beta)
  assert err <= GPU_TOL[out_dtype], f"{m}x{n}x{k}: relative error {err:.3e}"


@requires_gpu(major=9)
# M = 512 / 1024: grids of one 128 x 256 tile per CTA (hopper._run reads their count)
@pytest.mark.parametrize("m", (64, 128, 512, 1024, 4096))
@pytest.mark.parametrize("n,k", DEEPSEEK_NK)
def test_gpu_deepseek_shapes(m, n, k):
  _gpu_check(m, n, k, BF16, with_c=False, seed=m + n + k)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (7, 7000, 1000), (4097, 2112, 7168),
                                   (4097, 7000, 1000), (300, 7000, 7168), (64, 7168, 2048),
                                   (100, 4096, 7168), (100, 7000, 1600)])
# M=1, 100 at K=7168: split-K; 100x7000x1600: 13 K blocks in steps of 2 (the last
# step's second block past K)
@pytest.mark.parametrize("out_dtype,with_c", [(BF16, False), (F32, True), (BF16, True)])
def test_gpu_odd_shapes(m, n, k, out_dtype, with_c):
  _gpu_check(m, n, k, out_dtype, with_c)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype,with_c", [
    (1280, 4096, 7168, BF16, False), (200, 18432, 7168, BF16, False),
    (4096, 576, 7168, BF16, False), (1000, 2112, 1536, F32, True)])
def test_gpu_160_column_tiles(m, n, k, out_dtype, with_c):
  """The dense rules' 128 x 160 tiles (the last column tile partial but at 1280 x 4096)."""
  c_dtype = F32 if with_c else None
  cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  assert (cfg.tile_m, cfg.tile_n, cfg.wide_chunks) == (128, 160, True), cfg
  _gpu_check(m, n, k, out_dtype, with_c)


@requires_gpu(major=9)
# 192 x 128 of three consumers in 4 stages (scales in the ring, step top overlapped), 128 x 160
# (scales from GMEM), 256 x 128 in pairs sharing A and alone, a partial last row tile; f32
# output with a residual c
@pytest.mark.parametrize("m,n,k,out_dtype,with_c", [
    (4096, 2112, 7168, BF16, False), (1280, 4096, 7168, BF16, False),
    (4096, 4096, 7168, BF16, False), (1024, 7168, 7168, BF16, False),
    (4097, 2112, 7168, BF16, False), (2048, 2112, 7168, F32, True)])
def test_gpu_carried_descriptors_give_pallas_wgmma_bit_for_bit(m, n, k, out_dtype, with_c):
  """The K loop issuing its WGMMAs from carried descriptors (desc_carry,
  pallas/wgmma_desc.py) computes what Pallas's wgmma does, bit for bit, and the
  contract within the GPU bound."""
  c_dtype = F32 if with_c else None
  cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  assert cfg.desc_carry
  a, sa, b, sb, c = _gpu_operands(m, n, k, 11, with_c)
  beta = 0.5 if with_c else 1.0
  outs = [jax.jit(lambda *x, cfg=config: hopper.blockwise_fp8_dot(
              *x, beta=beta, out_dtype=out_dtype, config=cfg))(a, sa, b, sb, c)
          for config in (cfg, dataclasses.replace(cfg, desc_carry=False))]
  np.testing.assert_array_equal(np.asarray(outs[0].astype(jnp.float32)),
                                np.asarray(outs[1].astype(jnp.float32)))
  err = _gpu_rel_error(outs[0], a, sa, b, sb, c, beta)
  assert err <= GPU_TOL[out_dtype], f"{m}x{n}x{k}: relative error {err:.3e}"


@requires_gpu(major=9)
@pytest.mark.parametrize("g,cap,n,k,expected_m", [
    (1, 1408, 4096, 7168, 1024), (2, 768, 4096, 7168, 512), (4, 384, 7168, 2048, 256),
    (32, 128, 4096, 7168, 64)])
def test_gpu_masked_carried_descriptors_give_pallas_wgmma_bit_for_bit(g, cap, n, k,
                                                                      expected_m):
  """Masked K loops carrying their descriptors compute what Pallas's wgmma does, bit
  for bit, over fills of 0 rows, the capacity, one row and odd counts (the contract
  itself: tests/test_grouped_kernels.py at these tilings)."""
  cfg, avals = _masked_case(g, cap, n, k, expected_m)
  assert cfg.desc_carry
  rng = np.random.default_rng(g * cap)
  masked_m = rng.integers(0, cap + 1, size=g).astype(np.int32)
  fixed = (0, cap, 1)[:g] if g > 1 else (cap - 7,)    # (one group: a partial last tile)
  masked_m[:len(fixed)] = fixed
  a, sa, b, sb = _random_operands(jax.random.split(jax.random.key(g + n), 4),
                                  avals[0].shape, avals[1].shape, avals[2].shape,
                                  avals[3].shape)
  outs = [np.asarray(jax.jit(lambda *x, cfg=config: hopper.masked_dot(
              *x, out_dtype=BF16, config=cfg))(a, sa, b, sb, jnp.asarray(masked_m))
              .astype(jnp.float32))
          for config in (cfg, dataclasses.replace(cfg, desc_carry=False))]
  assert np.isfinite(outs[0]).all() and np.any(outs[0] != 0)
  np.testing.assert_array_equal(outs[0], outs[1])


def _assert_ragged_configs_agree(sizes, n, k, configs):
  """Runs the ragged kernel at each config on the same random operands (groups of
  `sizes` rows) and asserts the first output finite and not all zeros, and every
  other bitwise equal to it."""
  g, m = len(sizes), sum(sizes)
  a, sa, b, sb = _random_operands(jax.random.split(jax.random.key(g), 4),
                                  *(x.shape for x in _grouped_avals((), m, n, k, g)[:4]))
  gs = jnp.asarray(sizes, jnp.int32)
  outs = [np.asarray(jax.jit(lambda *x, cfg=config: hopper.ragged_dot(
              *x, out_dtype=BF16, config=cfg))(a, sa, b, sb, gs).astype(jnp.float32))
          for config in configs]
  assert np.isfinite(outs[0]).all() and np.any(outs[0] != 0)
  for out in outs[1:]:
    np.testing.assert_array_equal(out, outs[0])


@requires_gpu(major=9)
@pytest.mark.parametrize("sizes", [[8192] * 4, [8915, 6546, 10707, 6600], [0, 20000, 129, 12639]])
def test_gpu_ragged_wide_tiles_give_the_128x192_tiles_bit_for_bit(sizes):
  """256 x 128 tiles carrying their descriptors (explicit configs), alone and in
  pairs sharing A (cluster_n=2), and the rules' 192 x 128 tiles of three consumers
  (groups of ~8192 rows) compute what the 128 x 192 tiles do, bit for bit (the same
  block order), groups aligned or not (the contract at the rules' tiles:
  tests/test_grouped_kernels.py's benchmark shapes)."""
  g, m, n, k = len(sizes), sum(sizes), 4096, 7168
  cands = hopper_tiling.candidate_configs(m, n, k, groups=g, grouped=True, row_masks=True)
  three = cands[0]
  assert (three.tile_m, three.tile_n, three.consumers, three.carried_slot) == (192, 128, 3, True)
  cfg = next(c for c in cands if (c.tile_m, c.tile_n) == (128, 192))
  assert cfg.carried_slot and cfg.desc_carry, cfg
  wide = dataclasses.replace(cfg, tile_m=256, tile_n=128, producer_registers=72,
                             wide_chunks=False, carried_slot=False, producer_warp=False)
  _assert_ragged_configs_agree(sizes, n, k,
                               (cfg, three, wide, dataclasses.replace(wide, cluster_n=2)))


@requires_gpu(major=9)
@pytest.mark.parametrize("sizes,n,k", [
    ([1592, 2059, 2372, 1697, 1436, 2018, 1841, 1452, 2628, 1724, 2608, 2496, 2547, 2479,
      1745, 2074], 4096, 7168),                                     # 128 x 192
    ([264, 235, 262, 186, 319, 253, 300, 229], 7168, 2048),         # 128 x 128
    ([0, 700, 1, 129, 5000], 4096, 7168)])
def test_gpu_ragged_carried_slot_bit_for_bit(sizes, n, k):
  """The ragged rules' tilings of one chunk a warpgroup carry their ring slot
  (HopperConfig.carried_slot) and their WGMMA descriptors (desc_carry), and compute
  what they do without either, bit for bit."""
  g, m = len(sizes), sum(sizes)
  cfg = hopper_tiling.default_config(m, n, k, groups=g, grouped=True, row_masks=True)
  assert cfg.carried_slot and cfg.desc_carry and cfg.chunks_per_warpgroup() == 1, cfg
  plain = dataclasses.replace(cfg, carried_slot=False, desc_carry=False)
  _assert_ragged_configs_agree(sizes, n, k, (cfg, dataclasses.replace(cfg, desc_carry=False),
                                             plain))


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k", [(2048, 2112, 7168), (1024, 18432, 7168), (2000, 2112, 7168)])
def test_gpu_rows_first_below_4096_rows(m, n, k):
  """Dense GEMMs of 1024-4095 rows walk their tiles rows first (a partial last row
  tile at 2000 rows)."""
  assert hopper_tiling.default_config(m, n, k).grid_minor == "m"
  _gpu_check(m, n, k, BF16, False)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype", [(1536, 4096, 7168, BF16), (1280, 4096, 7168, F32),
                                             (1280, 2112, 7168, BF16)])
def test_gpu_wide_tiles_with_ring_scales_below_2048_rows(m, n, k, out_dtype):
  """Dense 128 x 192 / 128 x 160 tiles of 1024-2047 rows: the ring brings their
  scales (step top overlapped, descriptors carried; hopper_cost.wide_tile_ring_scales)."""
  cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype)
  assert cfg.tma_scales and cfg.step_top_overlap and cfg.tile_m == 128
  _gpu_check(m, n, k, out_dtype, False)


@requires_gpu(major=9)
# (128 x 4096 x 7168 and 64 x 2112 x 7168: decode tiles whose warpgroups split K;
# 1024 x 7168 x 7168: 256 x 128 tiles alone, the scales in the ring; 384 x 4096 x 7168: the
# mid-M 128 x 128 form, two-block steps in a 3-deep ring; 300 x 2112 x 7168: the decode
# FP8 tiles above decode, over a partial row tile)
@pytest.mark.parametrize("m,n,k", [(4096, 4096, 7168), (300, 7000, 1000), (128, 4096, 7168),
                                   (64, 2112, 7168), (1024, 7168, 7168), (384, 4096, 7168),
                                   (300, 2112, 7168)])
@pytest.mark.parametrize("power_of_two", [False, True])
def test_gpu_fp8_output_is_the_float32_output_quantised(m, n, k, power_of_two):
  """On the tensor cores, the FP8 output's epilogue (its division by the row's reciprocal)
  gives, bit for bit, the numpy model's 1x128 quantisation of the same config's float32
  output (the same K loop: the same float32 values)."""
  from test_quantize_kernels import model_1x128
  cfg = hopper_tiling.fp8_output_config(m, n, k)
  # The float32 output's stores need more SMEM: a shallower ring (the same sums).
  configs = {FP8: cfg, F32: hopper_tiling._fit_stages(cfg, F32, None, max_stages=cfg.stages)}
  a, sa, b, sb, _ = _gpu_operands(m, n, k, 5, False)
  call = lambda out_dtype: jax.jit(lambda *x: hopper.blockwise_fp8_dot(
      *x, None, beta=1.0, out_dtype=out_dtype, config=configs[out_dtype],
      power_of_two_scales=power_of_two))(a, sa, b, sb)
  q, s = call(FP8)
  want_q, want_s = model_1x128(np.asarray(call(F32)), power_of_two)
  np.testing.assert_array_equal(np.asarray(s), want_s)
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), want_q.astype(np.float32))


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype", [(128, 18432, 7168, BF16), (128, 36864, 4096, F32)])
def test_gpu_decode_pairs_over_several_waves(m, n, k, out_dtype):
  # 128 x 64 tiles in pairs sharing A, each CTA pair walking several units.
  cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype)
  assert (cfg.tile_m, cfg.cluster_n) == (128, 2)
  _gpu_check(m, n, k, out_dtype, with_c=False, seed=7)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,with_c", [(96, 36864, 7168, False), (65, 18432, 2048, True)])
def test_gpu_decode_partial_second_row_tile(m, n, k, with_c):
  # 64 x 128 tiles over several waves, the second row tile partial.
  assert hopper_tiling.default_config(m, n, k).tile_n == 128
  _gpu_check(m, n, k, BF16, with_c=with_c, seed=8)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,with_c", [(64, 2112, 7168, False), (128, 4096, 7168, True),
                                          (1, 7168, 16384, False), (512, 2112, 7168, True),
                                          (1024, 2112, 7168, False)])
def test_gpu_fp8_output_quantised_after_the_gemm(m, n, k, with_c):
  """Where the rules quantise an FP8 output after the GEMM (the float32 output
  of the bf16 rules' tiling, then the quantiser kernel), the result is, bit for bit,
  the numpy model's 1x128 quantisation of the backend's float32 output."""
  from test_quantize_kernels import model_1x128
  assert hopper_tiling.fp8_output_quantized_after(m, n, k)
  a, sa, b, sb, c = _gpu_operands(m, n, k, 6, with_c)
  beta = 0.5 if with_c else 1.0
  call = lambda out_dtype: jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
      *x, beta=beta, out_dtype=out_dtype, backend="pallas_sm90"))(a, sa, b, sb, c)
  q, s = call(FP8)
  y = np.asarray(call(F32))
  assert _gpu_rel_error(y, a, sa, b, sb, c, beta) <= GPU_TOL[F32]
  want_q, want_s = model_1x128(y, False)
  np.testing.assert_array_equal(np.asarray(s), want_s)
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), want_q.astype(np.float32))


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype,with_c", [
    (4096, 2112, 7168, BF16, False), (4097, 2112, 7168, F32, True),
    (4096, 32768, 512, BF16, False), (300, 7000, 1000, BF16, True)])
def test_gpu_three_consumers(m, n, k, out_dtype, with_c):
  # The autotuning candidate with three consumer warpgroups (192 x 128 tiles).
  _gpu_check_candidate(m, n, k, out_dtype, with_c, 4, lambda c: c.consumers == 3)


def _gpu_check_candidate(m, n, k, out_dtype, with_c, seed, pick):
  """The first of the shape's candidate configs that pick() takes, against float64."""
  c_dtype = F32 if with_c else None
  cfg = next(c for c in hopper_tiling.candidate_configs(m, n, k, out_dtype=out_dtype,
                                                        c_dtype=c_dtype) if pick(c))
  a, sa, b, sb, c = _gpu_operands(m, n, k, seed, with_c)
  beta = 0.5 if with_c else 1.0
  out = jax.jit(lambda *x: hopper.blockwise_fp8_dot(
      *x, beta=beta, out_dtype=out_dtype, config=cfg))(a, sa, b, sb, c)
  assert out.shape == (m, n) and np.dtype(out.dtype) == out_dtype
  err = _gpu_rel_error(out, a, sa, b, sb, c, beta)
  assert err <= GPU_TOL[out_dtype], f"{m}x{n}x{k} {cfg}: relative error {err:.3e}"


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype", [
    (4096, 4096, 7168, F32), (4097, 2112, 7168, F32), (4096, 4000, 7000, F32),
    (2048, 7168, 16384, F32),
    (4096, 7168, 2048, BF16),  # 128 x 256 tiles overlap with a bf16 output only
])
def test_gpu_step_top_overlap_changes_no_bit(m, n, k, out_dtype):
  # The rules' tilings overlap their step top (the next slot's barrier tested ahead,
  # pallas/barrier_probe.py; the scales read after the first WGMMA's issue): the same
  # sums in the same order as waiting at each step's top, on every tile.
  cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype)
  assert cfg.step_top_overlap
  a, sa, b, sb, _ = _gpu_operands(m, n, k, 6, False)
  outs = [np.asarray(jax.jit(lambda *x, c=c: hopper.blockwise_fp8_dot(
      *x, None, beta=1.0, out_dtype=out_dtype, config=c))(a, sa, b, sb).astype(F32))
      for c in (cfg, dataclasses.replace(cfg, step_top_overlap=False, probe_in_flight=False))]
  assert np.isfinite(outs[0]).all()
  np.testing.assert_array_equal(outs[0], outs[1])


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,consumers,out_dtype,with_c", [
    (128, 4096, 7168, 2, F32, True), (64, 4096, 7168, 3, BF16, True),
    (128, 2112, 7168, 3, F32, False), (100, 7000, 7168, 2, BF16, True),
    (64, 2112, 7168, 3, BF16, True),
    (1, 7168, 16384, 2, BF16, False)])
def test_gpu_k_split_among_warpgroups(m, n, k, consumers, out_dtype, with_c):
  # The decode rules' tiles whose warpgroups split the K loop (K_SPLIT_DECODE_TILES).
  _gpu_check_candidate(m, n, k, out_dtype, with_c, 7,
                       lambda c: c.wg_split == "k" and c.consumers == consumers)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype,with_c", [
    (256, 2112, 7168, BF16, False), (192, 1536, 4096, F32, True),
    (512, 2112, 7168, F32, True), (256, 4096, 7168, BF16, True),
    (1024, 2112, 7168, BF16, False), (1024, 2112, 4096, F32, True),
    (200, 2112, 7168, F32, True), (700, 576, 7168, BF16, False),
    (384, 4096, 7168, BF16, True), (256, 7168, 16384, F32, False),
    (384, 2112, 7168, BF16, True), (192, 4096, 7168, F32, False),
    (300, 2112, 7168, BF16, True), (450, 1536, 7168, F32, False)])
def test_gpu_mid_m_narrow_tiles(m, n, k, out_dtype, with_c):
  # The rules' narrow tiles of one wave between decode and large M (MID_M_FORMS; 200
  # and 700 rows with a partial row tile; the last four 64 x 96 tiles splitting K, the
  # second of them over a partial column tile, the last two over a partial row tile).
  c_dtype = F32 if with_c else None
  cfg = hopper_tiling.default_config(m, n, k, out_dtype=out_dtype, c_dtype=c_dtype)
  assert hopper_cost.in_mid_m_form(cfg), cfg
  _gpu_check(m, n, k, out_dtype, with_c=with_c, seed=9)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype,with_c", [
    (8, 2112, 7168, BF16, False), (16, 7168, 2048, F32, True), (40, 4096, 7168, BF16, True),
    (3, 18432, 7168, F32, True), (56, 7168, 16384, BF16, False), (33, 1536, 7168, F32, False),
    (1, 2112, 7168, BF16, True), (2, 7168, 2048, F32, False), (2, 4096, 7168, BF16, False),
    (100, 2112, 7168, BF16, True), (200, 2112, 7168, F32, False)])
def test_gpu_short_a_box(m, n, k, out_dtype, with_c):
  # Decode calls of fewer rows than a tile: a's TMA box of whole 8-row tiles, a not
  # padded to the tile (M = 33: to 40 rows); 1 / 2 rows: the a-scales read one by
  # one; 100 / 200 rows: the last row tile's box holds only a's rows.
  _gpu_check(m, n, k, out_dtype, with_c=with_c, seed=m)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k,out_dtype,with_c,default", [
    (1024, 4096, 7168, BF16, False, True), (1792, 2112, 7168, BF16, False, True),
    (1280, 18432, 4096, F32, False, True), (1100, 4096, 7168, F32, True, False),
    (512, 7168, 16384, BF16, False, True)])
def test_gpu_scaled_ring_tiles(m, n, k, out_dtype, with_c, default):
  # 256 x 128 tiles alone with the scales in the ring between SCALED_RING_MIN_M and
  # TMA_SCALES_MIN_M rows (SCALED_RING_TILES), the rules' pick, or the candidate over a
  # partial row tile with a residual.
  scaled = lambda cfg: hopper_cost.scaled_ring_tile(cfg, m, k, hopper_cost.LARGE_M_TILES)
  c_dtype = F32 if with_c else None
  assert scaled(hopper_tiling.default_config(m, n, k, out_dtype=out_dtype,
                                             c_dtype=c_dtype)) == default
  _gpu_check_candidate(m, n, k, out_dtype, with_c, 10, scaled)


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k", [(4096, 7168, 2048), (64, 2112, 7168), (4097, 7000, 1000)])
def test_gpu_deterministic(m, n, k):
  a, sa, b, sb, _ = _gpu_operands(m, n, k, 3, False)
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, backend="pallas_sm90"))
  first = np.asarray(f(a, sa, b, sb).astype(jnp.float32))
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(f(a, sa, b, sb).astype(jnp.float32)), first)
