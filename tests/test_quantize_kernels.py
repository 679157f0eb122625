"""The fused quantiser kernels (pallas/quantize.py) against a numpy model of the decisions.

The model below is jax_fp8's quantiser semantics (the project's decisions, with
the reading of "amax / 448 underflows" that jax_fp8/quantize.py takes: no scale
below float32's normal range) in numpy float32, whose division is IEEE's:
scales must match it bitwise, q too (any NaN matches any NaN). Inputs have scales spanning binades (rows and
columns scaled by 2^-20 .. 2^20) so that a division rounded twice shows.

CPU (CI): the kernels run in GPU interpret mode with race detection, outputs
poisoned with NaN (an unwritten tile fails), on small shapes; every kernel
variant is also lowered for CUDA (sm_90a, and sm_100a's Python-side
lowering). Interpret mode runs XLA's CPU arithmetic, which flushes
subnormal inputs of the division: the edge cases that depend on them run on
the GPU only.
GPU (Hopper): DeepSeek-V3 sizes and every edge case, bitwise.
"""
import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import requires_gpu

from jax_fp8 import testing
from jax_fp8.pallas import quantize as qk

BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(jnp.float32)
E4M3_MAX = np.float32(448.0)


# ---- the model ---------------------------------------------------------------------

MIN_NORMAL = np.finfo(np.float32).tiny  # 2^-126


def _pow2_scale(amax):
  """The smallest power of two 2^e >= 2^-126 with amax <= 448 * 2^e (amax > 0, finite)."""
  m, e = np.frexp(amax.astype(np.float64))  # amax = m * 2^e, m in [0.5, 1); 448 = 0.875 * 2^9
  e = np.where(m <= 0.875, e - 9, e - 8)
  return np.ldexp(1.0, np.maximum(e, -126)).astype(np.float32)


def model_scale(amax, pow2):
  """amax / 448 (IEEE), or the power of two; a scale below float32's normal range is 1."""
  amax = np.asarray(amax, np.float32)
  with np.errstate(all="ignore"):
    if pow2:
      scale = np.where(amax == 0, np.float32(1), _pow2_scale(amax))
      return np.where(np.isfinite(amax), scale, amax).astype(np.float32)
    scale = amax / E4M3_MAX
    return np.where(scale < MIN_NORMAL, np.float32(1), scale).astype(np.float32)


def _model_q(x, scale):
  with np.errstate(all="ignore"):
    return np.clip(x / scale, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)


def model_1x128(x, pow2):
  """x [T, K] float32 -> (q [T, K], s [T, ceil(K/128)]): groups along rows."""
  t, k = x.shape
  kg = -(-k // 128)
  xp = np.zeros((t, kg * 128), np.float32)
  xp[:, :k] = x
  groups = xp.reshape(t, kg, 128)
  scale = model_scale(np.max(np.abs(groups), axis=-1), pow2)
  return _model_q(groups, scale[..., None]).reshape(t, kg * 128)[:, :k], scale


def model_128x128(w, pow2):
  n, k = w.shape
  ng, kg = -(-n // 128), -(-k // 128)
  wp = np.zeros((ng * 128, kg * 128), np.float32)
  wp[:n, :k] = w
  blocks = wp.reshape(ng, 128, kg, 128)
  scale = model_scale(np.max(np.abs(blocks), axis=(1, 3)), pow2)
  return _model_q(blocks, scale[:, None, :, None]).reshape(wp.shape)[:n, :k], scale


def expected(op, x, pow2, with_transpose=False):
  x = np.asarray(jnp.asarray(x).astype(jnp.float32))
  if op == "quantize_128x128":
    q, s = model_128x128(x, pow2)
    return (q, s, q.T, s.T) if with_transpose else (q, s)
  out = model_1x128(x, pow2)
  if op == "quantize_1x128_with_transpose":
    out += model_1x128(x.T, pow2)
  return out


def assert_bitwise(out, want):
  names = ("q", "s", "q_t", "s_t")
  assert len(out) == len(want)
  for name, o, w in zip(names, out, want):
    o, w = np.asarray(o), np.asarray(w)
    assert o.shape == w.shape and o.dtype == w.dtype, (name, o.shape, o.dtype, w.shape, w.dtype)
    if name.startswith("q"):
      ob, wb = o.view(np.uint8), w.view(np.uint8)
      same = (ob == wb) | (((ob & 0x7F) == 0x7F) & ((wb & 0x7F) == 0x7F))  # NaN == NaN
    else:
      same = (o.view(np.uint32) == w.view(np.uint32)) | (np.isnan(o) & np.isnan(w))
    bad = np.argwhere(~same)
    assert bad.size == 0, (f"{name}: {len(bad)} of {o.size} differ, first at {bad[0].tolist()}: "
                           f"got {o[tuple(bad[0])]!r}, want {w[tuple(bad[0])]!r}")


def test_model_scales():
  """The model's own edges: 448 * 2^e is its own power; one ulp more is the next;
  no subnormal scale."""
  amax = np.float32([448.0, 448.0 * 2**-20, np.nextafter(np.float32(448), np.float32(1e9)),
                     1.0, 0.0, np.inf, np.nan, 2.0**-149, 3.4e38, 2.0**-120, 448 * 2.0**-126])
  s = model_scale(amax, pow2=True)
  np.testing.assert_array_equal(s[:6], np.float32([1.0, 2**-20, 2.0, 2**-8, 1.0, np.inf]))
  assert np.isnan(s[6]) and s[8] == np.float32(2.0**120)
  np.testing.assert_array_equal(s[[7, 9, 10]], np.float32(2.0**-126))
  s = model_scale(amax, pow2=False)
  assert s[0] == 1.0 and s[4] == 1.0 and s[5] == np.inf and np.isnan(s[6])
  np.testing.assert_array_equal(s[[7, 9]], np.float32(1.0))  # amax / 448 below 2^-126
  assert s[10] == np.float32(2.0**-126)
  # One rounding: amax / 448 correctly rounded (float64 then float32 is, for a
  # quotient of float32 numbers), which amax * (1 / 448) often is not.
  a = np.abs(random_input((64, 64), F32)).ravel()
  np.testing.assert_array_equal(model_scale(a, False),
                                (a.astype(np.float64) / 448).astype(np.float32))
  assert np.any(model_scale(a, False) != a * (np.float32(1) / E4M3_MAX))


# ---- data --------------------------------------------------------------------------

def random_input(shape, dtype, seed=0):
  """Normal values, rows and columns scaled by powers of two over 40 and 16 binades."""
  rng = np.random.default_rng(seed)
  t, k = shape
  x = rng.standard_normal(shape) * np.exp2(rng.uniform(-20, 20, (t, 1)))
  x = x * np.exp2(rng.uniform(-8, 8, (1, k)))
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def _e4m3_midpoints():
  """Values halfway between neighbouring e4m3 numbers in [1, 448), and one float32 ulp
  either side (ties go to even)."""
  grid = np.arange(0, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  grid = grid[grid >= 1]
  mid = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)  # 70 ties
  below, above = np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(1e9))
  return np.concatenate([mid, below[::2], above[1::2]])[:127]


def edge_groups(gpu: bool):
  """128-element groups, one edge case each. gpu=False leaves out the cases XLA's
  CPU arithmetic (interpret mode) cannot show: it flushes subnormal inputs of the
  division to zero."""
  rng = np.random.default_rng(7)
  base = rng.standard_normal(128).astype(np.float32)
  groups = {
      "zeros": np.zeros(128, np.float32),
      "signed zeros": np.where(np.arange(128) % 2 == 0, np.float32(-0.0), np.float32(0.0)),
      "nan": np.where(np.arange(128) == 17, np.float32(np.nan), base),
      "inf": np.where(np.arange(128) == 5, np.float32(np.inf), base),
      "-inf": np.where(np.arange(128) == 99, np.float32(-np.inf), base),
      "nan and inf": np.where(np.arange(128) == 3, np.float32(np.nan),
                              np.where(np.arange(128) == 4, np.float32(np.inf), base)),
      "448 exactly": np.where(np.arange(128) % 3 == 0, E4M3_MAX, -base),
      "448 * 2^-30 exactly": (np.where(np.arange(128) % 5 == 0, E4M3_MAX, base)
                              * np.float32(2.0**-30)),
      "one ulp past 448 * 2^10": np.where(
          np.arange(128) == 0, np.nextafter(np.float32(448 * 2**10), np.float32(1e9)), base),
      "float32 max": np.where(np.arange(128) == 1, np.float32(3.4028235e38), base * 1e30),
      "-float32 max": np.where(np.arange(128) == 1, np.float32(-3.4028235e38), base),
      "e4m3 ties (scale 1)": np.concatenate([[-E4M3_MAX], _e4m3_midpoints()]),
      "tiny normals": base * np.float32(2.0**-100),
      "subnormals beside 1": np.where(np.arange(128) == 0, np.float32(1.0),
                                      base * np.float32(2.0**-140)),
      "one nonzero": np.where(np.arange(128) == 64, np.float32(-3.0), np.float32(0.0)),
      "amax / 448 underflows": np.where(np.arange(128) == 9, np.float32(2.0**-149),
                                        np.float32(0.0)),
  }
  if gpu:  # power-of-two scales of 2^-126 make subnormal inputs nonzero FP8
    groups.update({
        "all subnormal": base * np.float32(2.0**-140),
        "amax below 448 * 2^-126": base * np.float32(2.0**-120),
        "smallest normal amax": np.where(np.arange(128) == 2, np.float32(2.0**-126),
                                         base * np.float32(2.0**-130)),
    })
  return groups


def edge_rows(gpu: bool):
  """[groups, 256]: each row two edge groups (its own, then the next one's)."""
  g = np.stack(list(edge_groups(gpu).values()))
  return np.concatenate([g, np.roll(g, -1, axis=0)], axis=1)


def edge_blocks(gpu: bool):
  """[128 * ceil(n/2), 256]: each 128 x 128 block one edge group, its rows permuted."""
  g = list(edge_groups(gpu).values())
  g += g[:len(g) % 2]
  rng = np.random.default_rng(3)
  blocks = [np.stack([rng.permutation(grp) for _ in range(128)]) for grp in g]
  return np.block([[blocks[i], blocks[i + 1]] for i in range(0, len(blocks), 2)])


# ---- interpret mode ----------------------------------------------------------------

def _kernel_fn(op, pow2, config=None, with_transpose=False):
  if op == "quantize_128x128":
    return functools.partial(qk.quantize_128x128, power_of_two_scales=pow2,
                             with_transpose=with_transpose, config=config)
  return functools.partial(getattr(qk, op), power_of_two_scales=pow2, config=config)


def _interpret(fn, x):
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    return jax.block_until_ready(jax.jit(fn)(x))


@pytest.mark.parametrize("shape,dtype,pow2", [
    ((256, 256), BF16, False),
    ((256, 256), F32, True),
    ((5, 300), BF16, True),      # a partial row tile and a partial last group
    ((70, 200), F16, False),
    ((1, 1), F32, False),
    # the last row tile in a short box: 16 of 64 rows (x not padded), 72 of 128
    ((16, 256), BF16, False),
    ((200, 384), F32, True),
])
def test_1x128_interpret(shape, dtype, pow2):
  x = random_input(shape, dtype, seed=1)
  out = _interpret(_kernel_fn("quantize_1x128", pow2), x)
  assert_bitwise(out, expected("quantize_1x128", x, pow2))


@pytest.mark.parametrize("shape,dtype,pow2", [
    ((256, 256), BF16, False),
    ((256, 384), BF16, True),
    ((200, 300), F32, False),    # partial token and feature tiles, partial groups
    ((3, 130), BF16, False),
])
def test_1x128_with_transpose_interpret(shape, dtype, pow2):
  x = random_input(shape, dtype, seed=2)
  out = _interpret(_kernel_fn("quantize_1x128_with_transpose", pow2), x)
  assert_bitwise(out, expected("quantize_1x128_with_transpose", x, pow2))


@pytest.mark.parametrize("shape,dtype,pow2,with_transpose", [
    ((256, 256), BF16, False, False),
    ((256, 384), BF16, True, True),
    ((130, 300), F32, False, True),   # partial blocks
    ((7, 5), F32, True, False),
])
def test_128x128_interpret(shape, dtype, pow2, with_transpose):
  w = random_input(shape, dtype, seed=3)
  out = _interpret(_kernel_fn("quantize_128x128", pow2, with_transpose=with_transpose), w)
  assert_bitwise(out, expected("quantize_128x128", w, pow2, with_transpose))


@pytest.mark.parametrize("op,config,shape", [
    ("quantize_1x128", qk.QuantizeConfig(tile_rows=64, tile_cols=256), (130, 640)),
    ("quantize_1x128", qk.QuantizeConfig(tile_rows=192, tile_cols=128), (200, 256)),
    ("quantize_1x128_with_transpose", qk.QuantizeConfig(tile_rows=256, tile_cols=128),
     (300, 260)),
])
def test_tilings_interpret(op, config, shape):
  x = random_input(shape, BF16, seed=4)
  out = _interpret(_kernel_fn(op, False, config), x)
  assert_bitwise(out, expected(op, x, False))


@pytest.mark.parametrize("pow2", [False, True])
def test_edge_values_interpret(pow2):
  """Zeros, NaN, +-Inf, 448 boundaries, float32 max, e4m3 ties, tiny values: rows
  for the row-wise kernels, the same groups as columns for q_t, as blocks for 128x128."""
  rows = jnp.asarray(edge_rows(gpu=False))
  for op, x in (("quantize_1x128", rows), ("quantize_1x128_with_transpose", rows.T)):
    assert_bitwise(_interpret(_kernel_fn(op, pow2), x), expected(op, x, pow2))
  blocks = jnp.asarray(edge_blocks(gpu=False))
  out = _interpret(_kernel_fn("quantize_128x128", pow2, with_transpose=True), blocks)
  assert_bitwise(out, expected("quantize_128x128", blocks, pow2, with_transpose=True))


def test_edge_values_bf16_interpret():
  x = jnp.asarray(edge_rows(gpu=False)).astype(jnp.bfloat16)
  op = "quantize_1x128_with_transpose"
  assert_bitwise(_interpret(_kernel_fn(op, False), x.T), expected(op, x.T, False))


def test_kernels_match_the_jnp_quantisers_interpret():
  """Bitwise against jax_fp8/quantize.py's jnp quantisers (called on the CPU, where they
  are the jnp versions), once those follow the rules (branch rel: group_amax, true
  divisions, exact power-of-two scales); main's older versions round twice."""
  from jax_fp8 import quantize as jquant
  if not hasattr(jquant, "group_amax"):
    pytest.skip("jax_fp8/quantize.py's jnp quantisers do not follow the rules yet (branch rel)")
  rows = jnp.asarray(edge_rows(gpu=False))
  cases = [("quantize_1x128", random_input((256, 384), BF16, seed=5), False),
           ("quantize_1x128_with_transpose", rows.T, True),
           ("quantize_128x128", jnp.asarray(edge_blocks(gpu=False)), False),
           ("quantize_128x128", random_input((256, 384), F32, seed=7), True)]
  for op, x, pow2 in cases:
    if op == "quantize_1x128_with_transpose":
      want = (*jquant.quantize_1x128(x, power_of_two_scales=pow2),
              *jquant.quantize_1x128(x.T, power_of_two_scales=pow2))
    else:
      want = getattr(jquant, op)(x, power_of_two_scales=pow2)
    assert_bitwise(_interpret(_kernel_fn(op, pow2), x), want)


# ---- division by the group's reciprocal (QuantizeConfig(division="reciprocal")) ----

RECIPROCAL = qk.QuantizeConfig(division="reciprocal")


def _two_sum(a, b):
  s = a + b
  bb = s - a
  return s, (a - (s - bb)) + (b - bb)


def _rn32(t, e):
  """float32 rounding (to nearest even) of the exact t + e, an error-free float64 pair."""
  c = t.astype(np.float32)
  c2 = np.nextafter(c, np.where(t > c, np.float32(np.inf), np.float32(-np.inf)))
  tie = (t != c) & (2 * t == c.astype(np.float64) + c2)  # float32 midpoints are float64s
  return np.where(tie & (e != 0) & ((e > 0) == (c2 > c)), c2, c)


def model_reciprocal_division(x, s, corrections=1):
  """The kernels' "reciprocal" sequence (pallas/quant_math.py) in float64 arithmetic
  that emulates float32 mul/fma exactly: products of float32s are exact in float64,
  sums are made error-free (two_sum) and rounded once. corrections: 1 for 16-bit
  inputs, 2 for float32 ones."""
  f32 = np.float32
  with np.errstate(all="ignore"):
    lift = np.where(s < f32(2.0**-60), f32(2.0**64), f32(1))
    s = s * lift
    neg_lift, neg_r = -lift, -(f32(1) / s)
    s_fma = np.where(s < np.inf, s, f32(0))
    neg_x = x * neg_lift
    q = (neg_x * neg_r).astype(f32)
    for _ in range(corrections):
      rem, err = _two_sum(q.astype(np.float64) * s_fma, neg_x.astype(np.float64))
      assert np.all((err == 0) | ~np.isfinite(rem)), "the remainder must be exact"
      rem = rem.astype(f32)
      t, err = _two_sum(rem.astype(np.float64) * neg_r, q.astype(np.float64))
      q = _rn32(t, np.where(np.isfinite(t), err, 0))
    return q


def _mantissas(dtype):
  """Every value of a 16-bit float format in [1, 2)."""
  bits = {BF16: 7, F16: 10}[dtype]
  one = np.asarray(1.0, dtype).view(np.uint16)
  return (np.arange(1 << bits, dtype=np.uint16) | one).view(dtype).astype(np.float32)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_reciprocal_division_is_exact_for_16_bit_inputs(dtype):
  """q from the reciprocal sequence is FP8-identical to q from IEEE division for every
  pair of (x, amax) mantissas; the quotient itself is identical wherever it is not far
  below FP8's range. Exponents: where nothing under- or overflows the sequence scales
  with x and amax (one pair of binades covers it); bf16 also at every amax binade where
  subnormals appear (x down to the subnormals), and at the top of the range."""
  m = _mantissas(dtype)
  xm, am = (a.ravel() for a in np.meshgrid(m, m, indexing="ij"))
  pairs = [(0, 0), (0, -1), (-5, 0)]
  if dtype == BF16:
    pairs += [(xe, ae) for ae in list(range(-133, -45, 3)) + [-60, -61, 120, 127]
              for xe in range(max(ae - 50, -133), ae + 1, 4)]
  else:
    pairs += [(-24, -10), (-20, 15)]
  x = np.concatenate([np.ldexp(xm, xe) for xe, _ in pairs]).astype(np.float32)
  amax = np.concatenate([np.ldexp(am, ae) for _, ae in pairs]).astype(np.float32)
  if dtype == BF16:  # subnormal x under every amax of two binades
    sub = np.arange(1, 128, dtype=np.uint16).view(BF16).astype(np.float32)
    x = np.concatenate([x, np.repeat(sub, 2 * len(m))])
    amax = np.concatenate([amax, np.tile(np.concatenate([np.ldexp(m, -120), m]), len(sub))])
  x = np.where(np.abs(x) <= amax, x, amax).astype(np.float32)  # a group's elements
  x = np.where(np.arange(x.size) % 2 == 0, x, -x).astype(np.float32)
  s = model_scale(amax, pow2=False)
  with np.errstate(all="ignore"):
    want = (x / s).astype(np.float32)
  got = model_reciprocal_division(x, s)
  fp8 = lambda q: np.clip(q, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
  np.testing.assert_array_equal(fp8(got), fp8(want))
  visible = np.abs(want) >= 2.0**-40
  np.testing.assert_array_equal(got[visible], want[visible])
  # A plain product by the reciprocal is not enough (the test can fail).
  assert np.any(fp8((x * (np.float32(1) / s)).astype(np.float32)) != fp8(want))


def test_reciprocal_division_of_float32_inputs():
  """Float32 x (the GEMM epilogues' FP8 outputs) take the correction twice: the quotient
  is IEEE division's wherever it is not far below FP8's range, the FP8 values everywhere.
  Random groups over 80 binades, quotients next to float32 midpoints (where a
  correction from a non-faithful first product would round the wrong way), and
  divisors whose reciprocal rounds by almost half an ulp (significands near 2)."""
  rng = np.random.default_rng(11)
  n = 200_000
  amax = np.ldexp(rng.uniform(1, 2, n), rng.integers(-40, 40, n)).astype(np.float32)
  s_rand = model_scale(amax, pow2=False)
  x_rand = (amax * rng.uniform(-1, 1, n)).astype(np.float32)
  s_mid = rng.uniform(1, 2, n).astype(np.float32)
  mid = rng.uniform(1, 2, n).astype(np.float32).astype(np.float64) + 2.0**-24
  x_mid = (mid * s_mid).astype(np.float32)
  big = rng.uniform(1.75, 2, n)
  s_big = np.ldexp(big, rng.integers(-20, 20, n)).astype(np.float32)
  x_big = np.ldexp(big * rng.uniform(0.85, 1, n), rng.integers(-20, 20, n)).astype(np.float32)
  x = np.concatenate([x_rand, x_mid, x_big])
  s = np.concatenate([s_rand, s_mid, s_big])
  with np.errstate(all="ignore"):
    want = (x / s).astype(np.float32)
  got = model_reciprocal_division(x, s, corrections=2)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  # The product by the reciprocal alone is not the quotient (the test can fail).
  assert np.any((x * (np.float32(1) / s)).astype(np.float32) != want)


def test_reciprocal_division_special_values():
  """Signed zeros keep their sign; a group with scale Inf gives signed zeros for finite
  x and NaN for Inf; scale NaN gives NaN; scale 1 gives x."""
  x = np.float32([0.0, -0.0, 1.5, -2.0, np.inf, 3.0, -0.0, 2.0**-130, -7.0])
  s = np.float32([3.0, 3.0, np.inf, np.inf, np.inf, np.nan, 1.0, 1.0, 1.0])
  with np.errstate(all="ignore"):
    want = x / s
  for corrections in (1, 2):
    got = model_reciprocal_division(x, s, corrections)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), (corrections, got, want)


@pytest.mark.parametrize("op,shape,dtype,pow2", [
    ("quantize_1x128_with_transpose", (256, 384), BF16, False),
    ("quantize_1x128_with_transpose", (200, 300), F16, True),
    ("quantize_1x128_with_transpose", (130, 260), F32, False),   # f32: two corrections
    ("quantize_1x128", (70, 300), BF16, True),
    ("quantize_128x128", (256, 260), F16, False),
])
def test_reciprocal_division_interpret(op, shape, dtype, pow2):
  """The kernels with division="reciprocal" (interpret mode: the per-group rows, the
  2^64 lift of small groups; the per-element sequence is XLA's division here)."""
  x = random_input(shape, dtype, seed=8)
  fn = _kernel_fn(op, pow2, RECIPROCAL, with_transpose=op == "quantize_128x128")
  assert_bitwise(_interpret(fn, x), expected(op, x, pow2, op == "quantize_128x128"))


@pytest.mark.parametrize("pow2", [False, True])
def test_reciprocal_division_edge_values_interpret(pow2):
  rows = jnp.asarray(edge_rows(gpu=False)).astype(jnp.bfloat16)
  op = "quantize_1x128_with_transpose"
  for x in (rows, rows.T):
    assert_bitwise(_interpret(_kernel_fn(op, pow2, RECIPROCAL), x), expected(op, x, pow2))


# ---- lowering for CUDA (no GPU needed) --------------------------------------------

LOWERINGS = [
    ("quantize_1x128", (4096, 7168), BF16, False, None),
    ("quantize_1x128", (4096, 7168), F32, True, None),
    ("quantize_1x128", (33, 300), F16, False, None),
    ("quantize_1x128", (8192, 7168), BF16, False, qk.QuantizeConfig(tile_rows=64, tile_cols=256)),
    ("quantize_1x128_with_transpose", (4096, 7168), BF16, False, None),
    ("quantize_1x128_with_transpose", (16384, 2048), BF16, True, None),
    ("quantize_1x128_with_transpose", (4096, 18432), F32, False, None),
    ("quantize_1x128_with_transpose", (4096, 7168), BF16, False,
     qk.QuantizeConfig(tile_rows=256, tile_cols=128)),
    ("quantize_128x128", (7168, 2048), BF16, False, None),
    ("quantize_128x128", (18432, 7168), F32, True, None),
]


def _lower(op, shape, dtype, pow2, config, with_transpose=False):
  fn = _kernel_fn(op, pow2, config, with_transpose)
  return jax.jit(fn).trace(jax.ShapeDtypeStruct(shape, dtype)).lower(
      lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("op,shape,dtype,pow2,config", LOWERINGS)
def test_lowers_for_cuda(op, shape, dtype, pow2, config):
  """Tracing, layout inference and Mosaic lowering for sm_90a, without a GPU; the
  division is PTX div.rn.f32 (never Mosaic's `/`, which compiles to div.full.f32)."""
  text = _lower(op, shape, dtype, pow2, config)
  assert "mosaic_gpu" in text and "div.rn.f32" in text
  assert "arith.divf" not in text


@pytest.mark.parametrize("t,x_rows", [(1, 1), (7, 7), (16, 16), (1000, 1000), (1001, 1008),
                                      (4096, 4096)])
def test_row_wise_pads_x_to_whole_8_row_tiles_only(t, x_rows):
  """The row-wise quantiser's last row tile loads and stores only x's rows: x is
  padded (a copy of it) only where its rows are no whole 8-row tiles."""
  pads = [line for line in _lower("quantize_1x128", (t, 7168), BF16, False, None).splitlines()
          if "stablehlo.pad" in line]
  if x_rows == t:
    assert not pads, pads
  else:
    assert len(pads) == 1 and f"tensor<{x_rows}x7168xbf16>" in pads[0], pads
  # Groups spanning rows keep whole tiles (1000 rows padded to 1024).
  pads = [line for line in _lower("quantize_1x128_with_transpose", (1000, 7168), BF16, False,
                                  None).splitlines() if "stablehlo.pad" in line]
  assert len(pads) == 1 and "tensor<1024x7168xbf16>" in pads[0], pads


@pytest.mark.parametrize("op,dtype,pow2,fma", [
    ("quantize_1x128_with_transpose", BF16, False, True),
    ("quantize_1x128_with_transpose", BF16, True, False),
    ("quantize_1x128", F16, False, True),
    ("quantize_128x128", BF16, False, True),
    ("quantize_1x128_with_transpose", F32, False, True),
])
def test_reciprocal_division_lowers_for_cuda(op, dtype, pow2, fma):
  """division="reciprocal": mul.rn/fma.rn.f32 per element (div.rn.f32 only for the
  scales and reciprocals; float32 inputs take the correction twice)."""
  text = _lower(op, (4096, 7168), dtype, pow2, RECIPROCAL)
  assert "mosaic_gpu" in text and "arith.divf" not in text
  assert ("fma.rn.f32" in text) == fma
  assert "mul.rn.f32" in text


def test_128x128_with_transpose_lowers_for_cuda():
  text = _lower("quantize_128x128", (7168, 2048), BF16, False, None, with_transpose=True)
  assert "div.rn.f32" in text and "arith.divf" not in text


def test_lowers_for_sm100(monkeypatch):
  """Blackwell: the same kernels, lowered with Mosaic's arch set to 10.0 (Python side;
  tools/xcompile_quantize_sm100.py compiles them for sm_100a on a GPU machine)."""
  import jax.experimental.mosaic.gpu.utils as mgpu_utils
  monkeypatch.setattr(mgpu_utils, "_infer_arch", lambda: (10, 0))
  jax.clear_caches()
  try:
    for op in qk.OPS:
      assert "div.rn.f32" in _lower(op, (384, 640), BF16, False, None,
                                    with_transpose=op == "quantize_128x128")
  finally:
    jax.clear_caches()


# ---- validation --------------------------------------------------------------------

def test_rejects_bad_input():
  with pytest.raises(TypeError, match="x must be bfloat16"):
    qk.quantize_1x128(jnp.ones((4, 128), jnp.int32))
  with pytest.raises(ValueError, match="2-D"):
    qk.quantize_1x128(jnp.ones((2, 4, 128), jnp.float32))
  with pytest.raises(ValueError, match="tile_rows"):
    qk.quantize_1x128_with_transpose(jnp.ones((4, 128)), config=qk.QuantizeConfig(64, 128))
  with pytest.raises(ValueError, match="tile_cols"):
    qk.quantize_1x128(jnp.ones((4, 128)), config=qk.QuantizeConfig(128, 192))
  with pytest.raises(ValueError, match="128 x 128"):
    qk.quantize_128x128(jnp.ones((4, 128)), config=qk.QuantizeConfig(256, 128))
  with pytest.raises(ValueError, match="SMEM"):
    qk.QuantizeConfig(256, 256).check("quantize_1x128_with_transpose", F32)
  assert qk.unsupported_reason("quantize_1x128", (0, 5), F32) == "empty array"
  assert qk.unsupported_reason("quantize_1x128", (3, 5), F32) is None


# ---- on a Hopper GPU ---------------------------------------------------------------

DEEPSEEK_SHAPES = [(4096, 7168), (8192, 7168), (16384, 2048), (4096, 18432)]


@requires_gpu(major=9)
@pytest.mark.parametrize("shape,pow2", [(s, i % 2 == 1) for i, s in enumerate(DEEPSEEK_SHAPES)]
                         + [((8192, 7168), True)])
@pytest.mark.parametrize("op", ["quantize_1x128", "quantize_1x128_with_transpose"])
@pytest.mark.parametrize("division", qk.DIVISIONS)
def test_deepseek_shapes_gpu(op, shape, pow2, division):
  x = random_input(shape, BF16, seed=11)
  config = qk.QuantizeConfig(division=division)
  out = jax.block_until_ready(jax.jit(_kernel_fn(op, pow2, config))(x))
  assert_bitwise(out, expected(op, x, pow2))


@requires_gpu(major=9)
@pytest.mark.parametrize("shape,pow2,with_transpose", [
    ((7168, 2048), False, True), ((2112, 7168), True, True), ((18432, 7168), False, False)])
def test_128x128_gpu(shape, pow2, with_transpose):
  w = random_input(shape, BF16, seed=12)
  out = jax.block_until_ready(jax.jit(_kernel_fn("quantize_128x128", pow2,
                                                 with_transpose=with_transpose))(w))
  assert_bitwise(out, expected("quantize_128x128", w, pow2, with_transpose))


@requires_gpu(major=9)
@pytest.mark.parametrize("pow2", [False, True])
def test_edge_values_gpu(pow2):
  """Every edge case, subnormals included (the GPU keeps them: Mosaic compiles without FTZ)."""
  rows = jnp.asarray(edge_rows(gpu=True))
  blocks = jnp.asarray(edge_blocks(gpu=True))
  for op, x, tr in (("quantize_1x128", rows, False),
                    ("quantize_1x128_with_transpose", rows.T, False),
                    ("quantize_128x128", blocks, True)):
    out = jax.block_until_ready(jax.jit(_kernel_fn(op, pow2, with_transpose=tr))(x))
    assert_bitwise(out, expected(op, x, pow2, tr))


@requires_gpu(major=9)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_reciprocal_division_edge_values_gpu(pow2, dtype):
  """division="reciprocal" on every edge case, subnormals included, as rows and columns,
  and as 128 x 128 blocks."""
  rows = jnp.asarray(edge_rows(gpu=True)).astype(dtype)
  blocks = jnp.asarray(edge_blocks(gpu=True)).astype(dtype)
  for op, x, tr in (("quantize_1x128_with_transpose", rows, False),
                    ("quantize_1x128_with_transpose", rows.T, False),
                    ("quantize_128x128", blocks, True)):
    fn = _kernel_fn(op, pow2, RECIPROCAL, with_transpose=tr)
    assert_bitwise(jax.block_until_ready(jax.jit(fn)(x)), expected(op, x, pow2, tr))


@requires_gpu(major=9)
@pytest.mark.parametrize("dtype,seed", [(BF16, 31), (F16, 32)])
def test_reciprocal_division_random_gpu(dtype, seed):
  """Many groups at every binade (random_input spans 2^-28 .. 2^28) and tiny ones."""
  x = random_input((4096, 2048), dtype, seed=seed)
  if dtype == BF16:
    x = x * jnp.asarray(np.exp2(np.arange(4096) % 160 - 140.0)[:, None], jnp.float32).astype(BF16)
  fn = _kernel_fn("quantize_1x128_with_transpose", False, RECIPROCAL)
  out = jax.block_until_ready(jax.jit(fn)(x))
  assert_bitwise(out, expected("quantize_1x128_with_transpose", x, False))


@requires_gpu(major=9)
@pytest.mark.parametrize("shape,dtype", [((4100, 7000), F32), ((1, 7168), BF16),
                                         ((333, 130), F16)])
def test_odd_shapes_gpu(shape, dtype):
  x = random_input(shape, dtype, seed=13)
  for op in ("quantize_1x128", "quantize_1x128_with_transpose"):
    out = jax.block_until_ready(jax.jit(_kernel_fn(op, False))(x))
    assert_bitwise(out, expected(op, x, False))


@requires_gpu(major=9)
def test_deterministic_gpu():
  x = random_input((4096, 7168), BF16, seed=14)
  fn = jax.jit(_kernel_fn("quantize_1x128_with_transpose", False))
  a, b = fn(x), fn(x)
  for u, v in zip(a, b):
    np.testing.assert_array_equal(np.asarray(u).view(np.uint8), np.asarray(v).view(np.uint8))


@requires_gpu(major=9)
def test_cross_compiles_for_sm100a():
  """Compile-only (there is no Blackwell GPU here): on a Hopper machine,
  tools/xcompile_quantize_sm100.py compiles every quantiser for sm_100a and checks its PTX."""
  tool = pathlib.Path(__file__).resolve().parent.parent / "tools" / "xcompile_quantize_sm100.py"
  run = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
  report = json.loads(run.stdout.strip().splitlines()[-1])
  assert report["ok"], report


# ---- through the API (jax_fp8.quantize_*, backend=) ---------------------------------

def test_api_pallas_interpret():
  """backend="pallas" in interpret mode: batch dims fold into T; the results are the
  kernels' (bitwise the model's)."""
  import jax_fp8
  x = random_input((2 * 3 * 40, 300), BF16, seed=21).reshape(2, 3, 40, 300)
  w = random_input((200, 260), F32, seed=22)
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    q, s = jax.jit(lambda x: jax_fp8.quantize_1x128(x, backend="pallas"))(x)
    qt = jax.jit(lambda x: jax_fp8.quantize_1x128_with_transpose(
        x, power_of_two_scales=True, backend="pallas"))(x[0, 0])
    qw = jax.jit(lambda w: jax_fp8.quantize_128x128(w, backend="pallas"))(w)
    qwt = jax.jit(lambda w: jax_fp8.quantize_128x128_with_transpose(w, backend="pallas"))(w)
  want_q, want_s = expected("quantize_1x128", x.reshape(-1, 300), False)
  assert q.shape == x.shape and s.shape == (2, 3, 40, 3)
  assert_bitwise((q.reshape(-1, 300), s.reshape(-1, 3)), (want_q, want_s))
  assert_bitwise(qt, expected("quantize_1x128_with_transpose", x[0, 0], True))
  assert_bitwise(qw, expected("quantize_128x128", w, False))
  assert_bitwise(qwt, expected("quantize_128x128", w, False, with_transpose=True))
  # The jnp version (the reference elsewhere) gives the same four arrays.
  assert_bitwise(jax_fp8.quantize_128x128_with_transpose(w, backend="jnp"), qwt)


def test_api_backends_on_the_cpu():
  import jax_fp8
  x = random_input((64, 256), BF16, seed=23)
  # No GPU and no interpret mode: "auto" is the jnp version, "pallas" cannot run.
  auto = jax.jit(jax_fp8.quantize_1x128_with_transpose)(x)
  ref = jax_fp8.quantize_1x128_with_transpose(x, backend="jnp")
  for a, r in zip(auto, ref):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(r).view(np.uint8))
  text = jax.jit(jax_fp8.quantize_1x128).trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" not in text  # no Hopper GPU here: auto never traces the kernel
  with pytest.raises(jax_fp8.BackendUnavailableError, match="Hopper or Blackwell"):
    jax_fp8.quantize_1x128(x, backend="pallas")
  with pytest.raises(jax_fp8.BackendUnavailableError, match="input dtype"):
    with testing.gpu_interpret_mode():
      jax_fp8.quantize_128x128(jnp.ones((4, 4), jnp.float8_e5m2), backend="pallas")
  with pytest.raises(ValueError, match="backend must be one of"):
    jax_fp8.quantize_128x128(x, backend="cuda")
  with pytest.raises(ValueError, match="2-D"):
    jax_fp8.quantize_1x128_with_transpose(x[0])
  q, s = jax_fp8.quantize_1x128(jnp.zeros((0, 3, 256)), backend="pallas")  # nothing to launch
  assert q.shape == (0, 3, 256) and s.shape == (0, 3, 2)


def test_api_explicit_sharding_is_not_for_the_kernel():
  """The kernels take whole arrays: an input sharded over Explicit mesh axes stays with
  jnp under "auto", and "pallas" says why it cannot run."""
  import jax_fp8
  from jax.sharding import AxisType, NamedSharding, PartitionSpec
  mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2])
  with jax.set_mesh(mesh):
    x = jax.device_put(random_input((256, 256), F32), NamedSharding(mesh, PartitionSpec("x")))
    with testing.gpu_interpret_mode():
      with pytest.raises(jax_fp8.BackendUnavailableError, match="Explicit mesh axes"):
        jax_fp8.quantize_1x128(x, backend="pallas")


@requires_gpu(major=9)
def test_api_auto_uses_the_kernel_gpu():
  import jax_fp8
  x = random_input((2 * 4096, 7168), BF16, seed=24).reshape(2, 4096, 7168)
  text = jax.jit(jax_fp8.quantize_1x128).trace(x).lower().as_text()
  assert "mosaic_gpu" in text
  q, s = jax.jit(jax_fp8.quantize_1x128)(x)
  assert_bitwise((q.reshape(-1, 7168), s.reshape(-1, 56)),
                 expected("quantize_1x128", x.reshape(-1, 7168), False))
  out = jax.jit(jax_fp8.quantize_1x128_with_transpose)(x[0])
  assert_bitwise(out, expected("quantize_1x128_with_transpose", x[0], False))
