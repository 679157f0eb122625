"""How the fused quantiser kernels partition over a device mesh.

The Pallas kernels (jax_fp8.pallas.quantize) are custom calls XLA cannot look
into; alone, a sharded input would be gathered and quantised whole on every
device. `quantize_p` wraps the kernel: under a multi-device jit its lowering
puts the kernel in jax.experimental.custom_partitioning with a Shardy rule,
so each device quantises its own shard. A dimension may be split where every
shard holds whole 128-groups along it:

    op                            x      outputs                               split
    quantize_1x128                [T, K] q [T, K], s [T, kb]                   T anywhere, K in blocks
    quantize_1x128_with_transpose [T, K] + q_t [K, T], s_t [K, tb]             T, K in blocks
    quantize_128x128              [N, K] q [N, K], s [nb, kb]                  N, K in blocks
    quantize_128x128_with_transpose      + q_t [K, N], s_t [kb, nb]            N, K in blocks

- "In blocks": the size is a multiple of 128 and its blocks divide evenly over
  every mesh axis (`sharding._splits_in_blocks`); the rule then makes the
  dimension a compound factor (blocks x 128) whose in-block factor needs
  replication, and the scales go with their blocks. A grouped dimension that
  cannot be split so (T = 200 over 2, K = 2816 over 8) is replicated: the
  input is gathered and every device quantises it whole (the right answer,
  as before). No communication otherwise.
- The transposed outputs carry the transposed shardings.
- A split the partitioner still hands over that cannot be used (over part of
  a mesh axis, uneven, or one mesh axis on both dimensions) is replicated
  with a warning, as jax_fp8.sharding does for the matmul.

Single-device jit, manual contexts (shard_map, per-shard bodies) and
jax.export lower the kernel directly: custom_partitioning's Python callbacks
cannot be serialised (a multi-device export gathers the kernel's input, as
XLA does for any custom call). Like the matmul primitive, `quantize_p` needs
the devices at lowering time, so jax.export with only an AbstractMesh is
refused where the kernel path is taken (a Hopper or Blackwell GPU).

`kernels`, a parameter of the primitive, is the object holding the kernel
functions (jax_fp8.pallas.quantize); tests pass the jnp quantisers instead
(jax_fp8.testing.jnp_quantize_kernels) to run the partitioning on CPU meshes.
"""
from __future__ import annotations

import functools
import math
import re
import warnings

import jax
import jax.numpy as jnp
from jax._src import core
from jax._src import dispatch
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_fp8 import sharding
from jax_fp8.blocks import BLOCK, FP8, num_blocks

# op -> (T grouped, has the transposed outputs, scales in 128x128 blocks)
OPS = {
    "quantize_1x128": (False, False, False),
    "quantize_1x128_with_transpose": (True, True, False),
    "quantize_128x128": (True, False, True),
    "quantize_128x128_with_transpose": (True, True, True),
}


def quantize(op: str, x: jax.Array, *, pow2: bool, kernels):
  """The kernel `op` of `kernels` on the 2-D x: (q, s) or (q, s, q_t, s_t)."""
  return tuple(quantize_p.bind(x, op=op, pow2=pow2, kernels=kernels))


def call_kernel(kernels, op, pow2, x):
  """The kernel `op` of `kernels` on the 2-D x, called directly (no partitioning)."""
  if op == "quantize_128x128_with_transpose":
    out = kernels.quantize_128x128(x, power_of_two_scales=pow2, with_transpose=True)
  else:
    out = getattr(kernels, op)(x, power_of_two_scales=pow2)
  return tuple(out)


quantize_p = Primitive("jax_fp8_quantize")
quantize_p.multiple_results = True
quantize_p.def_impl(functools.partial(dispatch.apply_primitive, quantize_p))
# custom_partitioning needs the device assignment and mesh at lowering time.
dispatch.prim_requires_devices_during_lowering.add(quantize_p)


def _out_shapes(op, t, k):
  _, transposed, blocks = OPS[op]
  tb, kb = num_blocks(t), num_blocks(k)
  shapes = [(t, k), (tb if blocks else t, kb)]
  if transposed:
    shapes += [(k, t), (kb if blocks else k, tb)]
  return shapes


def _abstract_eval(x, *, op, pow2, kernels):
  del pow2, kernels
  return [core.ShapedArray(shape, FP8 if i % 2 == 0 else jnp.float32)
          for i, shape in enumerate(_out_shapes(op, *x.shape))]


quantize_p.def_abstract_eval(_abstract_eval)


def _lowering(ctx, x, *, op, pow2, kernels):
  fn = functools.partial(call_kernel, kernels, op, pow2)
  if sharding.wants_partitioning(ctx):
    axis_sizes = tuple(sharding._mesh_of(ctx.module_context.axis_context).shape.values())
    fn = _partitioned(op, pow2, kernels, tuple(ctx.avals_in[0].shape), axis_sizes)
  return sharding.lower_locally(ctx, fn, x, multiple_results=True)


mlir.register_lowering(quantize_p, _lowering)


def _batching_rule(args, dims, *, op, pow2, kernels):
  # Under vmap the kernel function itself (a batched pallas_call), as before
  # this primitive existed: rows of 1x128 are folded by the API instead.
  x, = args
  out = jax.vmap(functools.partial(call_kernel, kernels, op, pow2), in_axes=dims[0])(x)
  return out, (0,) * len(out)


batching.primitive_batchers[quantize_p] = _batching_rule


# ------------------------------------------------------------------ partitioning

@functools.cache
def _partitioned(op, pow2, kernels, shape, axis_sizes):
  """The kernel wrapped in custom_partitioning for one static configuration."""
  t_grouped, transposed, _ = OPS[op]
  t, k = shape
  grouped = (t_grouped, True)
  in_blocks = tuple(g and sharding._splits_in_blocks(size, axis_sizes)
                    for g, size in zip(grouped, shape))
  plan = functools.partial(_plan, op=op, grouped=grouped)

  @custom_partitioning
  def kernel(x):
    return call_kernel(kernels, op, pow2, x)

  def partition(mesh, arg_shapes, result_shape):
    t_axes, k_axes = plan(mesh, arg_shapes[0])
    body = sharding._without_mesh(functools.partial(call_kernel, kernels, op, pow2))
    return (mesh, body, _result_shardings(mesh, t_axes, k_axes, transposed),
            (NamedSharding(mesh, P(sharding._entry(t_axes), sharding._entry(k_axes))),))

  def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
    # The (deprecated) GSPMD partitioner only; Shardy uses the rule.
    return _result_shardings(mesh, *plan(mesh, arg_shapes[0], quiet=True), transposed)

  def propagate_user_sharding(mesh, user_shape):
    return tuple(s.sharding for s in user_shape)  # GSPMD only: the users' shardings.

  rule, factor_kwargs = _sharding_rule(op, grouped, in_blocks)
  kernel.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                       propagate_user_sharding=propagate_user_sharding, sharding_rule=rule,
                       decode_shardings=False, **factor_kwargs)
  return kernel


def _sharding_rule(op, grouped, in_blocks):
  """Shardy's rule. A grouped dimension split in blocks is the compound factor
  (blocks x 128), the in-block factor replicated; one that cannot be is
  replicated whole (its data and its scales' factors)."""
  replicate, sizes, data, scale = [], {}, [], []
  for name, g, b in zip("tk", grouped, in_blocks):
    if not g:
      data.append(name)
      scale.append(name)
    elif b:
      data.append(f"({name}b {name}i)")
      scale.append(f"{name}b")
      replicate.append(f"{name}i")
      sizes[f"{name}i"] = BLOCK
    else:
      data.append(name)
      scale.append(f"{name}bs")
      replicate += [name, f"{name}bs"]
  (t, k), (ts, ks) = data, scale
  _, transposed, blocks = OPS[op]
  outs = [f"{t} {k}", f"{ts if blocks else t} {ks}"]
  if transposed:
    outs += [f"{k} {t}", f"{ks if blocks else k} {ts}"]
  rule = f"{t} {k} -> " + ", ".join(outs)
  # Shardy wants them in the order the factors first appear in the rule.
  order = list(dict.fromkeys(re.findall(r"[a-z]+", rule)))
  return rule, dict(need_replication_factors=tuple(sorted(replicate, key=order.index)), **sizes)


def _plan(mesh, x, *, op, grouped, quiet=False):
  """The mesh axes that split T and K inside one partitioned call: those of x's
  sharding that keep whole 128-groups on every shard of a grouped dimension
  (any even split of one that is not); the rest is replicated.

  Warns where the matmul's partitioner does (a split over part of a mesh axis,
  uneven, or one axis on both dimensions), not for an even split that cuts
  128-groups (the matmul aligns such shards itself; a quantiser's groups need
  the whole dimension)."""
  dropped = []
  decoded = sharding._decode(x.sharding, mesh)
  if decoded is None and not sharding._replicated(x.sharding):
    dropped.append("x (sharded over part of a mesh axis)")
  spec = sharding._spec(decoded, 2)
  sizes = dict(mesh.shape)
  claim = sharding.AxisClaims(sizes, set(), dropped)
  axes = []
  for d, name in enumerate("TK"):
    size, shards = x.shape[d], math.prod(sizes.get(ax, 1) for ax in spec[d])
    cuts_groups = grouped[d] and size % shards == 0 and (size // shards) % BLOCK
    axes.append(() if cuts_groups else claim(name, spec[d], size, 0))
  if dropped and not quiet:
    warnings.warn(f"{op}: replicating instead of sharding " + "; ".join(dropped)
                  + ". The result is exact but every device quantises the whole dimension; "
                  "shard grouped dimensions in whole 128-groups and the others evenly.",
                  stacklevel=2)
  return tuple(axes)


def _result_shardings(mesh, t_axes, k_axes, transposed):
  """q and s split like x (a scale dimension keeps the axes of its groups,
  which are whole on every shard); q_t, s_t transposed."""
  t, k = sharding._entry(t_axes), sharding._entry(k_axes)
  specs = [P(t, k), P(t, k)] + ([P(k, t), P(k, t)] if transposed else [])
  return tuple(NamedSharding(mesh, s) for s in specs)
