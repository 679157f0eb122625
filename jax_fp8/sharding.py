"""How `blockwise_fp8_dot` partitions over a device mesh.

The op is a matmul with block-scaled operands, so it shards like one:

    factor   a          a_scale    b        b_scale   c / out
    batch    [..]       [..]       -        -         [..]
    M        -2         -2         -        -         -2
    N        -          -          0        0 (blks)  -1     (per-row b scales: 0, rows)
    K        -1         -1 (blks)  1        1 (blks)  -        (reduction)

- Batch, M or N sharded: every device computes its own tile, no communication.
- K sharded: every device sums its own K blocks in float32 (no c, no cast),
  then one psum (psum_scatter when the output is wanted sharded over the same
  axes), then + beta*c and the cast to out_dtype, exactly once.
- Scales go with their 128-blocks, so a shard of N or K must be a whole number
  of 128-blocks; a split that is not gets replicated, with a warning. With
  per-row b scales (b_scale_block=(1, 128), b_scale [N, ceil(K/128)]) the
  scales go with b's rows, and N shards like M: any even split.

Entry points, used by jax_fp8.primitive:
- `wants_partitioning(ctx)` / `lower(ctx, ...)`: under a multi-device jit with
  a mesh, the lowering wraps the primitive in
  jax.experimental.custom_partitioning with a Shardy rule (and GSPMD
  callbacks); the per-shard body binds the primitive again on the local
  shards and is lowered in a fully manual context, where the primitive lowers
  directly (no recursion). Single-device jit, shard_map bodies and jax.export
  lower directly, so their code has no Python callback (a multi-device export
  is partitioned by XLA from the plain lowering instead).
- `lower_locally(ctx, fn, ...)`: the direct lowering, traced with no mesh.
- `out_sharding(...)`: the output sharding for abstract evaluation (Explicit
  mesh axes), like lax.dot_general's rule.
The primitive is registered as needing devices at lowering time (the custom
call needs the mesh), so jax.export with only an AbstractMesh is refused.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core
from jax._src import mesh as mesh_lib
from jax._src import sharding_impls
from jax._src.interpreters import mlir as mlir_internal
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_fp8.quantize import BLOCK

ARG_NAMES = ("a", "a_scale", "b", "b_scale", "c")


# ----------------------------------------------------------------- lowering

def wants_partitioning(ctx) -> bool:
  """True when this lowering spans several devices under a (GSPMD/Shardy)
  sharding context with a mesh, and is not for jax.export.

  Fully or partly manual contexts (shard_map, custom_partitioning bodies),
  pmap and single-device lowering lower the primitive directly.
  """
  if ctx.module_context.lowering_parameters.for_export:
    return False  # custom_partitioning's callbacks cannot be serialised.
  axis_context = ctx.module_context.axis_context
  if not isinstance(axis_context, sharding_impls.ShardingContext):
    return False
  return axis_context.num_devices > 1 and _mesh_of(axis_context) is not None


def _mesh_of(axis_context):
  """The concrete mesh custom_partitioning will use, or None."""
  devices, am = axis_context.device_assignment, axis_context.abstract_mesh
  if devices is not None and am is not None and not am.empty:
    return am
  physical = mesh_lib.thread_resources.env.physical_mesh  # `with mesh:`
  return None if physical.empty else physical


def lower(ctx, prim, *args, beta, out_dtype, backend, has_c, b_scale_block):
  """Lowering rule of `prim` (blockwise_fp8_dot_p) under a multi-device sharding context."""
  a_aval, b_aval = ctx.avals_in[0], ctx.avals_in[2]
  fn = _partitioned(prim, batch_ndim=a_aval.ndim - 2, n=b_aval.shape[0], k=b_aval.shape[1],
                    beta=beta, out_dtype=np.dtype(out_dtype), backend=backend, has_c=has_c,
                    b_scale_block=tuple(b_scale_block))
  return lower_locally(ctx, fn, *args)


def lower_locally(ctx, fn, *args):
  """mlir.lower_fun(fn) on sharding-free avals, then the result pinned to the
  output aval's sharding (Explicit axes), as jax's own primitives do.

  Inside, nothing is traced against a mesh: the implementations are written
  for one device, and sharding constraints must not appear in a per-shard
  body (its module is not partitioned again).
  """
  plain = [core.ShapedArray(x.shape, x.dtype) for x in ctx.avals_in]
  out_aval = ctx.avals_out[0]
  inner = ctx.replace(avals_in=plain, avals_out=[core.ShapedArray(out_aval.shape, out_aval.dtype)])
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
    out, = mlir.lower_fun(fn, multiple_results=False)(inner, *args)
  return [mlir_internal.lower_with_sharding_in_types(ctx, out, out_aval)]


@functools.cache
def _partitioned(prim, *, batch_ndim, n, k, beta, out_dtype, backend, has_c, b_scale_block):
  """The primitive wrapped in custom_partitioning for one static configuration."""
  params = dict(beta=beta, out_dtype=out_dtype, backend=backend, has_c=has_c,
                b_scale_block=b_scale_block)
  n_block = BLOCK if b_scale_block[0] == BLOCK else 0  # b_scale rows per scale

  @custom_partitioning
  def fp8_dot(*xs):
    return prim.bind(*xs, **params)

  def partition(mesh, arg_shapes, result_shape):
    plan = _Plan.from_shardings(mesh, arg_shapes, result_shape, has_c=has_c, n_block=n_block)
    return mesh, plan.body(prim, params), plan.result_sharding(), plan.arg_shardings()

  def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
    # Used by the (deprecated) GSPMD partitioner only; Shardy uses the rule.
    return _Plan.from_shardings(mesh, arg_shapes, None, has_c=has_c, n_block=n_block,
                                quiet=True).result_sharding()

  def propagate_user_sharding(mesh, user_shape):
    return user_shape.sharding  # Any output sharding is fine (GSPMD only).

  rule, factor_kwargs = _sharding_rule(batch_ndim, n, k, has_c, n_block)
  fp8_dot.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                        propagate_user_sharding=propagate_user_sharding,
                        sharding_rule=rule, **factor_kwargs)
  return fp8_dot


def _sharding_rule(batch_ndim, n, k, has_c, n_block=BLOCK):
  """Shardy's einsum-like rule. Aligned N/K are compound factors (blocks x 128)
  so that only whole 128-blocks can be sharded; the in-block factors need
  replication. An unaligned N or K (a partial last block) is never split.
  n_block=0 (per-row b scales): b_scale's rows are b's rows, one factor n."""
  batch = " ".join(f"b{i}" for i in range(batch_ndim))
  replicate, sizes = [], {}
  if k % BLOCK == 0:
    a_k, s_k = "(kb ki)", "kb"
    replicate.append("ki")
    sizes["ki"] = BLOCK
  else:
    a_k, s_k = "k", "kb"
    replicate += ["k", "kb"]
  if not n_block:
    b_n, s_n = "n", "n"
  elif n % BLOCK == 0:
    b_n, s_n = "(nb ni)", "nb"
    replicate.append("ni")
    sizes["ni"] = BLOCK
  else:
    b_n, s_n = "n", "nb"
    replicate += ["n", "nb"]
  out = f"{batch} m {b_n}"
  operands = [f"{batch} m {a_k}", f"{batch} m {s_k}", f"{b_n} {a_k}", f"{s_n} {s_k}"]
  if has_c:
    operands.append(out)
  rule = ", ".join(operands) + " -> " + out
  reduction = ("kb",) if k % BLOCK == 0 else ()
  return rule, dict(reduction_factors=reduction, need_replication_factors=tuple(replicate),
                    **sizes)


def _axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry as a tuple of mesh axis names."""
  if entry is None or entry is P.UNCONSTRAINED:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _entry(axes):
  return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def _spec(sharding, ndim) -> list[tuple[str, ...]]:
  if not isinstance(sharding, NamedSharding):
    return [()] * ndim  # Not expressible on the mesh: treat as replicated.
  parts = list(sharding.spec) + [None] * (ndim - len(sharding.spec))
  return [_axes(e) for e in parts[:ndim]]


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Which mesh axes shard batch, M, N and K inside one partitioned call."""
  mesh: Any
  batch_axes: tuple[tuple[str, ...], ...]
  m_axes: tuple[str, ...]
  n_axes: tuple[str, ...]
  k_axes: tuple[str, ...]     # Non-empty: partial sums, then one reduction.
  scatter_dim: int | None     # Reduce with psum_scatter along this output dim.
  has_c: bool

  @classmethod
  def from_shardings(cls, mesh, arg_shapes, result_shape, *, has_c, n_block=BLOCK,
                     quiet=False):
    a, b = arg_shapes[0], arg_shapes[2]
    *batch, m, k = a.shape
    n = b.shape[0]
    a_spec, b_spec = _spec(a.sharding, a.ndim), _spec(b.sharding, 2)
    sizes = dict(mesh.shape)
    used: set[str] = set()
    dropped = []

    def claim(name, axes, size, block):
      """The axes `name` keeps: unused ones, and only if the split is even
      (and, for N and K, whole 128-blocks per shard)."""
      axes = tuple(ax for ax in axes if ax in sizes)
      if any(ax in used for ax in axes):
        dropped.append(f"{name} over {axes} (the mesh axis already shards another dimension)")
        return ()
      shards = math.prod(sizes[ax] for ax in axes)
      if shards > 1 and (size % shards or (block and (size // shards) % block)):
        what = f"{size} into {shards}" + (f" (needs a multiple of {block} per shard)"
                                           if block else "")
        dropped.append(f"{name} over {axes}: cannot split {what} evenly")
        return ()
      used.update(axes)
      return axes

    batch_axes = tuple(claim(f"batch dim {i}", a_spec[i], d, 0) for i, d in enumerate(batch))
    m_axes = claim("M", a_spec[-2], m, 0)
    n_axes = claim("N", b_spec[0], n, n_block)
    k_axes = claim("K", a_spec[-1] or b_spec[1], k, BLOCK)
    if dropped and not quiet:
      warnings.warn("blockwise_fp8_dot: replicating instead of sharding " + "; ".join(dropped)
                    + ". The result is exact but pays for the replication; shard N and K in "
                    "whole 128-blocks (per-shard size a multiple of 128) and batch/M evenly.",
                    stacklevel=2)

    # When the caller wants the output split over exactly the K axes, reduce
    # with psum_scatter along that dimension instead of psum + slice.
    scatter_dim = None
    if k_axes and result_shape is not None:
      out_dims = (*batch, m, n)
      want = _spec(result_shape.sharding, len(out_dims))
      have = (*batch_axes, m_axes, n_axes)
      shards = math.prod(sizes[ax] for ax in k_axes)
      for d, (w, h, size) in enumerate(zip(want, have, out_dims)):
        if w == k_axes and not h and size % shards == 0:
          scatter_dim = d
          break
    return cls(mesh, batch_axes, m_axes, n_axes, k_axes, scatter_dim, has_c)

  def _out_spec(self):
    dims = [*self.batch_axes, self.m_axes, self.n_axes]
    if self.scatter_dim is not None:
      dims[self.scatter_dim] = self.k_axes
    return P(*map(_entry, dims))

  def result_sharding(self):
    return NamedSharding(self.mesh, self._out_spec())

  def arg_shardings(self):
    batch = tuple(map(_entry, self.batch_axes))
    m, n, k = _entry(self.m_axes), _entry(self.n_axes), _entry(self.k_axes)
    specs = [P(*batch, m, k), P(*batch, m, k), P(n, k), P(n, k)]
    if self.has_c:
      specs.append(self._out_spec())
    return tuple(NamedSharding(self.mesh, s) for s in specs)

  def body(self, prim, params):
    """The per-shard computation (runs on local shards, in a manual context)."""
    k_axes, scatter_dim = self.k_axes, self.scatter_dim
    if not k_axes:
      return _without_mesh(lambda *xs: prim.bind(*xs, **params))
    beta, out_dtype, has_c = params["beta"], params["out_dtype"], params["has_c"]

    @_without_mesh
    def body(*xs):
      partial = prim.bind(*xs[:4], **dict(params, beta=1.0, out_dtype=np.dtype(jnp.float32),
                                          has_c=False))
      if scatter_dim is None:
        acc = lax.psum(partial, k_axes)
      else:
        acc = lax.psum_scatter(partial, k_axes, scatter_dimension=scatter_dim, tiled=True)
      if has_c:
        acc = acc + jnp.float32(beta) * xs[4].astype(jnp.float32)
      return acc.astype(out_dtype)
    return body


def _without_mesh(fn):
  """Traces fn with no context mesh: a per-shard body runs on one device, and
  jax.set_mesh's mesh (still set while XLA compiles) must not add sharding
  constraints to it."""
  @functools.wraps(fn)
  def wrapped(*xs):
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
      return fn(*xs)
  return wrapped


# ------------------------------------------------------- Explicit axes (typing)

def out_sharding(a, a_scale, b, b_scale, c):
  """Output sharding under Explicit mesh axes, like lax.dot_general's rule.

  Batch dims and M come from a, N from b, K is a reduction (the output is
  replicated over K's axes: the op sums over them). a_scale, b_scale and c must
  agree with that, dimension by dimension, where they are sharded at all; a
  replicated dimension is fine (each device slices its part).
  """
  avals = dict(zip(ARG_NAMES, (a, a_scale, b, b_scale, c)))
  avals = {k: v for k, v in avals.items() if v is not None}
  meshes = {name: v.sharding.mesh for name, v in avals.items()
            if getattr(v, "sharding", None) is not None and not v.sharding.mesh.empty}
  if not meshes:
    # No mesh: say so explicitly, else the context mesh (e.g. set_mesh while a
    # per-shard body is traced) would be assumed, as for lax.dot_general.
    if getattr(a, "sharding", None) is None:
      return None
    return NamedSharding(a.sharding.mesh, P(*[None] * a.ndim))
  mesh = next(iter(meshes.values()))
  for name, other in meshes.items():
    if other != mesh:
      raise core.ShardingTypeError(
          f"blockwise_fp8_dot: all arguments must be on one mesh; {name} is on {other} "
          f"but {next(iter(meshes))} is on {mesh}")
  for name, v in avals.items():
    if name in meshes and (v.sharding.spec.unreduced or v.sharding.spec.reduced):
      raise core.ShardingTypeError(
          f"blockwise_fp8_dot: {name} must not be unreduced/reduced, got {v.sharding.spec}")

  def spec(name):
    v = avals[name]
    return _spec(v.sharding, v.ndim) if name in meshes else [()] * v.ndim

  nb = a.ndim - 2
  # Dimensions that must agree, per factor: (argument, dimension), leader first.
  factors = {f"batch dim {i}": [("a", i), ("a_scale", i), ("c", i)] for i in range(nb)}
  factors["M"] = [("a", nb), ("a_scale", nb), ("c", nb)]
  factors["N"] = [("b", 0), ("b_scale", 0), ("c", nb + 1)]
  factors["K"] = [("a", nb + 1), ("b", 1), ("a_scale", nb + 1), ("b_scale", 1)]
  specs = {name: spec(name) for name in avals}
  resolved, owner = {}, {}
  for factor, members in factors.items():
    axes, leader = (), None
    for name, dim in members:
      if name not in specs:
        continue
      here = specs[name][dim]
      if not here:
        continue
      if not axes:
        axes, leader = here, name
      elif here != axes:
        raise core.ShardingTypeError(
            f"blockwise_fp8_dot: {factor} of {name} is sharded over {here} but {factor} of "
            f"{leader} over {axes}; reshard {name} with jax.sharding.reshard({name}, "
            f"{_suggest(name, specs, factors, dim, axes)})")
    for ax in axes:
      if ax in owner:
        raise core.ShardingTypeError(
            f"blockwise_fp8_dot: mesh axis {ax!r} shards both {owner[ax][0]} (of "
            f"{owner[ax][1]}) and {factor} (of {leader}); reshard {leader} with "
            "jax.sharding.reshard so that each mesh axis shards one dimension")
      owner[ax] = (factor, leader)
    resolved[factor] = axes
  out = [resolved[f"batch dim {i}"] for i in range(nb)] + [resolved["M"], resolved["N"]]
  return NamedSharding(mesh, P(*map(_entry, out)))


def _suggest(name, specs, factors, dim, axes):
  """The PartitionSpec `name` should have: its own, with `dim` set to `axes`."""
  spec = list(specs[name])
  spec[dim] = axes
  return P(*map(_entry, spec))
