"""The Hopper and Blackwell kernels' schedulers and scale recipes, kernel by kernel.

- per-row b scales (the weight gradient's "1D1D" recipe, b_scale_rows=1);
- ragged groups (RaggedScheduler): tiles that span several groups (a piece
  per group, stored row-exactly), empty groups, a group cut at M, rows past
  the last group;
- masked groups (MaskedScheduler): empty, full and partial groups, garbage
  (NaN) rows past masked_m, tiles wholly past masked_m.

CPU (CI): GPU interpret mode with race detection, outputs poisoned with NaN
(uninitialized_memory="nan"), small tiles and 2-3 CTAs so that every CTA walks
several tiles; and Mosaic lowering for CUDA of each variant. GPU: DeepSeek-V3
sizes on a Hopper GPU.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import requires_gpu

from jax_fp8 import testing
from jax_fp8.pallas import blackwell, common, hopper, hopper_tiling, sm90
from test_quantize_kernels import model_1x128

FP8 = jnp.float8_e4m3fn
BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float32)

H_SMALL = hopper.HopperConfig(tile_m=64, tile_n=64, wg_split="n", stages=2, num_sms=3,
                              epi_tile_n=32)
H_SPLIT_M = hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=2, num_sms=2)
H_TWO_CHUNKS = dataclasses.replace(hopper.HopperConfig(), stages=2, num_sms=2)  # 128 x 256
# The tilings the rules give ragged groups and per-row b scales at large M.
H_WIDE_M = hopper.HopperConfig(tile_m=128, tile_n=256, wg_split="m", stages=2, num_sms=2,
                               producer_registers=72)
H_THREE_M = hopper.HopperConfig(tile_m=192, tile_n=128, wg_split="m", consumers=3, stages=2,
                                num_sms=2)
H_SPLIT_N = hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="n", stages=2, num_sms=2,
                                producer_registers=72)
# 128 x 192 tiles split by rows, a wide chunk per warpgroup in 64-column parts.
H_WIDE_CHUNK = hopper.HopperConfig(tile_m=128, tile_n=192, wg_split="m", stages=2, num_sms=2,
                                   wide_chunks=True)
# ... with the a-scales staged in SMEM by the producer (3-step windows over K=300).
H_WIDE_STAGED = dataclasses.replace(H_WIDE_CHUNK, a_scale_window=4)
# 128 x 160 tiles: wide chunks in 32-column parts (a tile's offset is a multiple
# of 32: a part never straddles two 128-row blocks of b).
H_WIDE_160 = hopper.HopperConfig(tile_m=128, tile_n=160, wg_split="m", stages=2, num_sms=2,
                                 wide_chunks=True, epi_tile_n=32)
# Every slot's scales brought by its TMA (the rules' choice from M = 2048): per-row
# b scales too; the warpgroups one above the other, or side by side.
H_TMA_M = dataclasses.replace(H_SPLIT_M, tma_scales=True)
H_TMA_N = dataclasses.replace(H_SPLIT_N, tma_scales=True)
# Ragged groups in 256 x 128 tiles split by rows (two 64 x 128 chunks a warpgroup; an
# explicit config), scales in the ring, descriptors carried (on the GPU; interpret
# mode runs Pallas's wgmma: tests/test_pallas_sm90.py compares the two).
H_RAGGED_WIDE = hopper.HopperConfig(tile_m=256, tile_n=128, wg_split="m", stages=2, num_sms=2,
                                    producer_registers=72, tma_scales=True,
                                    step_top_overlap=True, desc_carry=True)
# A K split among the warpgroups (each the whole tile, every other K step).
H_K_SPLIT = hopper.HopperConfig(tile_m=64, tile_n=64, wg_split="k", stages=2, num_sms=3,
                                epi_tile_n=32, scale_product=False)
B_SMALL = blackwell.BlackwellConfig(tile_n=64, input_stages=2, num_ctas=3, epi_tile_n=32)
B_WIDE = blackwell.BlackwellConfig(tile_n=256, input_stages=2, tmem_stages=2, num_ctas=2)


def _interpret(fn, *args):
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    return jax.block_until_ready(jax.jit(fn)(*args))


def _fp8(rng, shape):
  return jnp.asarray(testing.random_fp8(rng, shape))


def _scales(rng, shape):
  return jnp.asarray(testing.random_scales(rng, shape))


def _per_row_reference(a, a_scale, b, b_scale_rows):
  """The contract with one b scale per row of b, in float64."""
  a64 = np.asarray(a.astype(jnp.float32), np.float64)
  b64 = np.asarray(b.astype(jnp.float32), np.float64)
  sa, sb = np.asarray(a_scale, np.float64), np.asarray(b_scale_rows, np.float64)
  out = np.zeros((a64.shape[0], b64.shape[0]))
  for kb in range(sa.shape[1]):
    cols = slice(kb * 128, (kb + 1) * 128)
    out += (a64[:, cols] @ b64[:, cols].T) * sa[:, kb:kb + 1] * sb[None, :, kb]
  return out


def _ragged_operands(seed, m, n, k, sizes):
  rng = np.random.default_rng(seed)
  g, kb, nb = len(sizes), -(-k // 128), -(-n // 128)
  a, sa = _fp8(rng, (m, k)), _scales(rng, (m, kb))
  b, sb = _fp8(rng, (g, n, k)), _scales(rng, (g, nb, kb))
  ref, start = np.zeros((m, n)), 0
  for i, size in enumerate(sizes):
    end = min(start + max(size, 0), m)
    if end > start:
      ref[start:end] = testing.reference_f64(a[start:end], sa[start:end], b[i], sb[i])
    start = end
  return (a, sa, b, sb, jnp.asarray(sizes, jnp.int32)), ref, start


def _masked_operands(seed, g, m, n, k, masked_m):
  rng = np.random.default_rng(seed)
  kb, nb = -(-k // 128), -(-n // 128)
  a = np.array(testing.random_fp8(rng, (g, m, k)))
  for i, rows in enumerate(masked_m):
    a[i, max(rows, 0):] = np.nan  # rows past masked_m hold garbage: they must not leak
  a, sa = jnp.asarray(a), _scales(rng, (g, m, kb))
  b, sb = _fp8(rng, (g, n, k)), _scales(rng, (g, nb, kb))
  ref = np.zeros((g, m, n))
  for i, rows in enumerate(masked_m):
    rows = min(max(rows, 0), m)
    if rows:
      ref[i, :rows] = testing.reference_f64(a[i, :rows], sa[i, :rows], b[i], sb[i])
  return (a, sa, b, sb, jnp.asarray(masked_m, jnp.int32)), ref


KERNELS = {"sm90": hopper, "sm100": blackwell}


@pytest.mark.parametrize("arch,cfg", [("sm90", H_K_SPLIT),
                                      ("sm90", dataclasses.replace(H_SMALL, k_step=2)),
                                      ("sm100", B_SMALL)], ids=["k_split", "n_split", "sm100"])
@pytest.mark.parametrize("m,out_dtype,with_c", [(1, F32, False), (2, BF16, True), (8, BF16, True),
                                                 (16, F32, True), (33, F32, False),
                                                 (100, BF16, True), (136, F32, False)])
def test_short_a_box(arch, cfg, m, out_dtype, with_c):
  """Fewer rows of a than a tile: a's TMA box holds whole 8-row tiles of them (a
  not padded to the tile, nor up to 8 rows), the tile's other SMEM rows left as
  they were (NaN at first): their outputs must never be stored. 100 / 136 rows: a
  last row tile partly past a's rows (36 / 8 rows of 64; 128-row tiles: 8 of 128).
  1 / 2 rows: the Hopper kernel reads the a-scales one by one (not padded)."""
  ops = testing.random_operands(m, m, 200, 700, with_c=with_c)
  out = _interpret(lambda *x: KERNELS[arch].blockwise_fp8_dot(
      *x, beta=0.5, out_dtype=out_dtype, config=cfg), *ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), out_dtype)


@pytest.mark.parametrize("m,a_rows,scale_rows", [(1, 1, 1), (2, 2, 2), (3, 3, 64), (8, 8, 64),
                                                 (33, 40, 64), (64, 64, 64), (100, 104, 128)])
def test_decode_operands_padded_only_where_the_kernel_needs(m, a_rows, scale_rows):
  """a: to whole 8-row tiles (its TMA box short), not at all up to 8 rows; its
  scales: to whole 64-row chunks (the consumers' loads), not at all up to
  FEW_A_SCALE_ROWS (read one by one): a decode call of 1 or 2 rows pads nothing."""
  assert hopper.FEW_A_SCALE_ROWS == 2
  s = jax.ShapeDtypeStruct
  text = _lower(lambda a, sa, b, sb: hopper.blockwise_fp8_dot(
      a, sa, b, sb, None, beta=1.0, out_dtype=BF16, config=H_K_SPLIT),
      s((m, 1024), FP8), s((m, 8), jnp.float32), s((256, 1024), FP8), s((2, 8), jnp.float32))
  pads = [line for line in text.splitlines() if "stablehlo.pad" in line]
  fp8_pads = [line for line in pads if "f8E4M3FN" in line]
  scale_pads = [line for line in pads if "x8xf32>" in line]
  assert len(pads) == len(fp8_pads) + len(scale_pads), pads
  if a_rows == m:
    assert not fp8_pads
  else:
    assert len(fp8_pads) == 1 and f"tensor<1x{a_rows}x1024xf8E4M3FN>" in fp8_pads[0], fp8_pads
  if scale_rows == m:
    assert not scale_pads
  else:
    assert len(scale_pads) == 1 and f"tensor<1x{scale_rows}x8xf32>" in scale_pads[0], scale_pads


@pytest.mark.parametrize("arch,cfg,m,n,k,out_dtype", [
    ("sm90", H_SMALL, 70, 200, 300, F32),                   # one chunk per warpgroup
    ("sm90", dataclasses.replace(H_SMALL, k_step=2), 70, 130, 300, BF16),  # last step past K
    ("sm90", H_SPLIT_M, 200, 136, 384, F32),
    ("sm90", H_TWO_CHUNKS, 136, 264, 256, F32),             # two chunks share a column factor
    ("sm90", H_SPLIT_N, 200, 136, 384, F32),                # two 64 x 64 chunks per warpgroup
    # a 64 x 192 wide chunk per warpgroup, per-row scales in 64-column pieces
    ("sm90", H_WIDE_CHUNK, 136, 400, 850, F32),
    ("sm90", H_WIDE_STAGED, 136, 400, 768, F32),           # ... a-scales staged in SMEM
    ("sm90", H_WIDE_160, 136, 400, 850, F32),              # 32-column parts; 3 column tiles
    ("sm90", H_TMA_M, 200, 136, 384, F32),                  # b's scales by TMA as well
    ("sm90", H_TMA_N, 200, 330, 300, BF16),
    ("sm90", dataclasses.replace(H_SMALL, tma_scales=True), 70, 200, 300, F32),
    # one producer warp, per-row b scales in the ring too (the rules' weight gradient)
    ("sm90", dataclasses.replace(H_WIDE_160, tma_scales=True, producer_warp=True), 136, 400,
     850, F32),
    ("sm90", H_K_SPLIT, 70, 200, 300, F32),
    ("sm90", dataclasses.replace(H_K_SPLIT, tma_scales=True), 70, 200, 300, BF16),
    ("sm100", B_SMALL, 130, 200, 300, F32),
    ("sm100", B_WIDE, 100, 300, 256, BF16),
])
def test_per_row_b_scales(arch, cfg, m, n, k, out_dtype):
  rng = np.random.default_rng(m + n + k)
  kb = -(-k // 128)
  a, sa, b, sb = _fp8(rng, (m, k)), _scales(rng, (m, kb)), _fp8(rng, (n, k)), _scales(rng, (n, kb))

  def fn(a, sa, b, sb):
    return KERNELS[arch].blockwise_fp8_dot(a, sa, b, sb, None, beta=1.0, out_dtype=out_dtype,
                                           b_scale_rows=1, config=cfg)
  out = _interpret(fn, a, sa, b, sb)
  testing.assert_close(out, _per_row_reference(a, sa, b, sb), out_dtype)


def test_per_row_b_scales_in_the_ring_need_aligned_slots():
  """Each ring slot's per-row b scales (tma_scales) are a TMA destination of tile_n
  floats, whose SMEM address must be 128-byte aligned: tile_n a multiple of 32."""
  cfg = dataclasses.replace(H_K_SPLIT, tile_n=16, epi_tile_n=16, tma_scales=True)
  s = jax.ShapeDtypeStruct
  ops = (s((64, 256), FP8), s((64, 2), jnp.float32), s((64, 256), FP8))

  def fn(b_scale_rows):
    return lambda a, sa, b, sb: hopper.blockwise_fp8_dot(
        a, sa, b, sb, None, beta=1.0, out_dtype=F32, b_scale_rows=b_scale_rows, config=cfg)
  with pytest.raises(ValueError, match="tile_n a multiple of 32"):
    jax.eval_shape(fn(1), *ops, s((64, 2), jnp.float32))
  jax.eval_shape(fn(128), *ops, s((1, 2), jnp.float32))  # 128x128 b scales: not staged


@pytest.mark.parametrize("arch,cfg,m,sizes", [
    # a 64-row tile meeting 4 groups (37 | 0 | 1 | 100...), a group cut at M, rows past the sum
    ("sm90", H_SMALL, 200, [37, 0, 1, 100, 20]),
    ("sm90", H_SMALL, 130, [0, 130]),                          # all rows in one group
    ("sm90", H_SMALL, 150, [200, 5]),                          # the first group cut at M
    ("sm90", H_SPLIT_M, 300, [129, 127, 0, 1]),                # 128-row tiles, two warpgroups
    ("sm90", H_WIDE_M, 300, [129, 127, 0, 1]),                 # two column chunks per warpgroup
    ("sm90", H_THREE_M, 400, [100, 191, 0, 1, 60]),            # three consumers, 192-row tiles
    ("sm90", H_WIDE_CHUNK, 300, [129, 127, 0, 1]),             # one 64 x 192 WGMMA per warpgroup
    ("sm90", H_WIDE_STAGED, 300, [129, 127, 0, 1]),            # a-scales staged: a window per pass
    ("sm90", H_WIDE_160, 300, [129, 127, 0, 1]),
    ("sm90", H_TMA_M, 300, [129, 127, 0, 1]),                  # scales by TMA, per piece
    # ... read once the piece's first WGMMA is issued (the rules' ragged tiles from M = 2048)
    ("sm90", dataclasses.replace(H_TMA_M, step_top_overlap=True), 300, [129, 127, 0, 1]),
    ("sm90", dataclasses.replace(H_SMALL, tma_scales=True), 200, [37, 0, 1, 100, 20]),
    ("sm90", H_RAGGED_WIDE, 600, [129, 300, 0, 1, 100]),       # groups inside 256-row tiles
    # the ring slot carried through a piece's K loop, as in dense passes (the rules'
    # ragged 128 x 192 and 128 x 128 tiles), the next slot's barrier tested ahead
    ("sm90", dataclasses.replace(H_WIDE_CHUNK, tma_scales=True, step_top_overlap=True,
                                 carried_slot=True), 300, [129, 127, 0, 1]),
    ("sm90", dataclasses.replace(H_TMA_M, step_top_overlap=True, carried_slot=True), 600,
     [129, 300, 0, 1, 100]),
    ("sm90", dataclasses.replace(H_SMALL, carried_slot=True), 200, [37, 0, 1, 100, 20]),
    # ... filled by one producer warp (the rules' 192 x 128 tiles of many-row groups)
    ("sm90", dataclasses.replace(H_THREE_M, tma_scales=True, step_top_overlap=True,
                                 carried_slot=True, producer_warp=True), 400,
     [100, 191, 0, 1, 60]),
    ("sm90", H_SMALL, 100, [0, 0, 0]),                         # no rows: all zeros
    ("sm90", H_SMALL, 2, [1, 0, 1]),                           # a-scales read one by one
    ("sm90", H_K_SPLIT, 200, [37, 0, 1, 100, 20]),             # K split among warpgroups
    ("sm100", B_SMALL, 300, [37, 0, 1, 150, 20]),
    ("sm100", B_SMALL, 200, [-5, 129, 3]),                     # a negative size counts as 0
])
def test_ragged(arch, cfg, m, sizes):
  args, ref, end = _ragged_operands(m, m, 96, 300, sizes)
  fn = lambda *xs: KERNELS[arch].ragged_dot(*xs, out_dtype=F32, config=cfg)
  out = np.asarray(_interpret(fn, *args), np.float64)
  assert np.all(out[end:] == 0.0), "rows past the last group must be zeros"
  if end:
    testing.assert_close(out[:end], ref[:end], F32)


@pytest.mark.parametrize("arch,cfg,m,masked_m,out_dtype", [
    ("sm90", H_SMALL, 100, [0, 100, 37], F32),       # empty, full, partial; 2 row tiles
    ("sm90", H_SPLIT_M, 130, [129, 1], BF16),
    ("sm90", H_WIDE_CHUNK, 130, [129, 1], BF16),
    ("sm90", H_WIDE_STAGED, 130, [129, 1], BF16),
    ("sm90", dataclasses.replace(H_WIDE_160, a_scale_window=4), 130, [129, 1], BF16),
    ("sm90", dataclasses.replace(H_SMALL, k_step=2), 64, [64, 5, 200], F32),  # clamped to M
    ("sm90", H_TMA_M, 130, [129, 1], BF16),
    # the ring slot carried through a unit's K loop (a loop of 0 or 1 passes)
    ("sm90", dataclasses.replace(H_WIDE_CHUNK, carried_slot=True), 300, [0, 300, 129], BF16),
    ("sm90", dataclasses.replace(H_THREE_M, carried_slot=True), 200, [200, 1, 0], F32),
    # pairs of CTAs sharing B (3 row tiles: a pair's second CTA runs past M, and past
    # masked_m where its first holds rows) or sharing A (one pair of column tiles)
    ("sm90", dataclasses.replace(H_SMALL, num_sms=4, cluster_m=2), 130, [0, 130, 37, 65], F32),
    ("sm90", dataclasses.replace(H_SMALL, num_sms=4, cluster_n=2), 130, [0, 130, 37], BF16),
    ("sm90", dataclasses.replace(H_K_SPLIT, k_step=2), 100, [0, 100, 37], F32),
    ("sm90", H_SMALL, 24, [24, 0, 9], F32),  # groups of fewer rows than a tile: short a boxes
    ("sm90", H_K_SPLIT, 2, [2, 0, 1], BF16),  # ... and a-scales read one by one
    ("sm100", B_SMALL, 130, [0, 130, 37], F32),
])
def test_masked(arch, cfg, m, masked_m, out_dtype, n=96):
  args, ref = _masked_operands(m, len(masked_m), m, n, 300, masked_m)
  fn = lambda *xs: KERNELS[arch].masked_dot(*xs, out_dtype=out_dtype, config=cfg)
  out = np.asarray(_interpret(fn, *args).astype(jnp.float32), np.float64)
  for i, rows in enumerate(masked_m):
    assert np.all(out[i, max(0, min(rows, m)):] == 0.0), f"group {i}: rows past masked_m"
  testing.assert_close(out.reshape(-1, n), ref.reshape(-1, n), F32,
                       tol=testing.TOLERANCE[out_dtype])


@pytest.mark.parametrize("cfg,m,masked_m,out_dtype,n", [
    # 128 x 160 tiles at all four offsets within b's 128-row blocks (680 columns)
    (dataclasses.replace(H_WIDE_160, live_first=True), 260, [129, 1, 260], BF16, 680),
    (dataclasses.replace(H_WIDE_CHUNK, live_first=True, num_sms=3), 260, [0, 200, 5], F32, 400),
    (dataclasses.replace(H_WIDE_160, live_first=True, carried_slot=True), 260, [129, 1, 260],
     BF16, 680),                                      # ... each unit's ring slot carried
    (dataclasses.replace(H_WIDE_160, live_first=True, producer_warp=True), 260, [129, 1, 260],
     BF16, 680),                                      # ... one producer warp, GMEM scales
    (dataclasses.replace(H_WIDE_CHUNK, live_first=True, num_sms=3, tma_scales=True,
                         step_top_overlap=True, carried_slot=True), 260, [0, 200, 5], F32, 400),
    # pairs sharing B: a unit is a pair of row tiles, live if its first holds rows
    (dataclasses.replace(H_SPLIT_M, live_first=True, num_sms=3, cluster_m=2), 300,
     [0, 300, 37, 129], F32, 96),
    (dataclasses.replace(H_SMALL, live_first=True, num_sms=4, cluster_n=2), 130, [65, 0, 130],
     BF16, 200),
    (dataclasses.replace(H_SMALL, live_first=True), 100, [0, 0], F32, 96),  # no live tile
    # a decode tiling (side-by-side warpgroups, scales not multiplied first) live-first
    # in a capacity its fills leave mostly empty, as the expected_m hint picks it
    (dataclasses.replace(H_SPLIT_N, live_first=True, scale_product=False, num_sms=3), 400,
     [40, 0, 70], BF16, 256),
])
def test_masked_live_first(cfg, m, masked_m, out_dtype, n):
  """The live-first walk (HopperConfig.live_first) computes every live tile once
  and stores the others as zeros (NaN-poisoned outputs show a tile left out)."""
  test_masked("sm90", cfg, m, masked_m, out_dtype, n)


@pytest.mark.parametrize("masked_m,tile_m,n_tiles,cluster_m", [
    ([129, 1, 260], 128, 5, 1), ([0, 300, 37, 129], 64, 3, 2), ([0, 0], 64, 2, 1),
    ([384, 100, 0, 257, 383], 192, 7, 1),
])
def test_masked_live_first_walk(masked_m, tile_m, n_tiles, cluster_m):
  """Unit by unit, the live-first walk visits every (group, row tile, column
  tile) once, the tiles holding rows first; a CTA's K-pass steps count its live
  units."""
  from jax_fp8.pallas import scheduler
  m = max(max(masked_m), 1)
  sched = scheduler.MaskedScheduler(m=m, n=n_tiles * 32, tile_m=tile_m, tile_n=32,
                                    grid_minor="m", group=2, groups=len(masked_m),
                                    masked_m=jnp.asarray(masked_m, jnp.int32),
                                    cluster_m=cluster_m, live_first=True)
  seen, passes = [], []
  for u in range(sched.num_units):
    for c in range(cluster_m):
      t = sched.tile(jnp.int32(u), jnp.int32(c))
      seen.append((int(t.a_group), int(t.m0) // tile_m, int(t.n0) // 32))
    passes.append(int(t.passes))
  m_tiles = -(-m // tile_m)
  padded = -(-m_tiles // cluster_m) * cluster_m  # a pair's second tile may lie past M
  assert sorted(seen) == [(g, i, j) for g in range(len(masked_m)) for i in range(padded)
                          for j in range(n_tiles)]
  live = sum(passes)
  assert passes == [1] * live + [0] * (len(passes) - live)
  assert live == sum(-(-r // (tile_m * cluster_m)) for r in masked_m) * n_tiles
  for cta in range(3):
    assert int(sched.steps(cta, 3, 7)) == 7 * sum(passes[cta::3])


@pytest.mark.parametrize("capacity,rows", [(1152, 610), (1408, 719), (2048, 1065)])
def test_masked_live_first_walk_balances_the_waves(capacity, rows):
  """Why masked 192 x 128 tiles walk live-first (hopper_cost.MASKED_LIVE_FIRST_TILES):
  dealt round robin to 132 CTAs, the plain walk gives some CTA more live tiles than
  the live tiles' even share (at 1152 rows of capacity the 6 row tiles divide 132, so
  a CTA's units all lie in one row tile: those below masked_m get two live tiles, two
  waves where one holds them all); the live-first walk gives each its share."""
  from jax_fp8.pallas import scheduler

  def most_live_tiles(live_first):
    sched = scheduler.MaskedScheduler(m=capacity, n=4096, tile_m=192, tile_n=128, groups=1,
                                      masked_m=jnp.asarray([rows], jnp.int32),
                                      live_first=live_first)
    live = np.asarray(jax.vmap(lambda u: sched.tile(u, jnp.int32(0)).passes)(
        jnp.arange(sched.num_units, dtype=jnp.int32)))
    return max(int(live[cta::132].sum()) for cta in range(132)), int(live.sum())
  plain, live_tiles = most_live_tiles(False)
  balanced, same = most_live_tiles(True)
  assert same == live_tiles == -(-rows // 192) * 32
  assert balanced == -(-live_tiles // 132) < plain


def _quantize_1x128_model(x, power_of_two):
  """The quantisation decisions in numpy (tests/test_quantize_kernels.py's model):
  (q as float32, scales)."""
  q, scale = model_1x128(np.asarray(x, np.float32), power_of_two)
  return q.astype(np.float32), scale


@pytest.mark.parametrize("arch,cfg", [
    ("sm90", hopper.HopperConfig(tile_m=64, tile_n=256, wg_split="n", stages=2, num_sms=2,
                                 epi_tile_n=128)),
    ("sm90", hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=2, num_sms=2,
                                 epi_tile_n=128, k_step=2)),
    ("sm90", hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=2, num_sms=2,
                                 epi_tile_n=128, tma_scales=True)),
    # the mid-M form: two-block steps in a 3-deep ring, the scales multiplied at promotion
    ("sm90", hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=3, num_sms=2,
                                 epi_tile_n=128, k_step=2, scale_product=False)),
    # the long-K rule's 256 x 128 pairs sharing A (3 column tiles: one CTA past N)
    ("sm90", hopper.HopperConfig(tile_m=256, tile_n=128, wg_split="m", stages=2, num_sms=2,
                                 epi_tile_n=128, tma_scales=True, cluster_n=2,
                                 producer_registers=72)),
    # warpgroups splitting K: the first quantises the summed tile; then in the decode K
    # loop (the scales multiplied at promotion), as the rules take it above decode too
    ("sm90", hopper.HopperConfig(tile_m=64, tile_n=128, wg_split="k", stages=2, num_sms=2,
                                 epi_tile_n=128)),
    ("sm90", hopper.HopperConfig(tile_m=64, tile_n=128, wg_split="k", stages=2, num_sms=2,
                                 epi_tile_n=128, scale_product=False)),
    ("sm100", B_WIDE),                                             # 4 pieces, 2 groups
])
@pytest.mark.parametrize("power_of_two", [False, True])
def test_fp8_output(arch, cfg, power_of_two):
  """The epilogue quantises acc + beta * c 1x128 (e4m3 values, f32 scales),
  exactly as quantising the same kernel's float32 output; a NaN in c shows in
  its group's scale."""
  ops = testing.random_operands(9, 100, 300, 300, with_c=True)
  ops.c = ops.c.at[5, 130].set(jnp.nan)   # row 5, the second 128-column group
  kernel = KERNELS[arch]
  fp8 = lambda *x: kernel.blockwise_fp8_dot(*x, beta=0.5, out_dtype=FP8, config=cfg,
                                            power_of_two_scales=power_of_two)
  f32 = lambda *x: kernel.blockwise_fp8_dot(*x, beta=0.5, out_dtype=F32, config=cfg)
  q, s = _interpret(fp8, *ops.args())
  want_q, want_s = _quantize_1x128_model(_interpret(f32, *ops.args()), power_of_two)
  assert q.dtype == FP8 and q.shape == (100, 300) and s.shape == (100, 3)
  assert np.isnan(np.asarray(s)[5, 1]) and np.all(np.isfinite(np.delete(np.asarray(s), 5 * 3 + 1)))
  np.testing.assert_array_equal(np.asarray(s), want_s)
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), want_q)
  if power_of_two:
    finite = np.asarray(s)[np.isfinite(np.asarray(s))]
    assert np.all(np.frexp(finite)[0] == 0.5), "scales must be exact powers of two"


def _gate_activation(name, x):
  return {"silu": lambda v: v / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
          "gelu": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))
          }[name](x)


@pytest.mark.parametrize("arch,activation,out_dtype", [
    ("sm90", "silu", F32), ("sm90", "gelu", BF16), ("sm90", "relu", np.dtype(FP8)),
    ("sm100", "silu", F32), ("sm100", "relu", np.dtype(FP8)),
])
def test_fused_glu(arch, activation, out_dtype):
  """act(a @ gate.T) * (a @ up.T) with b = [gate; up], both tiles in one CTA."""
  m, f, k = 150, 384, 300
  ops = testing.random_operands(3, m, 2 * f, k)
  fp8 = out_dtype == np.dtype(FP8)
  if arch == "sm90":
    # (FP8 output: every slot's scales by TMA, as the rules give M >= 2048)
    cfg = hopper.HopperConfig(tile_m=128, tile_n=256, wg_split="m", stages=2, num_sms=2,
                              epi_tile_n=128 if fp8 else 64, tma_scales=fp8)
  else:
    cfg = blackwell.BlackwellConfig(tile_n=256, input_stages=2, num_ctas=2)
  fn = lambda *x: KERNELS[arch].glu(*x, activation=activation, out_dtype=out_dtype, config=cfg)
  out = _interpret(fn, *ops.args()[:4])
  full = testing.reference_f64(*ops.args()[:4])
  want = _gate_activation(activation, full[:, :f]) * full[:, f:]
  if fp8:
    q, s = out
    want_q, want_s = _quantize_1x128_model(_interpret(
        lambda *x: KERNELS[arch].glu(*x, activation=activation, out_dtype=F32, config=cfg),
        *ops.args()[:4]), power_of_two=False)
    np.testing.assert_array_equal(np.asarray(s), want_s)
    np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), want_q)
    out = np.asarray(q.astype(jnp.float32)) * np.repeat(np.asarray(s), 128, 1)[:, :f]
    assert testing.rel_error(out, want) < 0.05   # e4m3's rounding
  else:
    testing.assert_close(out, want, out_dtype)


def _pieces_model(sizes, m, tile_m):
  """RaggedScheduler's pieces in plain Python: (row tile, segment, lo, hi)."""
  bounds, start = [], 0
  for size in sizes:
    end = min(start + max(size, 0), m)
    bounds.append((start, end))
    start = end
  bounds.append((start, m))   # the segment past the last group
  return [(t, seg, max(lo, t * tile_m), min(hi, t * tile_m + tile_m))
          for seg, (lo, hi) in enumerate(bounds) if hi > lo
          for t in range(lo // tile_m, -(-hi // tile_m))]


@pytest.mark.parametrize("sizes,m,tile_m", [
    ([37, 0, 1, 100, 20], 200, 64), ([0, 130], 130, 64), ([200, 5], 150, 64),
    ([-5, 129, 3], 200, 128), ([0, 0, 0], 100, 64), ([128, 128], 256, 128),
    ([4000, 4100, 4192, 4092, 3900, 4100, 4300, 4076], 32768, 192),
])
def test_ragged_pieces(sizes, m, tile_m):
  """Every row lies in exactly one piece, the K-pass pieces first; a tile meets
  as many pieces as segments, so each unit runs one K pass."""
  from jax_fp8.pallas import scheduler
  pieces, counts = scheduler.ragged_pieces(jnp.asarray(sizes, jnp.int32), m, tile_m)
  want = _pieces_model(sizes, m, tile_m)
  passes = sum(seg < len(sizes) for _, seg, _, _ in want)
  assert [int(c) for c in counts] == [passes, len(want)]
  assert [tuple(int(v) for v in row) for row in np.asarray(pieces)[:len(want)]] == want
  assert len(pieces) >= len(want)


def test_grouped_configs_take_no_splits_or_pairs_sharing_b():
  args, _, _ = _ragged_operands(0, 64, 64, 128, [64])
  for bad in (dict(split_k=2), dict(cluster_m=2)):
    with pytest.raises(ValueError, match="grouped"):
      hopper.ragged_dot(*args, out_dtype=F32, config=dataclasses.replace(H_SMALL, **bad))


@pytest.mark.parametrize("cols,dtype,copies", [(64, BF16, 1), (32, F32, 1), (32, BF16, 2),
                                               (16, F32, 2), (16, BF16, 4)])
def test_rows_buffer_copies_start_every_row_aligned(cols, dtype, copies):
  """A TMA copy's SMEM address is 128-byte aligned: pieces of narrower rows keep
  shifted copies, so that a box from any piece row starts aligned in one of them
  (64 x 32 tiles' 16-column bf16 pieces faulted on the H200 without)."""
  n, plane, c = common.rows_buffer_shape(64, cols, dtype)
  row_bytes = cols * dtype.itemsize
  assert (n, c) == (copies, cols) and plane * row_bytes % 128 == 0
  for s in range(64):
    j = (copies - s % copies) % copies
    assert (j * plane + s + j) * row_bytes % 128 == 0 and j + 64 <= plane


@pytest.mark.parametrize("arch,cfg,out_dtype", [
    ("sm90", H_SMALL, BF16),                                                  # 2 copies
    ("sm90", dataclasses.replace(H_SMALL, tile_n=32, epi_tile_n=16), BF16),  # 4 copies
    ("sm90", dataclasses.replace(H_SMALL, tile_n=32, epi_tile_n=16), F32),   # 2 copies
    ("sm100", B_SMALL, BF16),                                                 # 2 copies
])
def test_ragged_narrow_pieces(arch, cfg, out_dtype):
  """Row-exact stores of pieces under 128 bytes a row, groups starting at odd rows."""
  args, ref, end = _ragged_operands(7, 200, 96, 300, [37, 0, 1, 100, 21, 3])
  fn = lambda *xs: KERNELS[arch].ragged_dot(*xs, out_dtype=out_dtype, config=cfg)
  out = _interpret(fn, *args)
  assert np.all(np.asarray(out[end:].astype(jnp.float32)) == 0.0), "rows past the groups: 0"
  testing.assert_close(out[:end], ref[:end], out_dtype)


# Row-exact stores next to pieces wholly past N (their partial stores skipped): 192 x 128
# tiles of three consumers with 32-column bf16 / 16-column float32 pieces; N = 160 pads to
# 192, so the second column tile holds a valid piece, a pad piece and pieces past the
# output; groups end at odd rows (one-row boxes) inside each warpgroup's rows.
RAGGED_THREE = dataclasses.replace(
    hopper_tiling.default_config(32768, 4096, 7168, groups=4, grouped=True, row_masks=True),
    num_sms=3)


def test_ragged_output_columns_are_whole_pieces():
  """Row-exact stores need no piece partly past the output's columns (a one-row box
  is a contiguous copy bounded only at the array's end): the Hopper kernel pads a
  ragged output to whole pieces (256-byte rows: 128 bf16 columns), a dense one only
  to its SMEM tiling (its stores are bounded per dimension)."""
  cfg = dataclasses.replace(RAGGED_THREE, epi_tile_n=128)
  args = [np.zeros(s, d) for s, d in (((8, 256), FP8), ((8, 2), F32), ((2112, 256), FP8))]
  def out_cols(exact_rows):
    return hopper._tiling(cfg, exact_rows).pad(*args[:2], args[2][None], None, BF16).out_cols
  assert out_cols(True) == 2176 and out_cols(False) == 2112


@pytest.mark.parametrize("epi_n,out_dtype", [(32, BF16), (16, F32)])
def test_ragged_stores_beside_pieces_past_n(epi_n, out_dtype):
  cfg = dataclasses.replace(RAGGED_THREE, epi_tile_n=epi_n)
  args, ref, end = _ragged_operands(5, 400, 160, 256, [55, 9, 128, 1, 131, 20])
  fn = lambda *xs: hopper.ragged_dot(*xs, out_dtype=out_dtype, config=cfg)
  out = _interpret(fn, *args)
  assert np.all(np.asarray(out[end:].astype(jnp.float32)) == 0.0), "rows past the groups: 0"
  testing.assert_close(out[:end], ref[:end], out_dtype)


# Ragged pieces in pairs of CTAs side by side sharing A (cluster_n): three column tiles
# (the last pair's second past N), groups cut inside row tiles, an empty group, one row,
# rows past the groups; the ragged rules' 256 x 128 tiles in one pair past N.
@pytest.mark.parametrize("cfg,m,n,sizes", [
    (dataclasses.replace(H_SMALL, num_sms=4, cluster_n=2), 150, 160, [37, 0, 1, 80]),
    (dataclasses.replace(H_SMALL, num_sms=6, cluster_n=2, tma_scales=True), 200, 136,
     [129, 60]),
    (dataclasses.replace(H_RAGGED_WIDE, num_sms=4, cluster_n=2), 300, 96, [129, 100, 0, 1]),
])
def test_ragged_pairs_sharing_a(cfg, m, n, sizes):
  args, ref, end = _ragged_operands(m + n, m, n, 300, sizes)
  fn = lambda *xs: hopper.ragged_dot(*xs, out_dtype=F32, config=cfg)
  out = np.asarray(_interpret(fn, *args), np.float64)
  assert np.all(out[end:] == 0.0), "rows past the last group must be zeros"
  testing.assert_close(out[:end], ref[:end], F32)


@pytest.mark.parametrize("cfg,m,n,masked,reads_count", [
    (H_SPLIT_N, 200, 136, False, True),         # 4 tiles on 2 CTAs, two chunks per warpgroup
    (H_SPLIT_N, 130, 136, True, True),          # masked: 2 groups x 2 tiles on 2 CTAs
    (dataclasses.replace(H_SPLIT_N, num_sms=4), 330, 136, False, False),  # 6 tiles on 4
    (H_SPLIT_M, 200, 136, False, False),        # one chunk per warpgroup: the constant
])
def test_unit_count_read_at_run_time(cfg, m, n, masked, reads_count):
  """Where every CTA runs the same number of tiles, warpgroups of two chunks read
  the count from GMEM (a constant count let LLVM unroll their tile loop, and ptxas
  spilled the straight-line K loop): an int32[1] operand; right either way."""
  if masked:
    args, ref = _masked_operands(m, 2, m, n, 384, [m, 70])
    fn = lambda *xs: hopper.masked_dot(*xs, out_dtype=F32, config=cfg)
    ref = ref.reshape(-1, n)
  else:
    rng = np.random.default_rng(m)
    args = (_fp8(rng, (m, 384)), _scales(rng, (m, 3)), _fp8(rng, (n, 384)), _scales(rng, (2, 3)))
    fn = lambda *xs: hopper.blockwise_fp8_dot(*xs, None, beta=1.0, out_dtype=F32, config=cfg)
    ref = testing.reference_f64(*args)
  assert ("i32[1]" in str(jax.make_jaxpr(fn)(*args))) == reads_count
  out = np.asarray(_interpret(fn, *args), np.float64)
  testing.assert_close(out.reshape(-1, n), ref, F32)


def _lower(fn, *avals):
  return jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_variants_lower_for_cuda(arch):
  """Mosaic lowering (layout inference included) of every variant, without a GPU:
  interpret mode accepts some programs the compiler does not."""
  s = jax.ShapeDtypeStruct
  k, n, g = 1600, 2112, 4   # 13 K blocks: a two-block step's second block past K
  mod = {"sm90": sm90, "sm100": blackwell}[arch]
  cfg = None if arch == "sm90" else B_WIDE
  per_row = (s((100, k), FP8), s((100, 13), jnp.float32), s((n, k), FP8), s((n, 13), jnp.float32))
  _lower(lambda a, sa, b, sb: mod.blockwise_fp8_dot(a, sa, b, sb, None, beta=1.0,
                                                    out_dtype=BF16, b_scale_rows=1, config=cfg),
         *per_row)
  grouped = (s((4096, k), FP8), s((4096, 13), jnp.float32), s((g, n, k), FP8),
             s((g, 17, 13), jnp.float32), s((g,), jnp.int32))
  _lower(lambda *xs: mod.ragged_dot(*xs, out_dtype=BF16, config=cfg), *grouped)
  masked = (s((g, 100, k), FP8), s((g, 100, 13), jnp.float32), s((g, n, k), FP8),
            s((g, 17, 13), jnp.float32), s((g,), jnp.int32))
  _lower(lambda *xs: mod.masked_dot(*xs, out_dtype=BF16, config=cfg), *masked)
  if arch == "sm90":  # pairs of CTAs sharing B within a group
    pairs = dataclasses.replace(hopper_tiling.default_config(100, n, k, groups=g, grouped=True),
                                cluster_m=2)
    _lower(lambda *xs: mod.masked_dot(*xs, out_dtype=BF16, config=pairs), *masked)
    # ragged pieces in pairs sharing A, in 256 x 128 tiles (N = 2112: 17
    # column tiles, the last pair's second past N)
    pairs = dataclasses.replace(H_RAGGED_WIDE, num_sms=None, stages=3, cluster_n=2)
    _lower(lambda *xs: mod.ragged_dot(*xs, out_dtype=BF16, config=pairs), *grouped)
  dense = (s((4096, k), FP8), s((4096, 13), jnp.float32), s((n, k), FP8), s((17, 13), jnp.float32))
  # a's short TMA box: fewer rows than a tile; the last of several row tiles
  for m in (3, 16, 300):
    _lower(lambda a, sa, b, sb: mod.blockwise_fp8_dot(a, sa, b, sb, None, beta=1.0,
                                                      out_dtype=BF16, config=cfg),
           s((m, k), FP8), s((m, 13), jnp.float32), dense[2], dense[3])
  for power_of_two in (False, True):
    _lower(lambda a, sa, b, sb: mod.blockwise_fp8_dot(
        a, sa, b, sb, None, beta=1.0, out_dtype=FP8, power_of_two_scales=power_of_two,
        config=cfg), *dense)
  glu_cfg = None if arch == "sm90" else blackwell.BlackwellConfig(tile_n=256)
  glu_mod = sm90 if arch == "sm90" else blackwell
  gate_up = (dense[0], dense[1], s((4096, k), FP8), s((32, 13), jnp.float32))
  for out_dtype in (BF16, np.dtype(FP8)):
    _lower(lambda a, sa, b, sb: glu_mod.glu(a, sa, b, sb, activation="silu", out_dtype=out_dtype,
                                            config=glu_cfg), *gate_up)


# ---------------------------------------------------------------------------- GPU

GPU_TOL = {BF16: 4e-3, F32: 2.5e-4}


@requires_gpu(major=9)
@pytest.mark.parametrize("m,n,k", [(4096, 7168, 4096), (7168, 2048, 4096), (128, 512, 16384)])
def test_gpu_per_row_b_scales(m, n, k):
  """The weight-gradient shapes: M = a layer's input features, K = tokens."""
  rng = np.random.default_rng(0)
  kb = -(-k // 128)
  a, sa, b, sb = _fp8(rng, (m, k)), _scales(rng, (m, kb)), _fp8(rng, (n, k)), _scales(rng, (n, kb))
  out = jax.jit(lambda *xs: sm90.blockwise_fp8_dot(*xs, None, beta=1.0, out_dtype=F32,
                                                   b_scale_rows=1))(a, sa, b, sb)
  testing.assert_close(out, _per_row_reference(a, sa, b, sb), F32, tol=GPU_TOL[F32])


@requires_gpu(major=9)
@pytest.mark.parametrize("n,k", [(4096, 7168), (7168, 2048)])
@pytest.mark.parametrize("sizes", ["aligned", "random"])
def test_gpu_ragged(n, k, sizes):
  rng = np.random.default_rng(1)
  g, m = 8, 8192
  group_sizes = ([m // g] * g if sizes == "aligned"
                 else list(rng.multinomial(m - 300, np.ones(g) / g)))  # 300 rows past the sum
  args, ref, end = _ragged_operands(2, m, n, k, group_sizes)
  out = np.asarray(jax.jit(lambda *xs: sm90.ragged_dot(*xs, out_dtype=BF16))(*args)
                   .astype(jnp.float32), np.float64)
  assert np.all(out[end:] == 0.0)
  testing.assert_close(out[:end], ref[:end], F32, tol=GPU_TOL[BF16])


@requires_gpu(major=9)
@pytest.mark.parametrize("epi_n,out_dtype", [(32, BF16), (16, BF16), (16, F32)])
def test_gpu_ragged_narrow_stores_past_n(epi_n, out_dtype):
  """Pieces narrower than 128 bytes a row wholly past N = 2112 in the last column tile:
  their one-row TMA boxes of a cut tile wrote zeros into the next row's first columns
  on the H200 (rows 823 and 832 here, 2026-11-29) until partial stores of such pieces
  were skipped (OutputStores.store_rows' in_bounds)."""
  cfg = dataclasses.replace(RAGGED_THREE, num_sms=None, epi_tile_n=epi_n)
  args, ref, end = _ragged_operands(7, 4096, 2112, 2048, [823, 1109, 1006, 1158])
  out = np.asarray(jax.jit(lambda *xs: hopper.ragged_dot(*xs, out_dtype=out_dtype,
                                                         config=cfg))(*args)
                   .astype(jnp.float32), np.float64)
  testing.assert_close(out, ref, F32, tol=GPU_TOL[out_dtype])


@requires_gpu(major=9)
@pytest.mark.parametrize("g,m,n,k", [(32, 64, 4096, 7168), (4, 256, 7168, 2048)])
def test_gpu_masked(g, m, n, k):
  rng = np.random.default_rng(3)
  masked_m = [int(x) for x in rng.integers(0, m + 1, size=g)]
  args, ref = _masked_operands(4, g, m, n, k, masked_m)
  out = np.asarray(jax.jit(lambda *xs: sm90.masked_dot(*xs, out_dtype=BF16))(*args)
                   .astype(jnp.float32), np.float64)
  for i, rows in enumerate(masked_m):
    assert np.all(out[i, rows:] == 0.0)
  testing.assert_close(out.reshape(-1, n), ref.reshape(-1, n), F32, tol=GPU_TOL[BF16])
