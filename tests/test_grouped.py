"""The grouped (MoE) GEMM primitives on the CPU (reference backend):
blockwise_fp8_ragged_dot and blockwise_fp8_masked_dot against float64
references, their group semantics (empty groups, rows past the groups, values
outside the contract on the device), jit without recompilation, vmap, export,
and input validation. Sharding: test_grouped_sharding.py; the Pallas kernels:
test_grouped_kernels.py."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_fp8
from jax_fp8 import grouped, reference, testing
from jax_fp8.pallas import device

F32, BF16 = jnp.float32, jnp.bfloat16
FP8 = jnp.float8_e4m3fn
ragged_dot, masked_dot = jax_fp8.blockwise_fp8_ragged_dot, jax_fp8.blockwise_fp8_masked_dot

# (M, N, K, group_sizes, out_dtype): the tile-edge sizes 0, 1, 127, 129; all rows
# in one group; rows past the sum; unaligned N and K (partial last blocks); one
# row; many groups. Each case compiles once (CI time), so the out dtypes alternate.
RAGGED_CASES = [
    (300, 200, 300, [1, 0, 127, 129, 43], F32),
    (600, 256, 512, "random", BF16),
    (300, 130, 260, "random_partial", F32),  # rows past the sum
    (257, 128, 128, [0, 257, 0], BF16),      # all rows in one group
    (1, 8, 16, [0, 1], F32),
    (96, 72, 1000, [3, 5, 7, 11, 13, 17, 19, 0, 21], BF16),
]


def _sizes(spec, m, seed):
  if spec == "random":
    return testing.random_group_sizes(seed, m, 6)
  if spec == "random_partial":
    return testing.random_group_sizes(seed, m, 5, fill=False)
  return np.asarray(spec, np.int32)


@pytest.mark.parametrize("m,n,k,spec,out_dtype", RAGGED_CASES)
def test_ragged_matches_float64_reference(m, n, k, spec, out_dtype):
  sizes = _sizes(spec, m, seed=m + n)
  ops = testing.random_ragged_operands(m * 3 + k, m, n, k, sizes)
  out = ragged_dot(*ops.args(), out_dtype=out_dtype)
  assert out.shape == (m, n) and out.dtype == out_dtype
  ref = testing.reference_ragged_f64(*ops.args())
  testing.assert_close(out, ref, out_dtype)
  # Rows past the last group are exactly zero.
  assert not np.any(np.asarray(out[int(sizes.sum()):], np.float32))


# (G, M, N, K, masked_m, out_dtype): nothing, everything, odd counts, tile edges.
MASKED_CASES = [
    (4, 200, 256, 300, [0, 200, 37, 129], F32),
    (3, 7, 130, 260, [7, 0, 5], BF16),
    (5, 128, 200, 128, [1, 127, 128, 0, 3], BF16),
    (1, 64, 64, 1000, [63], F32),
]


@pytest.mark.parametrize("g,m,n,k,masked_m,out_dtype", MASKED_CASES)
def test_masked_matches_float64_reference(g, m, n, k, masked_m, out_dtype):
  ops = testing.random_masked_operands(g + m + k, m, n, k, masked_m)
  out = masked_dot(*ops.args(), out_dtype=out_dtype)
  assert out.shape == (g, m, n) and out.dtype == out_dtype
  testing.assert_close(out, testing.reference_masked_f64(*ops.args()), out_dtype)
  for i, rows in enumerate(masked_m):
    assert not np.any(np.asarray(out[i, rows:], np.float32))


# The semantics tests share two shapes (eager calls reuse one compilation per shape).
M, N, K = 200, 144, 300     # ragged: 4 groups
G_M, G_MM = 3, 100          # masked: 3 groups of 100 rows


def _ragged(seed, sizes):
  return testing.random_ragged_operands(seed, M, N, K, sizes)


def _masked(seed, masked_m):
  return testing.random_masked_operands(seed, G_MM, N, K, masked_m)


def test_rows_outside_the_groups_are_zero_even_where_a_is_nan():
  ops = _ragged(1, [3, 0, 130, 1])              # 134 of 200 rows
  ops.a = ops.a.at[134:].set(jnp.nan)
  ops.a_scale = ops.a_scale.at[134:].set(jnp.nan)
  out = np.asarray(ragged_dot(*ops.args(), out_dtype=F32))
  assert np.all(out[134:] == 0)
  testing.assert_close(out, testing.reference_ragged_f64(*ops.args()), F32)

  ops = _masked(2, [0, 37, 100])
  ops.a = ops.a.at[0].set(jnp.nan).at[1, 37:].set(jnp.nan)
  ops.a_scale = ops.a_scale.at[1, 37:].set(jnp.inf)
  out = masked_dot(*ops.args(), out_dtype=F32)
  assert np.all(np.asarray(out[0]) == 0) and np.all(np.asarray(out[1, 37:]) == 0)
  testing.assert_close(out, testing.reference_masked_f64(*ops.args()), F32)


def test_a_nan_in_a_group_shows_in_its_rows_only():
  # NaN is never hidden where a group reads it, and never leaks into another row.
  ops = _ragged(3, [10, 20, 30, 140])
  ops.a = ops.a.at[12, 5].set(jnp.nan)
  out = np.asarray(ragged_dot(*ops.args(), out_dtype=F32))
  assert np.all(np.isnan(out[12]))
  assert np.all(np.isfinite(np.delete(out, 12, axis=0)))


def test_device_values_outside_the_contract_are_defined():
  """On the device group sizes are not checked: negative counts as 0, the groups
  are cut at row M; masked_m is clamped to [0, M]."""
  ops = _ragged(4, [0, 0, 0, 0])
  f = lambda sizes: ragged_dot(*ops.args()[:4], jnp.asarray(sizes, jnp.int32), out_dtype=F32)
  for given, meant in (([60, -5, 100, 90], [60, 0, 100, 40]),
                       ([-1, 220, 7, 2], [0, 200, 0, 0]),
                       ([2**31 - 1, 2**31 - 1, 5, -2**31], [200, 0, 0, 0]),
                       ([-3, -3, -3, -3], [0, 0, 0, 0])):
    out = f(given)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(f(meant)))
    testing.assert_close(out, testing.reference_ragged_f64(*ops.args()[:4], meant), F32)

  ops = _masked(5, [0, 0, 0])
  g = lambda mm: masked_dot(*ops.args()[:4], jnp.asarray(mm, jnp.int32), out_dtype=F32)
  np.testing.assert_array_equal(np.asarray(g([-7, 101, 2**31 - 1])), np.asarray(g([0, 100, 100])))


def test_normalized_sizes_are_what_backends_get():
  sizes = jnp.asarray([30, -5, 50, 90, 3], jnp.int32)
  np.testing.assert_array_equal(grouped.normalized_group_sizes(sizes, 100), [30, 0, 50, 20, 0])
  np.testing.assert_array_equal(grouped.normalized_masked_m(sizes, 40), [30, 0, 40, 40, 3])
  starts, ends = reference.ragged_group_bounds(sizes, 100)
  np.testing.assert_array_equal(starts, [0, 30, 30, 80, 100])
  np.testing.assert_array_equal(ends, [30, 30, 80, 100, 100])


def test_host_values_are_checked():
  ops = _ragged(6, [20, 30, 0, 150])
  with pytest.raises(ValueError, match=re.escape("group_sizes must sum to at most M = 200")):
    ragged_dot(*ops.args()[:4], np.array([20, 31, 0, 150]))
  with pytest.raises(ValueError, match="group_sizes must be >= 0"):
    ragged_dot(*ops.args()[:4], [-1, 30, 0, 0])
  with pytest.raises(TypeError, match="group_sizes must be int32, got float64"):
    ragged_dot(*ops.args()[:4], np.array([20.0, 30.0, 0.0, 0.0]))
  # Host integers of any width are converted once checked.
  ref = testing.reference_ragged_f64(*ops.args())
  for sizes in ([20, 30, 0, 150], np.array([20, 30, 0, 150], np.int64), (20, 30, 0, 150),
                np.array([20, 30, 0, 150], np.uint8)):
    testing.assert_close(ragged_dot(*ops.args()[:4], sizes, out_dtype=F32), ref, F32)

  ops = _masked(7, [0, 30, 100])
  with pytest.raises(ValueError, match=re.escape("masked_m must be in [0, M] = [0, 100]")):
    masked_dot(*ops.args()[:4], [0, 101, 3])
  with pytest.raises(ValueError, match=re.escape("masked_m must be in [0, M]")):
    masked_dot(*ops.args()[:4], np.array([-1, 3, 3]))
  testing.assert_close(masked_dot(*ops.args()[:4], np.array([0, 30, 100]), out_dtype=F32),
                       testing.reference_masked_f64(*ops.args()), F32)


def test_scale_product_multiplies_the_block_sum():
  """2^-120 * 2^120 = 1 exactly: scales are never multiplied into the operands
  first (b would overflow to inf)."""
  ops = _ragged(8, [40, 24, 0, 136])
  ops.a_scale = ops.a_scale.at[:, 1].set(2.0**-120)
  ops.b_scale = ops.b_scale.at[:, :, 1].set(2.0**120)
  out = ragged_dot(*ops.args(), out_dtype=F32)
  testing.assert_close(out, testing.reference_ragged_f64(*ops.args()), F32)

  ops = _masked(8, [40, 100, 0])
  ops.a_scale = ops.a_scale.at[:, :, 2].set(2.0**-120)
  ops.b_scale = ops.b_scale.at[:, :, 2].set(2.0**120)
  out = masked_dot(*ops.args(), out_dtype=F32)
  testing.assert_close(out, testing.reference_masked_f64(*ops.args()), F32)


def test_each_group_uses_its_own_expert_and_scales():
  # One expert's block scale changed: only rows of that group may follow it.
  ops = _ragged(9, [50, 129, 0, 21])
  before = np.asarray(ragged_dot(*ops.args(), out_dtype=F32))
  ops.b_scale = ops.b_scale.at[1, 1, 2].multiply(1024.0)
  after = np.asarray(ragged_dot(*ops.args(), out_dtype=F32))
  testing.assert_close(after, testing.reference_ragged_f64(*ops.args()), F32)
  changed = np.any(before != after, axis=1)
  assert changed[50:179].all() and not changed[:50].any() and not changed[179:].any()


def test_end_to_end_against_unquantized_per_group_dots():
  kx, kw = jax.random.split(jax.random.key(10))
  sizes = [50, 0, 78]
  x = jax.random.normal(kx, (128, 1000), F32)
  w = jax.random.normal(kw, (3, 300, 1000), F32) * 0.02
  qx, sx = jax_fp8.quantize_1x128(x)
  qw, sw = jax.vmap(jax_fp8.quantize_128x128)(w)
  out = ragged_dot(qx, sx, qw, sw, sizes, out_dtype=F32)
  dot = lambda x, w: jnp.dot(x, w.T, precision="highest")
  want = jnp.concatenate([dot(x[:50], w[0]), dot(x[50:], w[2])])
  assert testing.rel_error(out, np.asarray(want, np.float64)) < 0.06
  # The same check catches rows multiplied by the wrong expert.
  bad = ragged_dot(qx, sx, qw, sw, [50, 78, 0], out_dtype=F32)
  assert testing.rel_error(bad, np.asarray(want, np.float64)) > 0.06
  # Same tokens, masked layout.
  xm = jnp.stack([x[:64], x[64:]])
  qxm, sxm = jax_fp8.quantize_1x128(xm)
  out = masked_dot(qxm, sxm, qw[:2], sw[:2], [50, 64], out_dtype=F32)
  want = jnp.stack([jnp.pad(dot(x[:50], w[0]), ((0, 14), (0, 0))), dot(x[64:], w[1])])
  assert testing.rel_error(out, np.asarray(want, np.float64)) < 0.06


def test_empty_problems():
  ops = testing.random_ragged_operands(11, 0, 128, 256, [0, 0])
  assert ragged_dot(*ops.args()).shape == (0, 128)
  ops = _ragged(11, [0, 0, 0, 0])
  assert not np.any(np.asarray(ragged_dot(*ops.args(), out_dtype=F32)))
  ops = testing.random_masked_operands(12, 0, 128, 256, [0, 0, 0])
  assert masked_dot(*ops.args()).shape == (3, 0, 128)


# ---- transformations -----------------------------------------------------------------

def test_jit_does_not_recompile_when_sizes_change():
  ops = _ragged(13, [50, 50, 50, 50])
  f = jax.jit(lambda *x: ragged_dot(*x, out_dtype=F32))
  for seed, fill in ((0, True), (1, False), (2, True)):
    sizes = jnp.asarray(testing.random_group_sizes(seed, M, 4, fill=fill))
    testing.assert_close(f(*ops.args()[:4], sizes),
                         testing.reference_ragged_f64(*ops.args()[:4], sizes), F32)
  assert f._cache_size() == 1

  ops = _masked(14, [0, 0, 0])
  g = jax.jit(lambda *x: masked_dot(*x, out_dtype=F32))
  for mm in ([0, 100, 1], [17, 3, 99], [100, 0, 0]):
    mm = jnp.asarray(mm, jnp.int32)
    testing.assert_close(g(*ops.args()[:4], mm),
                         testing.reference_masked_f64(*ops.args()[:4], mm), F32)
  assert g._cache_size() == 1


def test_jaxpr_holds_one_primitive_and_eval_shape_works():
  ops = testing.random_ragged_operands(15, 64, 130, 256, [30, 34])
  f = lambda *x: ragged_dot(*x, out_dtype=F32)
  assert str(jax.make_jaxpr(f)(*ops.args())).count("blockwise_fp8_ragged_dot") == 1
  assert jax.eval_shape(f, *ops.args()).shape == (64, 130)
  ops = testing.random_masked_operands(15, 64, 130, 256, [30, 34])
  g = lambda *x: masked_dot(*x)
  assert str(jax.make_jaxpr(g)(*ops.args())).count("blockwise_fp8_masked_dot") == 1
  assert jax.eval_shape(g, *ops.args()).dtype == BF16


def _stacked(make, count):
  ops = [make(i) for i in range(count)]
  return ops, [jnp.stack(xs) for xs in zip(*(o.args() for o in ops))]


def test_vmap_masked_with_batched_experts_folds_into_groups():
  ops, stacked = _stacked(lambda i: testing.random_masked_operands(
      20 + i, 40, 130, 256, [i * 7, 40, 3]), 3)
  f = jax.vmap(lambda *x: masked_dot(*x, out_dtype=F32))
  jaxpr = str(jax.make_jaxpr(f)(*stacked))
  assert jaxpr.count("blockwise_fp8_masked_dot") == 1 and "scan" not in jaxpr
  out = jax.jit(f)(*stacked)
  assert out.shape == (3, 3, 40, 130)
  for i, o in enumerate(ops):
    testing.assert_close(out[i], testing.reference_masked_f64(*o.args()), F32)
  # Batch on another axis and unbatched masked_m (broadcast).
  a_t = jnp.moveaxis(stacked[0], 0, 2)  # [G, M, B, K]
  out = jax.vmap(lambda a, sa, b, sb: masked_dot(a, sa, b, sb, ops[0].sizes, out_dtype=F32),
                 in_axes=(2, 0, 0, 0), out_axes=1)(a_t, *stacked[1:4])
  for i, o in enumerate(ops):
    testing.assert_close(out[:, i], testing.reference_masked_f64(*o.args()[:4], ops[0].sizes),
                         F32)


def test_vmap_masked_with_shared_experts_maps():
  ops, stacked = _stacked(lambda i: testing.random_masked_operands(
      30 + i, 24, 130, 256, [i, 24 - i]), 2)
  b, sb = ops[0].b, ops[0].b_scale
  f = jax.vmap(lambda a, sa, mm: masked_dot(a, sa, b, sb, mm, out_dtype=F32))
  jaxpr = str(jax.make_jaxpr(f)(stacked[0], stacked[1], stacked[4]))
  assert "scan" in jaxpr  # one call per element: the experts are not copied
  out = f(stacked[0], stacked[1], stacked[4])
  for i, o in enumerate(ops):
    testing.assert_close(out[i], testing.reference_masked_f64(o.a, o.a_scale, b, sb, o.sizes),
                         F32)


def test_vmap_ragged_maps_over_the_batch():
  ops, stacked = _stacked(lambda i: testing.random_ragged_operands(
      40 + i, 150, 130, 256, testing.random_group_sizes(i, 150, 4, fill=i != 1)), 3)
  f = jax.jit(jax.vmap(lambda *x: ragged_dot(*x, out_dtype=F32)))
  out = f(*stacked)
  for i, o in enumerate(ops):
    testing.assert_close(out[i], testing.reference_ragged_f64(*o.args()), F32)
  # Only the group sizes batched: the operands are shared.
  sizes = jnp.stack([o.sizes for o in ops])
  out = jax.vmap(lambda s: ragged_dot(*ops[0].args()[:4], s, out_dtype=F32))(sizes)
  for i in range(3):
    testing.assert_close(out[i], testing.reference_ragged_f64(*ops[0].args()[:4], sizes[i]),
                         F32)


def test_expected_m_is_a_hint_that_changes_no_result():
  """The masked op's expected_m reaches the primitive (a static parameter),
  survives jit, vmap and export, and changes no result."""
  ops = testing.random_masked_operands(70, 60, 140, 300, [0, 60, 33])
  plain = masked_dot(*ops.args(), out_dtype=F32)
  hinted = jax.jit(lambda *x: masked_dot(*x, out_dtype=F32, expected_m=30))
  assert "expected_m=30" in str(jax.make_jaxpr(hinted)(*ops.args()))
  np.testing.assert_array_equal(np.asarray(hinted(*ops.args())), np.asarray(plain))
  batched = jax.vmap(lambda *x: masked_dot(*x, out_dtype=F32, expected_m=30))(
      *(x[None] for x in ops.args()))
  np.testing.assert_array_equal(np.asarray(batched[0]), np.asarray(plain))
  exp = jax.export.export(hinted, platforms=["cpu"])(*ops.args())
  out = jax.export.deserialize(exp.serialize()).call(*ops.args())
  np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))


@pytest.mark.parametrize("op", ["ragged", "masked"])
def test_export_round_trip(op):
  if op == "ragged":
    ops = testing.random_ragged_operands(50, 200, 140, 300, [0, 129, 1, 50])
    fn, ref = ragged_dot, testing.reference_ragged_f64
  else:
    ops = testing.random_masked_operands(50, 60, 140, 300, [0, 60, 33])
    fn, ref = masked_dot, testing.reference_masked_f64
  f = jax.jit(lambda *x: fn(*x, out_dtype=BF16))
  exp = jax.export.export(f, platforms=["cpu"])(*ops.args())
  restored = jax.export.deserialize(exp.serialize())
  out = restored.call(*ops.args())
  np.testing.assert_array_equal(np.asarray(out.astype(F32)), np.asarray(f(*ops.args()).astype(F32)))
  testing.assert_close(out, ref(*ops.args()), BF16)
  # The sizes stay an operand of the exported code.
  other = ops.sizes.at[0].set(1).at[-1].add(-1)
  testing.assert_close(restored.call(*ops.args()[:4], other), ref(*ops.args()[:4], other), BF16)
  assert "callback" not in exp.mlir_module().lower()


@pytest.mark.parametrize("op", ["ragged", "masked"])
def test_cuda_lowering_of_reference_works_without_a_gpu(op):
  if op == "ragged":
    ops = testing.random_ragged_operands(51, 64, 256, 256, [32, 32])
  else:
    ops = testing.random_masked_operands(51, 64, 256, 256, [32, 32])
  fn = ragged_dot if op == "ragged" else masked_dot
  avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ops.args()]
  f = lambda *x: fn(*x, backend="reference", out_dtype=F32)
  text = jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  assert "dot_general" in text and "while" in text


# ---- bad input -----------------------------------------------------------------------------

def _call(op, over, jit):
  if op == "ragged":
    o = testing.random_ragged_operands(60, 8, 130, 300, [3, 5])
    fn = ragged_dot
  else:
    o = testing.random_masked_operands(60, 8, 130, 300, [3, 5])
    fn = masked_dot
  arrays = dict(a=o.a, a_scale=o.a_scale, b=o.b, b_scale=o.b_scale, sizes=o.sizes)
  params = dict(out_dtype=BF16, backend="auto")
  for key, value in over.items():
    (arrays if key in arrays else params)[key] = value

  def f(a, a_scale, b, b_scale, sizes):
    return fn(a, a_scale, b, b_scale, sizes, **params)
  return (jax.jit(f) if jit else f)(**arrays)


BAD_INPUTS = [  # (op, overrides, exception, message)
    ("ragged", dict(a=jnp.ones((8, 300), BF16)), TypeError, "a must be float8_e4m3fn"),
    ("ragged", dict(b=jnp.ones((2, 130, 300), F32)), TypeError, "b must be float8_e4m3fn"),
    ("ragged", dict(a_scale=jnp.ones((8, 3), BF16)), TypeError, "a_scale must be float32"),
    ("ragged", dict(b_scale=jnp.ones((2, 2, 3), jnp.float16)), TypeError,
     "b_scale must be float32"),
    ("ragged", dict(sizes=jnp.ones((2,), jnp.uint32)), TypeError,
     "group_sizes must be int32, got uint32"),
    ("ragged", dict(sizes=jnp.ones((2,), F32)), TypeError, "group_sizes must be int32"),
    ("ragged", dict(a=jnp.ones((1, 8, 300), FP8)), ValueError, "a must be 2-D [M, K]"),
    ("ragged", dict(b=jnp.ones((130, 300), FP8)), ValueError, "b must be 3-D [G, N, K]"),
    ("ragged", dict(b=jnp.ones((2, 130, 256), FP8)), ValueError, "K mismatch"),
    ("ragged", dict(a_scale=jnp.ones((8, 2), F32)), ValueError, "a_scale must have shape (M, "),
    ("ragged", dict(b_scale=jnp.ones((2, 3), F32)), ValueError,
     "b_scale must have shape (G, ceil(N/128), ceil(K/128)) = (2, 2, 3)"),
    ("ragged", dict(b_scale=jnp.ones((1, 2, 3), F32)), ValueError, "b_scale must have shape"),
    ("ragged", dict(sizes=jnp.ones((3,), jnp.int32)), ValueError,
     "group_sizes must be 1-D of length G = 2"),
    ("ragged", dict(sizes=jnp.ones((1, 2), jnp.int32)), ValueError,
     "group_sizes must be 1-D of length G"),
    ("ragged", dict(b=jnp.ones((0, 130, 300), FP8), b_scale=jnp.ones((0, 2, 3), F32),
                    sizes=jnp.ones((0,), jnp.int32)), ValueError, "at least one group"),
    ("ragged", dict(out_dtype=jnp.float16), TypeError, "out_dtype must be bfloat16 or float32"),
    ("ragged", dict(backend="cublas"), ValueError, "backend must be one of"),
    ("masked", dict(a=jnp.ones((2, 8, 300), BF16)), TypeError, "a must be float8_e4m3fn"),
    ("masked", dict(sizes=jnp.ones((2,), jnp.int16)), TypeError, "masked_m must be int32"),
    ("masked", dict(a=jnp.ones((16, 300), FP8)), ValueError, "a must be 3-D [G, M, K]"),
    ("masked", dict(a=jnp.ones((3, 8, 300), FP8), a_scale=jnp.ones((3, 8, 3), F32)),
     ValueError, "a and b must hold the same number of groups G"),
    ("masked", dict(a_scale=jnp.ones((2, 8, 2), F32)), ValueError,
     "a_scale must have shape (G, M, ceil(K/128)) = (2, 8, 3)"),
    ("masked", dict(b=jnp.ones((2, 130, 128), FP8)), ValueError, "K mismatch"),
    ("masked", dict(b_scale=jnp.ones((2, 1, 3), F32)), ValueError, "b_scale must have shape"),
    ("masked", dict(sizes=jnp.ones((), jnp.int32)), ValueError,
     "masked_m must be 1-D of length G = 2"),
    ("masked", dict(out_dtype="int8"), TypeError, "out_dtype must be bfloat16 or float32"),
    ("masked", dict(expected_m=0), ValueError, "expected_m must be in [1, M] = [1, 8]"),
    ("masked", dict(expected_m=9), ValueError, "expected_m must be in [1, M] = [1, 8]"),
    ("masked", dict(expected_m=4.0), TypeError, "expected_m must be None or a Python int"),
    ("masked", dict(expected_m=True), TypeError, "expected_m must be None or a Python int"),
    ("masked", dict(expected_m=jnp.int32(4)), TypeError, "got ArrayImpl"),
]


@pytest.mark.parametrize("op,over,exc,msg", BAD_INPUTS,
                         ids=[f"{op}-{m}" for op, _, _, m in BAD_INPUTS])
def test_bad_input_is_named(op, over, exc, msg):
  with pytest.raises(exc, match=re.escape(msg)):
    _call(op, over, jit=False)
  with pytest.raises(exc, match=re.escape(msg)):  # the same under jit
    _call(op, over, jit=True)


def test_k_zero_and_huge_m_are_rejected():
  with pytest.raises(ValueError, match="K must be >= 1"):
    ragged_dot(jnp.ones((4, 0), FP8), jnp.ones((4, 0)), jnp.ones((1, 8, 0), FP8),
               jnp.ones((1, 1, 0)), jnp.array([4]))
  avals = [jax.ShapeDtypeStruct(s, d) for s, d in (((2**30, 128), FP8), ((2**30, 1), F32),
                                                  ((1, 8, 128), FP8), ((1, 1, 1), F32),
                                                  ((1,), jnp.int32))]
  with pytest.raises(ValueError, match=re.escape("M must be < 2**30")):
    jax.eval_shape(ragged_dot, *avals)


@pytest.mark.skipif(bool(device.gpus()), reason="on a GPU machine these backends may run")
@pytest.mark.parametrize("backend", ["pallas_sm90", "pallas_sm100", "ffi"])
@pytest.mark.parametrize("op", ["ragged", "masked"])
def test_gpu_backends_on_the_cpu_say_why(op, backend):
  with pytest.raises(jax_fp8.BackendUnavailableError, match=f"backend='{backend}' needs"):
    _call(op, dict(backend=backend), jit=False)
