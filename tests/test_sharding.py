"""`blockwise_fp8_dot` partitions like a matmul on a (2, 4) CPU mesh.

Auto axes (jit in_shardings/out_shardings) and Explicit axes (jax.set_mesh):
M, N, batch dims and K sharded, each against the float64 reference, and the
compiled HLO's collectives: none for M/N/batch sharding, exactly one reduction
for K sharding. Splits that cut 128-blocks (64 columns per device) are exact
without moving operands (tests/test_sharding_uneven.py has realistic sizes).
Single-device jit and jax.export keep the plain lowering (no Python callback).
All on backend="reference": kernels cannot run under several devices in GPU
interpret mode.
"""
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_fp8
from jax_fp8 import testing
from sharding_util import collectives, reference_dot as _dot

CUSTOM_CALL = "CustomSPMDPartitioning"  # custom_partitioning's callback target.

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (virtual) devices")


def _mesh(axis_type):
  return jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type, axis_type))


# name, (m, n, k), batch, specs of (a, a_scale, b, b_scale), output/c spec,
# expected collectives (others must be 0), warns, with_c, out_dtype.
CASES = [
    ("M", (256, 512, 512), (), (P("x"), P("x"), P(), P()), P("x"), {}, False, False,
     jnp.float32),
    ("M_scales_replicated", (256, 384, 512), (), (P("x"), P(), P(), P()), P("x"), {}, False,
     True, jnp.bfloat16),
    ("N", (200, 512, 640), (), (P(), P(), P("y"), P("y")), P(None, "y"), {}, False, True,
     jnp.float32),
    ("MN", (256, 512, 512), (), (P("x"), P("x"), P("y"), P("y")), P("x", "y"), {}, False,
     True, jnp.bfloat16),
    ("batch", (16, 256, 384), (2, 4), (P("x", "y"), P("x", "y"), P(), P()), P("x", "y"), {},
     False, True, jnp.float32),
    ("K", (128, 256, 1024), (), (P(None, "y"), P(None, "y"), P(None, "y"), P(None, "y")), P(),
     {"all-reduce": 1}, False, True, jnp.bfloat16),
    ("MK", (256, 256, 1024), (), (P("x", "y"), P("x", "y"), P(None, "y"), P(None, "y")),
     P("x"), {"all-reduce": 1}, False, True, jnp.float32),
    ("batch_K", (64, 256, 1024), (2,), (P("x", None, "y"), P("x", None, "y"), P(None, "y"),
                                        P(None, "y")), P("x"), {"all-reduce": 1}, False, False,
     jnp.float32),
    # 256 / 4 devices = 64 columns per shard: each shard pads itself to a whole
    # block (no communication). Uneven K shards likewise, then one reduction.
    ("N_unaligned", (128, 256, 512), (), (P(), P(), P("y"), P()), P(None, "y"), {}, False,
     True, jnp.float32),
    ("K_unaligned", (128, 256, 256), (), (P(None, "y"), P(), P(None, "y"), P()), P(),
     {"all-reduce": 1}, False, False, jnp.bfloat16),
    # A partial last K block: 250 columns per shard.
    ("K_partial_block", (128, 256, 1000), (), (P(None, "y"), P(), P(None, "y"), P()), P(),
     {"all-reduce": 1}, False, True, jnp.float32),
]
IDS = [c[0] for c in CASES]


def _check(out, ops, beta, out_dtype, want_spec, hlo, expect, warns, caught):
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=beta), out_dtype)
  assert out.sharding.is_equivalent_to(NamedSharding(out.sharding.mesh, want_spec), out.ndim)
  messages = [str(w.message) for w in caught if "blockwise_fp8_dot" in str(w.message)]
  if warns:
    assert messages and "replicating instead of sharding" in messages[0], messages
  else:
    assert not messages, messages
  if expect is not None:  # Unaligned cases replicate: any resharding is fine.
    got = collectives(hlo)
    assert got == {op: n for op, n in expect.items() if n}, got


def _operands(case, seed):
  _, (m, n, k), batch, _, _, _, _, with_c, _ = case
  return testing.random_operands(seed, m, n, k, batch=batch, with_c=with_c)


def _full(spec, ndim):
  return P(*spec, *([None] * (ndim - len(spec))))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_auto_axes(case):
  name, _, _, in_specs, out_spec, expect, warns, with_c, out_dtype = case
  mesh = _mesh(AxisType.Auto)
  ops = _operands(case, seed=len(name))
  beta = 0.5 if with_c else 1.0
  shard = lambda s: NamedSharding(mesh, s)
  in_shardings = (*map(shard, in_specs), shard(out_spec) if with_c else None)
  f = jax.jit(_dot(beta, out_dtype), in_shardings=in_shardings, out_shardings=shard(out_spec))
  lowered = f.lower(*ops.args())
  assert CUSTOM_CALL in lowered.as_text()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    compiled = lowered.compile()
  out = compiled(*ops.args())
  _check(out, ops, beta, out_dtype, _full(out_spec, out.ndim), compiled.as_text(), expect,
         warns, caught)


def test_auto_axes_k_reduction_scatters_when_output_is_split_over_k_axes():
  """K over 'y' and the output wanted over 'y' on M: one reduce-scatter."""
  mesh = _mesh(AxisType.Auto)
  ops = testing.random_operands(3, 256, 512, 1024, with_c=True)
  shard = lambda *s: NamedSharding(mesh, P(*s))
  f = jax.jit(_dot(0.5, jnp.bfloat16),
              in_shardings=(shard(None, "y"), shard(None, "y"), shard(None, "y"),
                            shard(None, "y"), shard("y")),
              out_shardings=shard("y"))
  compiled = f.lower(*ops.args()).compile()
  out = compiled(*ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), jnp.bfloat16)
  got = collectives(compiled.as_text())
  assert got == {"reduce-scatter": 1}, got


def test_gspmd_partitioner_uses_infer_sharding_from_operands():
  """The deprecated GSPMD partitioner: same partitioning, through the callbacks."""
  from jax._src import config as jax_config
  mesh = _mesh(AxisType.Auto)
  ops = testing.random_operands(4, 256, 512, 1024, with_c=True)
  shard = lambda *s: NamedSharding(mesh, P(*s))
  with jax_config.use_shardy_partitioner(False):
    f = jax.jit(_dot(0.5, jnp.float32),
                in_shardings=(shard("x", "y"), shard("x", "y"), shard(None, "y"),
                              shard(None, "y"), shard("x")),
                out_shardings=shard("x"))
    compiled = f.lower(*ops.args()).compile()
  out = compiled(*ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), jnp.float32)
  got = collectives(compiled.as_text())
  assert got == {"all-reduce": 1}, got


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_explicit_axes(case):
  name, _, batch, in_specs, out_spec, expect, warns, with_c, out_dtype = case
  mesh = _mesh(AxisType.Explicit)
  ops = _operands(case, seed=100 + len(name))
  beta = 0.5 if with_c else 1.0
  f = jax.jit(_dot(beta, out_dtype))
  with jax.set_mesh(mesh):
    args = [jax.device_put(x, s) for x, s in zip(ops.args()[:4], in_specs)]
    args.append(jax.device_put(ops.c, out_spec) if with_c else None)
    # The output's type carries a matmul's sharding: M/batch from a, N from b.
    want = _full(out_spec, len(batch) + 2)
    assert jax.eval_shape(f, *args).sharding.spec == want
    assert CUSTOM_CALL in f.lower(*args).as_text()
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      compiled = f.lower(*args).compile()
    out = compiled(*args)
  _check(out, ops, beta, out_dtype, want, compiled.as_text(), expect, warns, caught)


@pytest.mark.parametrize("specs, message", [
    ((P("x"), P("y"), P(), P()), r"M of a_scale .* reshard a_scale with jax.sharding.reshard"
                                 r"\(a_scale, P\('x', None\)\)"),
    ((P(None, "y"), P(None, "y"), P(None, "x"), P()),
     r"K of b is sharded over \('x',\) but K of a over \('y',\); reshard b"),
    ((P(), P(), P(None, "x"), P(None, "y")), r"K of b_scale .* reshard b_scale"),
    ((P("x"), P("x"), P("x"), P("x")), r"mesh axis 'x' shards both M \(of a\) and N \(of b\); "
                                       r"reshard b"),
])
def test_explicit_axes_mismatch_names_the_argument_to_reshard(specs, message):
  ops = testing.random_operands(7, 256, 256, 512)
  with jax.set_mesh(_mesh(AxisType.Explicit)):
    args = [jax.device_put(x, s) for x, s in zip(ops.args()[:4], specs)]
    with pytest.raises(Exception, match=message) as info:
      jax.jit(_dot(1.0, jnp.float32))(*args, None)
  assert type(info.value).__name__ == "ShardingTypeError"  # As lax.dot_general raises.


def test_explicit_axes_c_must_follow_the_output():
  ops = testing.random_operands(8, 256, 256, 512, with_c=True)
  specs = (P("x"), P("x"), P(), P(), P("y"))
  with jax.set_mesh(_mesh(AxisType.Explicit)):
    args = [jax.device_put(x, s) for x, s in zip(ops.args(), specs)]
    with pytest.raises(Exception, match=r"M of c is sharded over \('y',\).* reshard c"):
      jax.jit(_dot(0.5, jnp.float32))(*args)


def test_shard_map_on_local_shards():
  """Inside shard_map the primitive runs on local shards; K partial sums are
  the caller's to reduce (f32 partials, psum, then + beta*c and the cast)."""
  mesh = _mesh(AxisType.Auto)
  ops = testing.random_operands(9, 256, 512, 1024, with_c=True)

  def local(a, a_scale, b, b_scale, c):
    partial = jax_fp8.blockwise_fp8_dot(a, a_scale, b, b_scale, out_dtype=jnp.float32,
                                        backend="reference")
    return (jax.lax.psum(partial, "y") + 0.5 * c).astype(jnp.bfloat16)

  f = jax.jit(jax.shard_map(local, mesh=mesh, out_specs=P("x"), in_specs=(
      P("x", "y"), P("x", "y"), P(None, "y"), P(None, "y"), P("x"))))
  lowered = f.lower(*ops.args())
  assert CUSTOM_CALL not in lowered.as_text()  # Manual context: lowered directly.
  out = lowered.compile()(*ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), jnp.bfloat16)


def test_single_device_jit_lowers_directly():
  ops = testing.random_operands(10, 128, 256, 384, with_c=True)
  f = jax.jit(_dot(2.0, jnp.float32))
  assert CUSTOM_CALL not in f.lower(*ops.args()).as_text()
  testing.assert_close(f(*ops.args()), testing.reference_f64(*ops.args(), beta=2.0),
                       jnp.float32)


@pytest.mark.parametrize("sharded", [False, True], ids=["one_device", "mesh"])
def test_export_has_no_partitioning_callback(sharded):
  ops = testing.random_operands(11, 256, 256, 512, with_c=True)
  f = _dot(0.5, jnp.bfloat16)
  args = ops.args()
  if sharded:  # Exported code cannot call back into Python: it lowers directly.
    mesh = _mesh(AxisType.Auto)
    shardings = [NamedSharding(mesh, s) for s in (P("x", "y"), P("x", "y"), P(None, "y"),
                                                  P(None, "y"), P("x"))]
    f = jax.jit(f, in_shardings=shardings, out_shardings=shardings[-1])
    args = [jax.device_put(x, s) for x, s in zip(args, shardings)]
  exported = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
  text = exported.mlir_module()
  assert CUSTOM_CALL not in text and "custom_partitioning" not in text
  restored = jax.export.deserialize(exported.serialize())
  assert restored.nr_devices == (8 if sharded else 1)
  testing.assert_close(restored.call(*args), testing.reference_f64(*ops.args(), beta=0.5),
                       jnp.bfloat16)
