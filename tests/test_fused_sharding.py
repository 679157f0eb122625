"""The fused-epilogue ops partition by jax_fp8.fused_sharding's rules on a (2, 4) CPU mesh.

Auto axes (jit in_shardings) and Explicit axes (jax.set_mesh: the outputs'
types carry the rule's sharding). Each sharded call against the same call on
one device (bitwise: every output element is computed by the same code on
either), the op lowered through its partitioner, the output's sharding, the
compiled HLO's collectives (none where the rule splits; a gather of what it
cannot split), and the warning only where the dense op would warn. Backend
"reference": kernels cannot run under several devices in GPU interpret mode.
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_fp8
from sharding_util import collectives as _collectives
from jax_fp8 import testing

CUSTOM_CALL = "CustomSPMDPartitioning"  # custom_partitioning's callback target.
FP8 = jnp.float8_e4m3fn

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (virtual) devices")


def _dot_fp8(per_row=False):
  block = (1, 128) if per_row else (128, 128)
  return lambda a, sa, b, sb: jax_fp8.blockwise_fp8_dot(
      a, sa, b, sb, out_dtype=FP8, b_scale_block=block, backend="reference")


def _dot_fp8_c(a, sa, b, sb, c):
  return jax_fp8.blockwise_fp8_dot(a, sa, b, sb, c, beta=0.5, out_dtype=FP8,
                                   backend="reference")


def _glu(out_dtype):
  return lambda a, sa, b, sb: jax_fp8.blockwise_fp8_glu(a, sa, b, sb, out_dtype=out_dtype,
                                                       backend="reference")


# name, fn, (m, n, k, batch), in specs of (a, a_scale, b, b_scale), out spec,
# expected collectives (None: any), warns
CASES = [
    ("dot_fp8_MN", _dot_fp8(), (256, 512, 256, ()), (P("x"), P("x"), P("y"), P("y")),
     P("x", "y"), {}, False),
    ("dot_fp8_per_row_b_N", _dot_fp8(True), (64, 512, 256, ()), (P(), P(), P("y"), P("y")),
     P(None, "y"), {}, False),
    ("dot_fp8_c_MN", _dot_fp8_c, (256, 512, 256, ()),
     (P("x"), P("x"), P("y"), P("y"), P("x", "y")), P("x", "y"), {}, False),
    ("dot_fp8_batch", _dot_fp8(), (64, 256, 256, (2,)),
     (P("x"), P("x"), P(), P()), P("x"), {}, False),
    # K cannot be split (the quantisation needs the whole sum): gathered.
    ("dot_fp8_K", _dot_fp8(), (64, 256, 512, ()), (P(None, "y"), P(None, "y"), P(None, "y"),
                                                   P(None, "y")), P(), None, False),
    # N = 256 over 4: 64 columns a shard, not whole groups: replicated, exact.
    ("dot_fp8_N_cuts_groups", _dot_fp8(), (64, 256, 256, ()), (P(), P(), P("y"), P()),
     P(), None, False),
    ("glu_M", _glu(jnp.bfloat16), (256, 512, 256, ()), (P(("x", "y")), P(("x", "y")), P(), P()),
     P(("x", "y")), {}, False),
    ("glu_fp8_M", _glu(FP8), (256, 512, 256, ()), (P("x"), P("x"), P(), P()), P("x"), {},
     False),
    # b's rows are gate then up: not split, gathered.
    ("glu_rows", _glu(jnp.float32), (64, 512, 256, ()), (P(), P(), P("y"), P("y")), P(), None,
     False),
    # One mesh axis for M and N: N gives it up, with the dense op's warning.
    ("dot_fp8_axis_twice", _dot_fp8(), (256, 512, 256, ()), (P("y"), P("y"), P("y"), P("y")),
     P("y"), None, True),
]


def _case_args(name, shape, in_specs, seed):
  """A case's operands (its name says whether it has c and per-row b scales)."""
  m, n, k, batch = shape
  ops = testing.random_operands(seed, m, n, k, batch=batch, with_c="_c_" in name,
                                b_scale_block=(1, 128) if "per_row" in name else (128, 128))
  return ops.args()[:len(in_specs)]


def _check_run(caught, warns, got, want, compiled, expect):
  """The replication warning iff expected, the result bitwise the unsharded one,
  and (where the case says) exactly the expected collectives."""
  messages = [str(w.message) for w in caught if "replicating instead of sharding" in str(w.message)]
  assert bool(messages) == warns, messages
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
  if expect is not None:
    assert _collectives(compiled.as_text()) == expect, _collectives(compiled.as_text())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_auto_axes(case):
  name, fn, shape, in_specs, out_spec, expect, warns = case
  args = _case_args(name, shape, in_specs, seed=sum(map(ord, name)))
  want = jax.jit(fn)(*args)
  mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
  shard = lambda spec: NamedSharding(mesh, spec)
  sharded = jax.jit(fn, in_shardings=tuple(map(shard, in_specs)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lowered = sharded.lower(*args)
    compiled = lowered.compile()
    got = compiled(*args)
  # The op goes through its own partitioner (on the CPU the reference's jnp
  # would partition without one, so the collective counts alone prove nothing).
  assert CUSTOM_CALL in lowered.as_text()
  _check_run(caught, warns, got, want, compiled, expect)
  if expect is not None:
    first = jax.tree.leaves(got)[0]
    assert first.sharding.is_equivalent_to(shard(out_spec), first.ndim), first.sharding


def _full(spec, ndim):
  return P(*spec, *([None] * (ndim - len(spec))))


# Explicit axes: the same cases but the one the types refuse (one mesh axis for
# M and N: tested below), and a GLU whose b rows share M's axis (fine: its rows
# are not split, so they claim no axis).
EXPLICIT = [c for c in CASES if c[0] != "dot_fp8_axis_twice"] + [
    ("glu_rows_on_M_axis", _glu(FP8), (256, 512, 256, ()), (P("y"), P("y"), P("y"), P("y")),
     P("y"), None, False),
]


@pytest.mark.parametrize("case", EXPLICIT, ids=[c[0] for c in EXPLICIT])
def test_explicit_axes(case):
  name, fn, shape, in_specs, out_spec, expect, warns = case
  args = _case_args(name, shape, in_specs, seed=sum(map(ord, name)) + 1)
  want = jax.jit(fn)(*args)
  f = jax.jit(fn)
  with jax.set_mesh(jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)):
    args = [jax.device_put(x, s) for x, s in zip(args, in_specs)]
    # Both outputs (q and its scales) typed by the rule: the partitioner's own
    # sharding, so nothing is resharded after the call.
    for leaf in jax.tree.leaves(jax.eval_shape(f, *args)):
      assert leaf.sharding.spec == _full(out_spec, leaf.ndim), (leaf.sharding.spec, out_spec)
    lowered = f.lower(*args)
    assert CUSTOM_CALL in lowered.as_text()
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      compiled = lowered.compile()
    got = compiled(*args)
  _check_run(caught, warns, got, want, compiled, expect)


@pytest.mark.parametrize("fn, specs, message", [
    (_glu(jnp.bfloat16), (P("x"), P("y"), P(), P()),
     r"blockwise_fp8_glu: M of a_scale .* reshard a_scale"),
    (_dot_fp8(), (P("y"), P("y"), P("y"), P("y")),
     r"blockwise_fp8_dot: mesh axis 'y' shards both M \(of a\) and N \(of b\); reshard b"),
], ids=["glu_scales_disagree", "dot_fp8_axis_twice"])
def test_explicit_axes_mismatch_names_the_argument_to_reshard(fn, specs, message):
  ops = testing.random_operands(7, 256, 512, 256)
  with jax.set_mesh(jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)):
    args = [jax.device_put(x, s) for x, s in zip(ops.args()[:4], specs)]
    with pytest.raises(Exception, match=message) as info:
      jax.jit(fn)(*args)
  assert type(info.value).__name__ == "ShardingTypeError"  # As lax.dot_general raises.


def test_glu_tensor_parallel_over_f_in_shard_map():
  """The README's recipe for F over devices: b's rows laid out per shard
  ([gate_0; up_0; gate_1; up_1; ...]), the GLU in shard_map on local shards
  (lowered directly), each device's F columns; equal to the unsharded call."""
  m, f, k, d = 64, 512, 256, 4
  ops = testing.random_operands(11, m, 2 * f, k)
  a, sa, b, sb = ops.args()[:4]
  fn = _glu(FP8)
  want = jax.jit(fn)(a, sa, b, sb)
  per_shard = lambda x: x.reshape(2, d, -1, x.shape[-1]).swapaxes(0, 1).reshape(x.shape)
  mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
  local = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(), P("y"), P("y")),
                                out_specs=(P(None, "y"), P(None, "y"))))
  lowered = local.lower(a, sa, per_shard(b), per_shard(sb))
  assert CUSTOM_CALL not in lowered.as_text()
  compiled = lowered.compile()
  got = compiled(a, sa, per_shard(b), per_shard(sb))
  assert _collectives(compiled.as_text()) == {}
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
