"""The fused quantisers' partitioning (jax_fp8/quantize_sharding.py) on CPU meshes.

The Pallas kernels cannot run on several devices in GPU interpret mode (its
callbacks are ordered effects), so the kernels are stood in for by the jnp
quantisers (jax_fp8.testing.jnp_quantize_kernels: the same bits, and a record
of the shape of every x the "kernel" is traced with). Through backend="pallas"
the API takes the kernel path: the primitive, custom_partitioning, the Shardy
rule and the per-shard body. Each case checks against the unsharded jnp
quantisation, bitwise; which shape each device's kernel call got; and the
compiled HLO's collectives (none where the splits hold whole 128-groups).
The real kernels are lowered for CUDA (no GPU needed) through the same path,
and exported; tests/test_multigpu.py runs them on GPUs.
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_fp8
from sharding_util import collectives
from jax_fp8 import quantize_sharding, testing

CUSTOM_CALL = "CustomSPMDPartitioning"  # custom_partitioning's callback target.

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (virtual) devices")


def _mesh(shape, names=("x", "y")):
  n = int(np.prod(shape))
  return jax.make_mesh(shape, names[:len(shape)], axis_types=(AxisType.Auto,) * len(shape),
                       devices=jax.devices()[:n])


def _input(shape, seed=0):
  """float32 with rows and columns scaled over 2^-8 .. 2^8: a group given another
  group's scale shows."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape).astype(np.float32)
  x *= np.exp2(rng.integers(-8, 9, (shape[0], 1))).astype(np.float32)
  x *= np.exp2(rng.integers(-8, 9, (1, shape[1]))).astype(np.float32)
  return jnp.asarray(x)


def assert_bitwise(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


def run_sharded(op, x, mesh, spec, *, pow2=False, backend="pallas"):
  """op(x) jit-compiled with x sharded as spec, the kernel stood in for:
  (outputs, compiled HLO, shapes the kernel was traced with, our warnings)."""
  fn = getattr(jax_fp8, op)
  sharding = NamedSharding(mesh, spec)
  with testing.jnp_quantize_kernels() as kernels, warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    f = jax.jit(lambda x: fn(x, power_of_two_scales=pow2, backend=backend),
                in_shardings=sharding)
    lowered = f.lower(x)
    assert CUSTOM_CALL in lowered.as_text()  # the kernel path, partitioned
    compiled = lowered.compile()
    out = compiled(jax.device_put(x, sharding))
  messages = [str(w.message) for w in caught if "replicating" in str(w.message)]
  return out, compiled.as_text(), kernels.shapes, messages


# op, x shape, mesh shape, x spec, per-device kernel shape, pow2.
# Splits in whole 128-groups: no communication.
NO_COMMUNICATION = [
    ("quantize_1x128", (512, 384), (2,), P("x"), (256, 384), False),
    ("quantize_1x128", (200, 384), (2,), P("x"), (100, 384), True),   # T anywhere (evenly)
    ("quantize_1x128", (64, 1024), (2, 4), P("x", "y"), (32, 256), False),
    ("quantize_1x128_with_transpose", (512, 384), (2,), P("x"), (256, 384), False),
    ("quantize_1x128_with_transpose", (512, 1024), (2, 4), P("x", "y"), (256, 256), True),
    ("quantize_1x128_with_transpose", (1024, 256), (2, 4), P(("x", "y")), (128, 256), False),
    ("quantize_128x128", (512, 384), (2,), P("x"), (256, 384), False),
    ("quantize_128x128", (256, 1024), (2, 4), P(None, ("x", "y")), (256, 128), True),
    ("quantize_128x128_with_transpose", (384, 512), (2,), P(None, "x"), (384, 256), False),
    ("quantize_128x128_with_transpose", (1024, 512), (2, 4), P("y", "x"), (256, 256), False),
]


@pytest.mark.parametrize("op,shape,mesh_shape,spec,local,pow2", NO_COMMUNICATION,
                         ids=[f"{c[0][9:]}-{c[1][0]}x{c[1][1]}-{c[3]}" for c in NO_COMMUNICATION])
def test_splits_in_whole_groups_quantise_shard_by_shard(op, shape, mesh_shape, spec, local,
                                                        pow2):
  x = _input(shape)
  out, hlo, shapes, messages = run_sharded(op, x, _mesh(mesh_shape), spec, pow2=pow2)
  assert_bitwise(out, getattr(jax_fp8, op)(x, power_of_two_scales=pow2, backend="jnp"))
  # Traced once whole (for the output types), then for the local shard.
  assert shapes == [shape, local], shapes
  assert collectives(hlo) == {}, collectives(hlo)
  assert not messages, messages
  # q like x; the transposed copy transposed.
  want = NamedSharding(out[0].sharding.mesh, spec)
  assert out[0].sharding.is_equivalent_to(want, 2), out[0].sharding
  if len(out) == 4:
    t_spec = P(*(list(spec) + [None] * (2 - len(spec)))[::-1])
    assert out[2].sharding.is_equivalent_to(NamedSharding(want.mesh, t_spec), 2)


# Splits that cut 128-groups: the grouped dimension is replicated (gathered, then
# quantised whole on each device): still the right answer, and no warning (the
# matmul's partitioner shards such splits without one).
REPLICATED = [
    ("quantize_1x128_with_transpose", (200, 384), (2,), P("x")),      # T: 100 tokens each
    ("quantize_1x128", (64, 384), (2,), P(None, "x")),               # K: 192 columns each
    ("quantize_128x128", (2816, 256), (8,), P("x")),                  # 22 blocks over 8
    ("quantize_128x128_with_transpose", (256, 384), (2,), P(None, "x")),
    ("quantize_1x128_with_transpose", (256, 512), (2, 4), P(None, ("x", "y"))),  # 4 blocks / 8
]


@pytest.mark.parametrize("op,shape,mesh_shape,spec", REPLICATED,
                         ids=[f"{c[0][9:]}-{c[1][0]}x{c[1][1]}-{c[3]}" for c in REPLICATED])
def test_splits_that_cut_groups_replicate_and_stay_exact(op, shape, mesh_shape, spec):
  x = _input(shape, seed=1)
  out, hlo, shapes, messages = run_sharded(op, x, _mesh(mesh_shape), spec)
  assert_bitwise(out, getattr(jax_fp8, op)(x, backend="jnp"))
  assert shapes == [shape, shape], shapes   # every device quantises the whole array
  assert collectives(hlo).get("all-gather", 0) >= 1, collectives(hlo)
  assert not messages, messages


def test_uneven_split_replicates_with_the_matmuls_warning():
  """T = 201 reaches the kernel split over 2 devices by propagation (x[:201] of a
  sharded x): replicated, exact, with a warning as blockwise_fp8_dot gives for an
  uneven M."""
  mesh = _mesh((2,))
  x = _input((202, 256), seed=2)
  with testing.jnp_quantize_kernels() as kernels, warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    f = jax.jit(lambda x: jax_fp8.quantize_1x128(x[:201] * 2, backend="pallas"),
                in_shardings=NamedSharding(mesh, P("x")))
    out = f(x)
  assert_bitwise(out, jax_fp8.quantize_1x128(x[:201] * 2, backend="jnp"))
  assert kernels.shapes == [(201, 256), (201, 256)]
  messages = [str(w.message) for w in caught]
  assert any("quantize_1x128: replicating instead of sharding T" in m and "201 into 2" in m
             for m in messages), messages


def test_gspmd_partitioner_uses_infer_sharding_from_operands():
  """The deprecated GSPMD partitioner: the same partitioning, through the callbacks."""
  from jax._src import config as jax_config
  mesh = _mesh((2, 4))
  x = _input((512, 1024), seed=3)
  with jax_config.use_shardy_partitioner(False):
    out, hlo, shapes, messages = run_sharded("quantize_1x128_with_transpose", x, mesh,
                                             P("x", "y"))
  assert_bitwise(out, jax_fp8.quantize_1x128_with_transpose(x, backend="jnp"))
  assert shapes[-1] == (256, 256) and collectives(hlo) == {} and not messages


def test_leading_dims_and_vmap():
  """quantize_1x128 folds leading dims into T (its shards stay shards); under vmap
  the kernel function itself is batched (no partitioning)."""
  mesh = _mesh((2, 4))
  x = _input((4 * 64, 256), seed=4).reshape(4, 64, 256)
  out, hlo, shapes, _ = run_sharded("quantize_1x128", x, mesh, P("y"))
  assert_bitwise(out, jax_fp8.quantize_1x128(x, backend="jnp"))
  assert shapes[-1] == (64, 256) and collectives(hlo) == {}
  with testing.jnp_quantize_kernels():
    got = jax.jit(jax.vmap(lambda w: jax_fp8.quantize_128x128_with_transpose(
        w, backend="pallas")))(x)
  assert_bitwise(got, jax.vmap(lambda w: jax_fp8.quantize_128x128_with_transpose(
      w, backend="jnp"))(x))


def test_auto_takes_the_partitioned_kernel_for_cuda(monkeypatch):
  """backend="auto" on a Hopper GPU (faked: lowered for CUDA here) runs the real
  kernel through the partitioning under a multi-device jit, directly on one device."""
  from jax_fp8.pallas import device
  monkeypatch.setattr(device, "compute_capability", lambda: (9, 0))
  mesh = _mesh((2,))
  x = jax.ShapeDtypeStruct((512, 384), jnp.bfloat16)
  for op in quantize_sharding.OPS:
    f = getattr(jax_fp8, op)
    sharded = jax.jit(f, in_shardings=NamedSharding(mesh, P("x")))
    text = sharded.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert CUSTOM_CALL in text, op  # the kernel is lowered per shard, when XLA partitions
    text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and CUSTOM_CALL not in text, op


def test_export_lowers_the_kernel_directly():
  """custom_partitioning's callbacks cannot be serialised: a multi-device export
  lowers the kernel as a plain call (XLA gathers its input), here the real kernel
  for CUDA and the stand-in for the CPU, which runs after a round trip."""
  from jax_fp8.pallas import quantize as kernels
  mesh = _mesh((2,))
  sharding = NamedSharding(mesh, P("x"))
  x = _input((512, 384), seed=5)
  for op in quantize_sharding.OPS:
    f = jax.jit(lambda x: quantize_sharding.quantize(op, x, pow2=False, kernels=kernels),
                in_shardings=sharding)
    exported = jax.export.export(f, platforms=["cuda"])(
        jax.ShapeDtypeStruct(x.shape, jnp.bfloat16))
    text = exported.mlir_module()
    assert "mosaic_gpu" in text and CUSTOM_CALL not in text, op
    assert exported.nr_devices == 2 and exported.serialize()
  with testing.jnp_quantize_kernels():
    f = jax.jit(lambda x: jax_fp8.quantize_1x128_with_transpose(x, backend="pallas"),
                in_shardings=sharding)
    exported = jax.export.export(f, platforms=["cpu"])(x)
  assert CUSTOM_CALL not in exported.mlir_module()
  restored = jax.export.deserialize(exported.serialize())
  assert_bitwise(restored.call(jax.device_put(x, sharding)),
                 jax_fp8.quantize_1x128_with_transpose(x, backend="jnp"))


def test_interpret_mode_runs_the_kernel_whole_on_a_mesh():
  """GPU interpret mode traces the kernel with ordered effects (its callbacks),
  which no partitioning body can take: there it is a plain call, gathered and
  run whole on each device, and exact."""
  mesh = _mesh((2,))
  # Unscaled: on a 2-device CPU jit the interpreted kernel writes +0 for some q that
  # round to -0 on one device (so on main too: XLA's CPU code, not the partitioning).
  x = jax.random.normal(jax.random.key(6), (256, 256), jnp.float32)
  fn = lambda x: jax_fp8.quantize_1x128(x, backend="pallas")
  with testing.gpu_interpret_mode(detect_races=False):
    f = jax.jit(fn, in_shardings=NamedSharding(mesh, P("x")))
    assert CUSTOM_CALL not in f.lower(x).as_text()
    out = jax.block_until_ready(f(x))
    one = jax.block_until_ready(jax.jit(fn)(jax.device_put(x, jax.devices()[0])))
  assert_bitwise(out, one)
