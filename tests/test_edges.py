"""The contract at its edges (issue 19): exact power-of-two scales, NaN and Inf
in the quantisers, extreme and infinite scales in the op, jax_enable_x64, and a
property-style sweep of edge values through every backend that runs here
(reference and auto on the CPU, both Pallas kernels in GPU interpret mode)
against the float64 contract.

Cases that fail because of known kernel bugs (the kernels are being rewritten)
are xfail(strict=True): they start failing the suite once the bug is fixed.
"""
import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_fp8
from jax_fp8 import quantize, testing
from jax_fp8.pallas import hopper, sm90, sm100

F32, BF16 = np.dtype(jnp.float32), np.dtype(jnp.bfloat16)
INTERPRET_X64 = ("GPU interpret mode (jax 0.11.2) under x64: int64 in the interpreter's loop "
                 "state ('expect operands to be compatible with condition block arguments')")
ON_CPU = jax.default_backend() == "cpu"


def _tol(backend, out_dtype):
  """The project's bound; on a GPU, "auto" runs the tensor-core kernels (about
  14-bit sums inside a K block: README, accuracy on hardware)."""
  if not ON_CPU and backend == "auto" and np.dtype(out_dtype) == F32:
    return 2.5e-4
  return None
QUANTIZERS = {
    "1x128": lambda x, p: jax_fp8.quantize_1x128(x, power_of_two_scales=p),
    "128x128": lambda x, p: jax_fp8.quantize_128x128(x, power_of_two_scales=p),
}


def _groups_with_amax(amax: np.ndarray, layout: str, seed: int = 0) -> np.ndarray:
  """float32 input whose groups (1x128 rows, or 128x128 blocks side by side)
  have exactly the given amax; the other elements are smaller, of both signs."""
  rng = np.random.default_rng(seed)
  amax = np.asarray(amax, np.float32)
  g = len(amax)
  shape = (g, 128) if layout == "1x128" else (128, 128 * g)
  x = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
  if layout == "1x128":
    x = x * amax[:, None]
    x[np.arange(g), rng.integers(128, size=g)] = amax * rng.choice([-1, 1], size=g)
  else:
    x = x * np.repeat(amax, 128)[None, :]
    x[rng.integers(128, size=g), np.arange(g) * 128 + rng.integers(128, size=g)] = (
        amax * rng.choice([-1, 1], size=g))
  return x


def _scales(s, layout):
  return np.asarray(s).reshape(-1)


def _amax_values():
  """Group maxima across float32's range, at and beside 448 * 2^e boundaries."""
  rng = np.random.default_rng(1)
  e = np.arange(-133, 120)
  at = (448.0 * np.exp2(e)).astype(np.float32)
  values = [at, np.nextafter(at, np.float32(np.inf)), np.nextafter(at, np.float32(0)),
            np.exp2(rng.uniform(-125, 127, 300)).astype(np.float32),
            np.float32([np.finfo(np.float32).max, np.finfo(np.float32).tiny, 2.0 ** -149, 1.0])]
  return np.concatenate(values).astype(np.float32)


# ---- quantisers ------------------------------------------------------------------

@pytest.mark.parametrize("layout", list(QUANTIZERS))
def test_power_of_two_scales_are_exact_and_the_smallest(layout):
  amax = _amax_values()
  x = _groups_with_amax(amax, layout)
  q, s = QUANTIZERS[layout](x, True)
  s = _scales(s, layout)
  bits = s.view(np.uint32)
  # An exact, normal power of two: no mantissa bits, exponent field 1..254 (its UE8M0 code).
  assert np.all(bits & 0x7FFFFF == 0), s[bits & 0x7FFFFF != 0][:5]
  assert np.all((bits >> 23 >= 1) & (bits >> 23 <= 254))
  a64, s64 = amax.astype(np.float64), s.astype(np.float64)
  assert np.all(a64 <= 448 * s64), amax[a64 > 448 * s64][:5]
  # The smallest such power (2^-126 at least: scales stay normal).
  smallest = (a64 > 448 * s64 / 2) | (s == np.float32(2.0 ** -126))
  assert np.all(smallest), amax[~smallest][:5]
  # So nothing clips: each group's largest |q| is amax / scale rounded to e4m3.
  qf = np.abs(np.asarray(q.astype(jnp.float32), np.float64))
  group_max = qf.max(1) if layout == "1x128" else qf.reshape(128, -1, 128).max((0, 2))
  want = np.asarray(jnp.asarray((a64 / s64).astype(np.float32)).astype(quantize.FP8)
                    .astype(jnp.float32))
  normal = amax >= np.finfo(np.float32).tiny  # XLA on the CPU reads subnormal inputs as 0
  np.testing.assert_array_equal(group_max[normal], want[normal])


@pytest.mark.parametrize("layout", list(QUANTIZERS))
def test_scales_are_amax_over_448_or_1(layout):
  amax = _amax_values()
  x = _groups_with_amax(amax, layout, seed=2)
  _, s = QUANTIZERS[layout](x, False)
  s = _scales(s, layout)
  want = amax / np.float32(448.0)  # numpy: correctly rounded float32 division
  want = np.where(want >= np.finfo(np.float32).tiny, want, np.float32(1.0))
  np.testing.assert_array_equal(s, want)


@pytest.mark.parametrize("layout", list(QUANTIZERS))
def test_q_is_a_true_float32_division(layout):
  """Values within 2 ulps of e4m3 rounding midpoints (times a non-power-of-two
  scale): only a correctly rounded x / scale rounds all of them as numpy does;
  x * (1 / scale), XLA's rewrite of a division by a broadcast, does not."""
  rng = np.random.default_rng(4)
  e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  e4m3 = np.unique(e4m3[np.isfinite(e4m3) & (e4m3 > 0)])
  midpoints = ((e4m3[:-1] + e4m3[1:]) / 2)
  midpoints = midpoints[midpoints < 440]
  g = 64
  amax = (448 * np.exp2(rng.uniform(-3, 3, g)) * 1.2345).astype(np.float32)
  x = _groups_with_amax(amax, layout, seed=5)
  spread = (np.repeat(amax / np.float32(448), 128)[None, :] if layout == "128x128"
            else (amax / np.float32(448))[:, None])
  near = (rng.choice(midpoints, x.shape) * rng.choice([-1, 1], x.shape) * spread)
  near = near.astype(np.float32)
  for _ in range(2):
    step = rng.integers(-1, 2, x.shape)
    near = np.where(step > 0, np.nextafter(near, np.float32(np.inf)),
                    np.where(step < 0, np.nextafter(near, np.float32(-np.inf)), near))
  keep = np.abs(x) == np.repeat(amax, 128)[None, :] if layout == "128x128" else (
      np.abs(x) == amax[:, None])
  x = np.where(keep, x, near).astype(np.float32)
  q, s = jax.jit(lambda x: QUANTIZERS[layout](x, False))(x)
  np.testing.assert_array_equal(_scales(s, layout), amax / np.float32(448))
  true = np.clip(x / spread, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
  twice = np.clip(x * (np.float32(1) / spread), -448, 448).astype(ml_dtypes.float8_e4m3fn)
  assert np.any(twice.view(np.uint8) != true)  # the case tells the two apart
  np.testing.assert_array_equal(np.asarray(q).view(np.uint8), true)


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("layout", list(QUANTIZERS))
def test_nan_and_inf_show_in_the_group_scale(layout, pow2):
  # Groups: 0 plain, 1 one NaN, 2 one +Inf, 3 one -Inf, 4 NaN and Inf, 5 all zero.
  x = _groups_with_amax(np.float32([3.0, 3.0, 3.0, 3.0, 3.0, 1.0]), layout, seed=3)
  col = lambda g, i: (g, i) if layout == "1x128" else (i, g * 128 + i)
  group = (lambda g: x[g]) if layout == "1x128" else (lambda g: x[:, g * 128:(g + 1) * 128])
  x[col(1, 5)] = np.nan
  x[col(2, 7)] = np.inf
  x[col(3, 9)] = -np.inf
  x[col(4, 2)] = np.nan
  x[col(4, 3)] = np.inf
  group(5)[...] = 0.0
  q, s = QUANTIZERS[layout](x, pow2)
  s = _scales(s, layout)
  qf = np.asarray(q.astype(jnp.float32))
  qgroup = (lambda g: qf[g]) if layout == "1x128" else (lambda g: qf[:, g * 128:(g + 1) * 128])
  assert np.isfinite(s[0]) and np.all(np.isfinite(qgroup(0)))
  for g in (1, 4):  # NaN: the scale and every q of the group
    assert np.isnan(s[g]) and np.all(np.isnan(qgroup(g)))
  for g, i in ((2, 7), (3, 9)):  # +-Inf: scale +Inf, the Inf's q NaN, finite ones 0
    assert s[g] == np.inf
    qg = qgroup(g).copy()
    where = (i,) if layout == "1x128" else (i, i)
    assert np.isnan(qg[where])
    qg[where] = 0
    assert np.all(qg == 0)
  assert s[5] == 1.0 and np.all(qgroup(5) == 0)
  # jit gives the same bits.
  q2, s2 = jax.jit(lambda x: QUANTIZERS[layout](x, pow2))(x)
  np.testing.assert_array_equal(np.asarray(s2).reshape(-1).view(np.uint32), s.view(np.uint32))


def test_bfloat16_inf_and_subnormal_only_groups():
  x = jnp.zeros((3, 256), jnp.float32)
  x = x.at[0, 5].set(jnp.inf).at[0, 6].set(2.0)              # +Inf group, then a plain one
  x = x.at[0, 130].set(5.0)
  x = x.at[1, :128].set(1e-40).at[1, 130].set(-1e-41)        # subnormal float32 only
  for pow2, tiny_scale in ((False, 1.0), (True, 2.0 ** -126)):
    _, s = jax_fp8.quantize_1x128(x.astype(jnp.bfloat16), power_of_two_scales=pow2)
    s = np.asarray(s)
    assert s[0, 0] == np.inf and np.isfinite(s[0, 1])
    _, s = jax_fp8.quantize_1x128(x, power_of_two_scales=pow2)
    s = np.asarray(s)
    # amax / 448 is below float32's normal range: 1; the power-of-two rule's
    # smallest normal power of two.
    assert s[1, 0] == tiny_scale and s[1, 1] == tiny_scale and s[2, 0] == 1.0


# ---- the op's contract: scales multiply each block sum ----------------------------

@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_scale_product_multiplies_the_block_sum(backend):
  ops = testing.random_operands(20, 16, 256, 384)
  # 2^-120 * 2^120 = 1 in every K block: a dequantise-first path overflows b.
  ops.a_scale = jnp.full_like(ops.a_scale, 2.0 ** -120)
  ops.b_scale = jnp.full_like(ops.b_scale, 2.0 ** 120)
  out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, out_dtype=F32, backend=backend))(
      *ops.args()[:4])
  ref = testing.reference_f64(*ops.args()[:4])
  assert np.all(np.isfinite(ref))
  testing.assert_close(out, ref, F32, tol=_tol(backend, F32))


def _infinite_scale_operands(which):
  """Two rows (a) or two N blocks (b) with an infinite scale in K block 1, over
  block sums of both signs and a zero block sum."""
  ops = testing.random_operands(21, 8, 256, 300)
  a = np.array(ops.a.astype(jnp.float32))
  a[2, 128:256] = 0.0  # row 2's block 1 sums to 0: times Inf is NaN
  ops.a = jnp.asarray(a).astype(quantize.FP8)
  if which == "a":
    ops.a_scale = ops.a_scale.at[1, 1].set(jnp.inf).at[2, 1].set(jnp.inf)
  else:
    ops.b_scale = ops.b_scale.at[1, 1].set(jnp.inf)
  return ops


@pytest.mark.parametrize("which", ["a", "b"])
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_infinite_scale_gives_inf_of_the_block_sums_sign(backend, which):
  ops = _infinite_scale_operands(which)
  out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, out_dtype=F32, backend=backend))(
      *ops.args()[:4])
  ref = testing.reference_f64(*ops.args()[:4])
  assert np.isposinf(ref).any() and np.isneginf(ref).any() and np.isfinite(ref).any()
  assert np.isnan(ref).any()  # row 2's zero block sum times Inf
  testing.assert_same_nonfinite_and_close(out, ref, F32, tol=_tol(backend, F32))


def test_reference_f64_is_the_per_block_contract():
  ops = testing.random_operands(22, 9, 200, 300, with_c=True)
  a = np.asarray(ops.a.astype(jnp.float32), np.float64)
  b = np.asarray(ops.b.astype(jnp.float32), np.float64)
  sa = np.repeat(np.asarray(ops.a_scale, np.float64), 128, 1)[:, :300]
  sb = np.repeat(np.repeat(np.asarray(ops.b_scale, np.float64), 128, 0), 128, 1)[:200, :300]
  dequantised = (a * sa) @ (b * sb).T + 0.5 * np.asarray(ops.c, np.float64)
  ref = testing.reference_f64(*ops.args(), beta=0.5)
  # Only the float32 rounding of each scale product differs.
  assert np.linalg.norm(ref - dequantised) / np.linalg.norm(dequantised) < 1e-7


# ---- property-style sweep of edge values ----------------------------------------

def _sweep(backend, seed, out_dtype, *, with_c):
  ops = testing.edge_operands(seed, 40, 300, 300, with_c=with_c)
  beta = -0.5 if with_c else 1.0
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, beta=beta, out_dtype=out_dtype,
                                                  backend=backend))
  if backend in ("pallas_sm90", "pallas_sm100"):
    with testing.gpu_interpret_mode(detect_races=False, uninitialized_memory="nan"):
      out = jax.block_until_ready(f(*ops.args()))
  else:
    out = f(*ops.args())
  # XLA on the CPU (so the reference and interpret mode there) reads subnormal
  # floats as 0; a GPU may or may not: there either reading passes.
  for flush in (True,) if ON_CPU else (True, False):
    ref = testing.reference_f64(*ops.args(), beta=beta, flush_subnormal_scales=flush)
    magnitude = testing.contract_magnitude(*ops.args(), beta=beta, flush_subnormal_scales=flush)
    assert not np.all(np.isnan(ref))  # the case keeps finite entries to compare
    try:
      # atol: subnormal float32 terms (c), which XLA on the CPU flushes to zero.
      testing.assert_same_nonfinite_and_close(out, ref, out_dtype, magnitude=magnitude,
                                              tol=_tol(backend, out_dtype), atol=1e-30)
      return
    except AssertionError:
      if flush is False or ON_CPU:
        raise


SWEEP = ([("reference", seed) for seed in range(8)] + [("auto", seed) for seed in range(2)]
         + [("pallas_sm90", seed) for seed in range(2)]
         + [("pallas_sm100", seed) for seed in range(2)])


@pytest.mark.parametrize("backend,seed", SWEEP, ids=[f"{b}-{s}" for b, s in SWEEP])
def test_edge_value_sweep(backend, seed):
  _sweep(backend, seed, F32 if seed % 2 == 0 else BF16, with_c=seed % 4 < 2)


def test_sweep_catches_scales_multiplied_into_the_operands(monkeypatch):
  """The sweep can fail: the old reference (dequantise, then one dot) does."""
  from jax_fp8 import reference

  def dequantise_first(a, a_scale, b, b_scale, c=None, *, beta=1.0, out_dtype=BF16):
    n, k = b.shape
    a32 = a.astype(jnp.float32) * quantize.expand_1x128_scale(a_scale, k)
    b32 = b.astype(jnp.float32) * quantize.expand_128x128_scale(b_scale, n, k)
    acc = jnp.dot(a32, b32.T, precision="highest")
    return (acc if c is None else acc + beta * c.astype(jnp.float32)).astype(out_dtype)

  monkeypatch.setattr(reference, "blockwise_fp8_dot", dequantise_first)
  with pytest.raises(AssertionError, match="differ in being"):
    _sweep("reference", 0, F32, with_c=True)


# ---- Pallas kernels at the edges (GPU interpret mode) ------------------------------

SMALL = hopper.HopperConfig(tile_m=64, tile_n=128, wg_split="n", stages=2, num_sms=2)


@pytest.mark.parametrize("which", ["a", "b"])
def test_hopper_two_block_steps_infinite_scale_in_the_last_odd_block(which):
  """3 K blocks in steps of 2: the second block of the last step lies past K."""
  ops = testing.random_operands(23, 40, 300, 300)
  if which == "a":
    ops.a_scale = ops.a_scale.at[5, 2].set(jnp.inf)
  else:
    ops.b_scale = ops.b_scale.at[1, 2].set(jnp.inf)
  cfg = dataclasses.replace(SMALL, k_step=2)
  f = jax.jit(lambda *x: hopper.blockwise_fp8_dot(*x, None, beta=1.0, out_dtype=F32,
                                                  config=cfg))
  with testing.gpu_interpret_mode(detect_races=False, uninitialized_memory="nan"):
    out = jax.block_until_ready(f(*ops.args()[:4]))
  testing.assert_same_nonfinite_and_close(out, testing.reference_f64(*ops.args()[:4]), F32)


# ---- jax_enable_x64 ----------------------------------------------------------------

@pytest.mark.parametrize("backend", [
    "reference", "auto",
    # The kernels' jaxprs are int32 throughout under x64 and lower for CUDA (below),
    # but jax 0.11.2's GPU interpret mode mixes int64 into its own loop state.
    pytest.param("pallas_sm90", marks=pytest.mark.xfail(strict=True, reason=INTERPRET_X64)),
    pytest.param("pallas_sm100", marks=pytest.mark.xfail(strict=True, reason=INTERPRET_X64)),
])
def test_x64(backend):
  x = jax.random.normal(jax.random.key(0), (24, 300), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (136, 300), jnp.float32)
  with jax.enable_x64(True):
    qx, sx = jax_fp8.quantize_1x128(x, power_of_two_scales=True)
    qw, sw = jax_fp8.quantize_128x128(w)
    assert sx.dtype == sw.dtype == jnp.float32
    assert jax_fp8.dequantize_1x128(qx, sx).dtype == jnp.float32
    c = jnp.ones((24, 136), jnp.float32)
    f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, beta=0.5, out_dtype=F32,
                                                    backend=backend))
    if backend.startswith("pallas"):
      with testing.gpu_interpret_mode(detect_races=False):
        out = jax.block_until_ready(f(qx, sx, qw, sw, c))
    else:
      out = f(qx, sx, qw, sw, c)
  assert out.dtype == F32
  testing.assert_close(out, testing.reference_f64(qx, sx, qw, sw, c, beta=0.5), F32,
                       tol=_tol(backend, F32))


@pytest.mark.parametrize("kernel", ["pallas_sm90", "pallas_sm100"])
def test_x64_kernels_lower_for_cuda(kernel):
  s = jax.ShapeDtypeStruct
  args = (s((256, 512), jnp.float8_e4m3fn), s((256, 4), jnp.float32),
          s((256, 512), jnp.float8_e4m3fn), s((2, 4), jnp.float32), s((256, 256), jnp.float32))
  module = sm90 if kernel == "pallas_sm90" else sm100
  f = lambda a, sa, b, sb, c: module.blockwise_fp8_dot(a, sa, b, sb, c, beta=1.0,
                                                       out_dtype=BF16)
  with jax.enable_x64(True):
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text or "tcgen05" in text
