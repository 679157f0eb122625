"""The grouped GEMMs partition by jax_fp8.grouped_sharding's rules on a (2, 4) CPU mesh.

Each case against the float64 reference, with group sizes that straddle the
shards' rows (0, 1, 127, 129, rows past the sum), and the compiled HLO's
collectives: none for M, N, and the masked op's G; one reduction for K and the
ragged op's G (expert parallelism). A split that cannot be honoured warns and
replicates. Auto axes (jit in/out shardings) and Explicit axes (jax.set_mesh).
All on backend="reference": kernels cannot run under several devices in GPU
interpret mode.
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_fp8
from sharding_util import collectives
from jax_fp8 import testing

CUSTOM_CALL = "CustomSPMDPartitioning"  # custom_partitioning's callback target.
F32, BF16 = jnp.float32, jnp.bfloat16

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (virtual) devices")


def _mesh(axis_type):
  return jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type, axis_type))


def _fn(op, out_dtype):
  fn = jax_fp8.blockwise_fp8_ragged_dot if op == "ragged" else jax_fp8.blockwise_fp8_masked_dot
  return lambda *x: fn(*x, out_dtype=out_dtype, backend="reference")


# Ragged: M = 512 rows in 8 groups; the shards of M (2 or 4) cut through groups.
RAGGED_SIZES = [100, 0, 1, 127, 129, 3, 0, 50]   # 410 rows: the last 102 are past the sum
# Masked: 8 groups of 256 rows.
MASKED_M = [0, 256, 1, 127, 129, 200, 3, 255]


def _operands(op, seed, n=512, k=512, groups=8):
  if op == "ragged":
    sizes = (RAGGED_SIZES * 2)[:groups]
    return testing.random_ragged_operands(seed, 512, n, k, sizes)
  return testing.random_masked_operands(seed, 256, n, k, (MASKED_M * 2)[:groups])


def _reference(op, ops):
  ref = testing.reference_ragged_f64 if op == "ragged" else testing.reference_masked_f64
  return ref(*ops.args())


# name, op, specs of (a, a_scale, b, b_scale, sizes), output spec, expected
# collectives (None: replicated somewhere, any resharding), warns, out_dtype,
# operand shapes (n, k, groups).
CASES = [
    ("ragged_M", "ragged", (P("x"), P("x"), P(), P(), P()), P("x"), {}, False, F32),
    # 8 shards of 64 rows over two mesh axes.
    ("ragged_M8", "ragged", (P(("y", "x")), P(("y", "x")), P(), P(), P()), P(("y", "x")), {},
     False, BF16),
    ("ragged_N", "ragged", (P(), P(), P(None, "y"), P(None, "y"), P()), P(None, "y"), {}, False,
     BF16),
    ("ragged_K", "ragged", (P(None, "y"), P(None, "y"), P(None, None, "y"), P(None, None, "y"),
                            P()), P(), {"all-reduce": 1}, False, F32),
    # Expert parallelism: each device the rows of its own 2 experts, one psum.
    ("ragged_G", "ragged", (P(), P(), P("y"), P("y"), P()), P(), {"all-reduce": 1}, False,
     BF16),
    ("ragged_G_sizes_sharded", "ragged", (P(), P(), P("y"), P("y"), P("y")), P(),
     {"all-gather": 1, "all-reduce": 1}, False, F32),
    ("ragged_MG", "ragged", (P("x"), P("x"), P("y"), P("y"), P()), P("x"), {"all-reduce": 1},
     False, F32),
    ("ragged_MNK", "ragged", (P("x", "y"), P("x", "y"), P(None, None, "y"), P(None, None, "y"),
                              P()), P("x"), {"all-reduce": 1}, False, BF16),
    # One mesh axis for M and G: G keeps it, a is gathered.
    ("ragged_M_G_same_axis", "ragged", (P("y"), P("y"), P("y"), P("y"), P()), P(), None, True,
     F32),
    # 512 / 4 devices = 128 columns per shard would do; 256 gives 64: not whole blocks.
    ("ragged_N_unaligned", "ragged", (P(), P(), P(None, "y"), P(), P()), P(None, "y"), None,
     True, F32, (256, 512, 8)),
    ("masked_G", "masked", (P("x"), P("x"), P("x"), P("x"), P("x")), P("x"), {}, False, BF16),
    ("masked_M", "masked", (P(None, "y"), P(None, "y"), P(), P(), P()), P(None, "y"), {}, False,
     F32),
    ("masked_GM", "masked", (P("y", "x"), P("y", "x"), P("y"), P("y"), P("y")), P("y", "x"), {},
     False, F32),
    ("masked_GN", "masked", (P("y"), P("y"), P("y", "x"), P("y", "x"), P()),
     P("y", None, "x"), {}, False, BF16),
    ("masked_GK", "masked", (P("x", None, "y"), P("x", None, "y"), P("x", None, "y"),
                             P("x", None, "y"), P("x")), P("x"), {"all-reduce": 1}, False, F32),
    # K = 256 over 4 devices: 64 per shard, not whole blocks.
    ("masked_K_unaligned", "masked", (P(None, None, "y"), P(), P(None, None, "y"), P(), P()),
     P(), None, True, BF16, (512, 256, 8)),
]
IDS = [c[0] for c in CASES]


def _unpack(case):
  name, op, in_specs, out_spec, expect, warns, out_dtype, *shape = case
  n, k, groups = shape[0] if shape else (512, 512, 8)
  return name, op, in_specs, out_spec, expect, warns, out_dtype, n, k, groups


def _full(spec, ndim):
  return P(*spec, *([None] * (ndim - len(spec))))


def _check(op, out, ops, out_dtype, want_spec, hlo, expect, warns, caught):
  testing.assert_close(out, _reference(op, ops), out_dtype)
  assert out.sharding.is_equivalent_to(NamedSharding(out.sharding.mesh, want_spec), out.ndim)
  messages = [str(w.message) for w in caught if "blockwise_fp8_" in str(w.message)]
  if warns:
    assert messages and "replicating instead of sharding" in messages[0], messages
  else:
    assert not messages, messages
  if expect is not None:
    assert collectives(hlo) == expect, collectives(hlo)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_auto_axes(case):
  name, op, in_specs, out_spec, expect, warns, out_dtype, n, k, groups = _unpack(case)
  mesh = _mesh(AxisType.Auto)
  ops = _operands(op, len(name), n, k, groups)
  shard = lambda s: NamedSharding(mesh, s)
  f = jax.jit(_fn(op, out_dtype), in_shardings=tuple(map(shard, in_specs)),
              out_shardings=shard(out_spec))
  lowered = f.lower(*ops.args())
  assert CUSTOM_CALL in lowered.as_text()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    compiled = lowered.compile()
  out = compiled(*ops.args())
  ndim = 2 if op == "ragged" else 3
  _check(op, out, ops, out_dtype, _full(out_spec, ndim), compiled.as_text(), expect, warns,
         caught)
  if name == "ragged_G":
    # Every row is non-zero on one device only: the psum in bf16 is exact.
    one = jax.jit(_fn(op, out_dtype))(*ops.args())
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(one, np.float32))


EXPLICIT = ["ragged_M", "ragged_K", "ragged_MG", "masked_GM", "masked_GK"]


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in EXPLICIT], ids=EXPLICIT)
def test_explicit_axes(case):
  name, op, in_specs, out_spec, expect, warns, out_dtype, n, k, groups = _unpack(case)
  mesh = _mesh(AxisType.Explicit)
  ops = _operands(op, 100 + len(name), n, k, groups)
  f = jax.jit(_fn(op, out_dtype))
  ndim = 2 if op == "ragged" else 3
  with jax.set_mesh(mesh):
    args = [jax.device_put(x, s) for x, s in zip(ops.args(), in_specs)]
    # The output's type: M (and G of the masked op) from a, N from b; the
    # reductions (K, and G of the ragged op) replicated.
    want = _full(out_spec, ndim)
    assert jax.eval_shape(f, *args).sharding.spec == want
    lowered = f.lower(*args)
    assert CUSTOM_CALL in lowered.as_text()
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      compiled = lowered.compile()
    out = compiled(*args)
  _check(op, out, ops, out_dtype, want, compiled.as_text(), expect, warns, caught)


@pytest.mark.parametrize("op, specs, message", [
    ("ragged", (P("x"), P("y"), P(), P(), P()),
     r"M of a_scale .* reshard a_scale with jax.sharding.reshard\(a_scale, P\('x', None\)\)"),
    ("ragged", (P("x"), P("x"), P("x"), P("x"), P()),
     r"mesh axis 'x' shards both M \(of a\) and G \(of b\); reshard b"),
    ("masked", (P("x"), P("x"), P("y"), P(), P()),
     r"G of b is sharded over \('y',\) but G of a over \('x',\); reshard b"),
])
def test_explicit_axes_mismatch_names_the_argument_to_reshard(op, specs, message):
  ops = _operands(op, 7)
  with jax.set_mesh(_mesh(AxisType.Explicit)):
    args = [jax.device_put(x, s) for x, s in zip(ops.args(), specs)]
    with pytest.raises(Exception, match=message) as info:
      jax.jit(_fn(op, F32))(*args)
  assert type(info.value).__name__ == "ShardingTypeError"


def test_ragged_psum_scatters_when_the_output_is_split_over_the_expert_axes():
  mesh = _mesh(AxisType.Auto)
  ops = _operands("ragged", 3)
  shard = lambda *s: NamedSharding(mesh, P(*s))
  f = jax.jit(_fn("ragged", BF16), in_shardings=(shard(), shard(), shard("y"), shard("y"),
                                                 shard()), out_shardings=shard("y"))
  compiled = f.lower(*ops.args()).compile()
  out = compiled(*ops.args())
  testing.assert_close(out, _reference("ragged", ops), BF16)
  assert collectives(compiled.as_text()) == {"reduce-scatter": 1}


def test_gspmd_partitioner_uses_infer_sharding_from_operands():
  from jax._src import config as jax_config
  mesh = _mesh(AxisType.Auto)
  ops = _operands("ragged", 4)
  shard = lambda *s: NamedSharding(mesh, P(*s))
  with jax_config.use_shardy_partitioner(False):
    f = jax.jit(_fn("ragged", F32), in_shardings=(shard("x"), shard("x"), shard("y"),
                                                  shard("y"), shard()), out_shardings=shard("x"))
    compiled = f.lower(*ops.args()).compile()
  out = compiled(*ops.args())
  testing.assert_close(out, _reference("ragged", ops), F32)
  assert collectives(compiled.as_text()) == {"all-reduce": 1}


def test_shard_map_on_local_shards():
  """Inside shard_map the op runs on each device's local operands as they are:
  expert parallelism with tokens already dispatched to their experts' devices."""
  mesh = _mesh(AxisType.Auto)
  ops = _operands("masked", 9)
  f = jax.jit(jax.shard_map(_fn("masked", F32), mesh=mesh, in_specs=P("y"), out_specs=P("y")))
  lowered = f.lower(*ops.args())
  assert CUSTOM_CALL not in lowered.as_text()  # Manual context: lowered directly.
  testing.assert_close(lowered.compile()(*ops.args()), _reference("masked", ops), F32)


@pytest.mark.parametrize("op", ["ragged", "masked"])
def test_export_of_a_sharded_call_has_no_partitioning_callback(op):
  ops = _operands(op, 11)
  mesh = _mesh(AxisType.Auto)
  specs = ((P("x"), P("x"), P(None, "y"), P(None, "y"), P()) if op == "ragged" else
           (P("x"), P("x"), P("x", "y"), P("x", "y"), P("x")))
  shardings = [NamedSharding(mesh, s) for s in specs]
  f = jax.jit(_fn(op, BF16), in_shardings=shardings)
  args = [jax.device_put(x, s) for x, s in zip(ops.args(), shardings)]
  exported = jax.export.export(f, platforms=["cpu"])(*args)
  text = exported.mlir_module()
  assert CUSTOM_CALL not in text and "custom_partitioning" not in text
  restored = jax.export.deserialize(exported.serialize())
  assert restored.nr_devices == 8
  testing.assert_close(restored.call(*args), _reference(op, ops), BF16)


def test_masked_expected_m_survives_partitioning():
  """The masked op's expected_m hint goes through custom_partitioning to every
  shard, also where it exceeds a shard's rows (M = 256 over 2 devices)."""
  mesh = _mesh(AxisType.Auto)
  ops = _operands("masked", 11)
  shard = lambda s: NamedSharding(mesh, s)  # noqa: E731
  specs = (P("y", "x"), P("y", "x"), P("y"), P("y"), P("y"))
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_masked_dot(
      *x, out_dtype=F32, backend="reference", expected_m=200),
      in_shardings=tuple(map(shard, specs)), out_shardings=shard(P("y", "x")))
  lowered = f.lower(*ops.args())
  assert CUSTOM_CALL in lowered.as_text()
  testing.assert_close(lowered.compile()(*ops.args()), _reference("masked", ops), F32)
