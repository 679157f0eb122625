"""Shardings whose shards do not hold whole 128-blocks (issue 19), on 8 CPU
devices, Auto and Explicit mesh axes, at tensor-parallel sizes: N = 2816, 768,
1536 over 8 devices and 2816 over the 4-wide axis of a 2x4 mesh (2.75, 0.75,
1.5 and 5.5 blocks per shard); K likewise. Each is exact against the float64
reference and moves no operand bytes (each device aligns its own shard to the
blocks); the quantisers work on such shards in both axis modes."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_fp8
from jax_fp8 import testing
from sharding_util import collectives as _collectives, reference_dot as _dot

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (virtual) devices")
F32, BF16 = jnp.float32, jnp.bfloat16


def _mesh(shape, axis_type):
  names = ("x",) if len(shape) == 1 else ("x", "y")
  return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(names))


# name, mesh, (m, n, k), specs of (a, a_scale, b, b_scale), output/c spec, with_c,
# the collectives the compiled program may run.
CASES = [
    ("N2816_over_8", (8,), (64, 2816, 256), (P(), P(), P("x"), P()), P(None, "x"), True, {}),
    ("N768_over_8", (8,), (32, 768, 384), (P(), P(), P("x"), P()), P(None, "x"), False, {}),
    ("N1536_over_8", (8,), (32, 1536, 256), (P(), P(), P("x"), P()), P(None, "x"), True, {}),
    ("N2816_over_4_of_2x4", (2, 4), (64, 2816, 256), (P("x"), P("x"), P("y"), P()),
     P("x", "y"), True, {}),
    # K over 8 devices: 1.5 blocks per device; one reduction of the partial sums.
    ("K1536_over_8", (8,), (32, 256, 1536), (P(None, "x"), P(), P(None, "x"), P()), P(), True,
     {"all-reduce": 1}),
    ("K768_over_4_of_2x4_M_over_2", (2, 4), (64, 256, 768),
     (P("x", "y"), P("x"), P(None, "y"), P()), P("x"), False, {"all-reduce": 1}),
]


def _operands(case):
  name, _, (m, n, k), _, _, with_c, _ = case
  return testing.random_operands(len(name) + m + n + k, m, n, k, with_c=with_c)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_shards_that_cut_blocks(case, axis_type):
  name, mesh_shape, _, in_specs, out_spec, with_c, allowed = case
  mesh = _mesh(mesh_shape, axis_type)
  ops = _operands(case)
  beta = 0.5 if with_c else 1.0
  out_dtype = BF16 if "768" in name else F32
  f = jax.jit(_dot(beta, out_dtype))
  shard = lambda spec: NamedSharding(mesh, spec)
  args = [jax.device_put(x, shard(s)) for x, s in zip(ops.args()[:4], in_specs)]
  args.append(jax.device_put(ops.c, shard(out_spec)) if with_c else None)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if axis_type == AxisType.Auto:
      f = jax.jit(_dot(beta, out_dtype), out_shardings=shard(out_spec))
      compiled = f.lower(*args).compile()
    else:
      with jax.set_mesh(mesh):
        compiled = f.lower(*args).compile()
  out = compiled(*args)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=beta), out_dtype)
  assert not [w for w in caught if "blockwise_fp8_dot" in str(w.message)]
  # The output stays sharded like the operands (N over its axes, or M), and no
  # operand is gathered: only the K reduction, if any.
  want = P(*out_spec, *([None] * (2 - len(out_spec))))
  assert out.sharding.is_equivalent_to(NamedSharding(mesh, want), 2), out.sharding
  assert _collectives(compiled.as_text()) == allowed


def test_propagated_sub_axis_shardings_do_not_break_the_partitioner():
  """A weight quantised inside jit from rows split over 8 devices: the
  quantiser's reshapes leave q and its scales split over part of the mesh axis
  (22 blocks in two halves), which no PartitionSpec can say. The op replicates
  b with a warning instead of failing inside the partitioner."""
  mesh = _mesh((8,), AxisType.Auto)
  ops = testing.random_operands(40, 16, 2816, 256)
  w = jax.device_put(jax.random.normal(jax.random.key(0), (2816, 256)), NamedSharding(mesh, P("x")))

  def f(a, a_scale, w):
    q, s = jax_fp8.quantize_128x128(w)
    return jax_fp8.blockwise_fp8_dot(a, a_scale, q, s, out_dtype=F32, backend="reference")

  with pytest.warns(UserWarning, match="replicating instead of sharding b .*part of a mesh axis"):
    out = jax.jit(f)(ops.a, ops.a_scale, w)
  q, s = jax_fp8.quantize_128x128(np.asarray(w))
  testing.assert_close(out, testing.reference_f64(ops.a, ops.a_scale, q, s), F32)


def test_one_axis_wanted_twice_replicates_with_a_warning():
  mesh = _mesh((2, 4), AxisType.Auto)
  ops = testing.random_operands(41, 64, 512, 256)
  shard = lambda *s: NamedSharding(mesh, P(*s))
  f = jax.jit(_dot(1.0, F32), in_shardings=(shard("y"), shard("y"), shard("y"), shard(), None))
  with pytest.warns(UserWarning, match="replicating instead of sharding N"):
    out = f.lower(*ops.args()).compile()(*ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args()), F32)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("spec", [P("y"), P(None, "y"), P("x", "y"), P(("x", "y"))],
                         ids=["N", "K", "NK", "N_over_8"])
def test_quantizers_on_sharded_weights(spec, axis_type):
  """The quantisers (and dequantisers) inside jit of a [2816, 768] weight split
  over the mesh (5.5 or 2.75 row blocks, 1.5 column blocks per shard): the same
  bits as on one device; q keeps the weight's sharding."""
  mesh = _mesh((2, 4), axis_type)
  w = np.random.default_rng(1).standard_normal((2816, 768)).astype(np.float32)
  for quantize, dequantize in ((jax_fp8.quantize_128x128, jax_fp8.dequantize_128x128),
                               (jax_fp8.quantize_1x128, jax_fp8.dequantize_1x128)):
    want_q, want_s = quantize(w)
    with jax.set_mesh(mesh):
      q, s = jax.jit(quantize)(jax.device_put(w, spec))
      back = jax.jit(dequantize)(q, s)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(want_s))
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(want_q).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(dequantize(want_q, want_s)))
    if axis_type == AxisType.Explicit:
      full = P(*spec, *([None] * (2 - len(spec))))
      assert q.sharding.spec == full and back.sharding.spec == full
