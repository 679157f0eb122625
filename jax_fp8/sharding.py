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
- Scales go with their 128-blocks where every split of the mesh holds whole
  blocks. Elsewhere (N = 2816 is 22 blocks, 2.75 per device of 8) N or K may be
  split anywhere: the scales come replicated along it (a few KB), and each
  device pads its shard in front to its first block's boundary, takes the
  scales of the blocks it touches, and slices its columns back out (N), or
  adds its partial sums into the reduction (K). No operand bytes move. With
  per-row b scales (b_scale_block=(1, 128), b_scale [N, ceil(K/128)]) the
  scales go with b's rows, and N shards like M: any even split.
- What cannot be split evenly (or a mesh axis wanted by two dimensions) is
  replicated, with a warning.

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

from jax_fp8.blocks import BLOCK

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
  axis_sizes = tuple(_mesh_of(ctx.module_context.axis_context).shape.values())
  fn = _partitioned(prim, batch_ndim=a_aval.ndim - 2, n=b_aval.shape[0], k=b_aval.shape[1],
                    axis_sizes=axis_sizes, beta=beta, out_dtype=np.dtype(out_dtype),
                    backend=backend, has_c=has_c, b_scale_block=tuple(b_scale_block))
  return lower_locally(ctx, fn, *args)


def lower_locally(ctx, fn, *args, multiple_results: bool = False):
  """mlir.lower_fun(fn) on sharding-free avals, then the results pinned to the
  output avals' shardings (Explicit axes), as jax's own primitives do.

  Inside, nothing is traced against a mesh: the implementations are written
  for one device, and sharding constraints must not appear in a per-shard
  body (its module is not partitioned again).
  """
  plain = [core.ShapedArray(x.shape, x.dtype) for x in ctx.avals_in]
  inner = ctx.replace(avals_in=plain,
                      avals_out=[core.ShapedArray(a.shape, a.dtype) for a in ctx.avals_out])
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
    outs = mlir.lower_fun(fn, multiple_results=multiple_results)(inner, *args)
  return [mlir_internal.lower_with_sharding_in_types(ctx, out, aval)
          for out, aval in zip(outs, ctx.avals_out)]


@functools.cache
def _partitioned(prim, *, batch_ndim, n, k, axis_sizes, beta, out_dtype, backend, has_c,
                 b_scale_block):
  """The primitive wrapped in custom_partitioning for one static configuration."""
  params = dict(beta=beta, out_dtype=out_dtype, backend=backend, has_c=has_c,
                b_scale_block=b_scale_block)
  n_rows = b_scale_block[0] == 1  # per-row b scales: they go with b's rows
  # N (K) in whole blocks where a split over any one mesh axis holds whole
  # blocks; else split anywhere, each shard aligning itself to them (_Plan.body).
  in_blocks = dict(n=n_rows or _splits_in_blocks(n, axis_sizes),
                   k=_splits_in_blocks(k, axis_sizes))

  @custom_partitioning
  def fp8_dot(*xs):
    return prim.bind(*xs, **params)

  def partition(mesh, arg_shapes, result_shape):
    plan = _Plan.from_shardings(mesh, arg_shapes, result_shape, has_c=has_c, n_rows=n_rows,
                                **in_blocks)
    return mesh, plan.body(prim, params), plan.result_sharding(), plan.arg_shardings()

  def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
    # Used by the (deprecated) GSPMD partitioner only; Shardy uses the rule.
    return _Plan.from_shardings(mesh, arg_shapes, None, has_c=has_c, n_rows=n_rows, quiet=True,
                                **in_blocks).result_sharding()

  def propagate_user_sharding(mesh, user_shape):
    return user_shape.sharding  # Any output sharding is fine (GSPMD only).

  rule, factor_kwargs = _sharding_rule(batch_ndim, has_c, n_rows=n_rows, **in_blocks)
  # The partitioner's shardings are decoded here (_decode), not by
  # custom_partitioning, which fails on sub-axis shardings with an internal error.
  fp8_dot.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                        propagate_user_sharding=propagate_user_sharding,
                        sharding_rule=rule, decode_shardings=False, **factor_kwargs)
  return fp8_dot


def _splits_in_blocks(size: int, axis_sizes) -> bool:
  """Whether a split of `size` over any one mesh axis is in whole 128-blocks.

  (A split over several axes whose product does not divide the blocks, e.g.
  4 blocks over a 2x4 mesh's 8 devices, is then replicated: Shardy shards the
  blocks over part of an axis, which _decode cannot express.)"""
  return size % BLOCK == 0 and all((size // BLOCK) % a == 0 for a in axis_sizes)


def _sharding_rule(batch_ndim, has_c, *, n: bool, k: bool, n_rows: bool = False):
  """Shardy's einsum-like rule. n (k): N (K) is a compound factor (blocks x
  128), so only whole 128-blocks are sharded and the scales go with them; the
  in-block factor needs replication. Otherwise N (K) is one factor that may be
  split anywhere, and the scales' N (K) dimension is replicated: each shard
  takes the scales of the blocks it touches (_Plan.body). (A compound factor
  whose block count does not divide over the axes sharding it would be split
  over part of a mesh axis, which a PartitionSpec cannot say.) n_rows (per-row
  b scales): b_scale's rows are b's rows, one factor n."""
  batch = " ".join(f"b{i}" for i in range(batch_ndim))
  replicate, sizes = [], {}
  if k:
    a_k, s_k = "(kb ki)", "kb"
    replicate.append("ki")
    sizes["ki"] = BLOCK
  else:
    a_k, s_k = "k", "kbs"
    replicate.append("kbs")
  if n_rows:
    b_n, s_n = "n", "n"
  elif n:
    b_n, s_n = "(nb ni)", "nb"
    replicate.append("ni")
    sizes["ni"] = BLOCK
  else:
    b_n, s_n = "n", "nbs"
    replicate.append("nbs")
  out = f"{batch} m {b_n}"
  operands = [f"{batch} m {a_k}", f"{batch} m {s_k}", f"{b_n} {a_k}", f"{s_n} {s_k}"]
  if has_c:
    operands.append(out)
  rule = ", ".join(operands) + " -> " + out
  reduction = ("kb",) if k else ("k",)
  return rule, dict(reduction_factors=reduction, need_replication_factors=tuple(replicate),
                    **sizes)


def _axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry as a tuple of mesh axis names."""
  if entry is None or entry is P.UNCONSTRAINED:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _entry(axes):
  return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def _decode(sharding, mesh):
  """A partitioner's sharding as a NamedSharding on `mesh`, or None where it has
  none: Shardy may shard a dimension over part of a mesh axis (a sub-axis, e.g.
  22 blocks over 2 of an 8-device axis), which no PartitionSpec on the mesh can
  say."""
  if sharding is None or isinstance(sharding, NamedSharding):
    return sharding
  hlo = getattr(sharding, "_hlo_sharding", None)
  if hlo is None:
    return None
  try:
    spec, = sharding_impls.parse_flatten_op_sharding(hlo, mesh)
  except Exception:  # noqa: BLE001 (IndivisibleError, KeyError, ...: not expressible)
    return None
  return NamedSharding(mesh, spec)


def _replicated(sharding) -> bool:
  hlo = getattr(sharding, "_hlo_sharding", None)
  return sharding is None or (hlo is not None and hlo.is_replicated())


def _spec(sharding, ndim) -> list[tuple[str, ...]]:
  if not isinstance(sharding, NamedSharding):
    return [()] * ndim  # Not expressible on the mesh: treat as replicated.
  parts = list(sharding.spec) + [None] * (ndim - len(sharding.spec))
  return [_axes(e) for e in parts[:ndim]]


@dataclasses.dataclass
class AxisClaims:
  """claim(name, axes, size, block): the mesh axes a dimension of `size` keeps:
  unused ones, and only if the split is even (and, with block, whole blocks per
  shard); what it gives up is recorded in `dropped` (for the warning)."""
  sizes: dict
  used: set
  dropped: list

  def __call__(self, name, axes, size, block):
    axes = tuple(ax for ax in axes if ax in self.sizes)
    if any(ax in self.used for ax in axes):
      self.dropped.append(f"{name} over {axes} (the mesh axis already shards another "
                          "dimension)")
      return ()
    shards = math.prod(self.sizes[ax] for ax in axes)
    if shards > 1 and (size % shards or (block and (size // shards) % block)):
      what = f"{size} into {shards}" + (f" (needs a multiple of {block} per shard)"
                                         if block else "")
      self.dropped.append(f"{name} over {axes}: cannot split {what} evenly")
      return ()
    self.used.update(axes)
    return axes


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
  # False: N (K) shards may cut blocks; the scales come replicated along N (K)
  # and each shard aligns itself to the blocks it touches.
  n_in_blocks: bool = True
  k_in_blocks: bool = True
  n: int = 0
  k: int = 0

  @classmethod
  def from_shardings(cls, mesh, arg_shapes, result_shape, *, has_c, quiet=False, n=True,
                     k=True, n_rows=False):
    n_in_blocks, k_in_blocks = n, k
    a, b = arg_shapes[0], arg_shapes[2]
    *batch, m, k = a.shape
    n = b.shape[0]
    sizes = dict(mesh.shape)
    used: set[str] = set()
    dropped = []
    decoded = {name: _decode(x.sharding, mesh) for name, x in (("a", a), ("b", b))}
    for name, x in (("a", a), ("b", b)):
      if decoded[name] is None and not _replicated(x.sharding):
        dropped.append(f"{name} (sharded over part of a mesh axis: its blocks do not divide "
                       "over the axes)")
    a_spec, b_spec = _spec(decoded["a"], a.ndim), _spec(decoded["b"], 2)

    claim = AxisClaims(sizes, used, dropped)

    batch_axes = tuple(claim(f"batch dim {i}", a_spec[i], d, 0) for i, d in enumerate(batch))
    m_axes = claim("M", a_spec[-2], m, 0)
    # Per-row b scales split with b's rows anywhere, like M.
    n_axes = claim("N", b_spec[0], n, BLOCK if n_in_blocks and not n_rows else 0)
    k_axes = claim("K", a_spec[-1] or b_spec[1], k, BLOCK if k_in_blocks else 0)
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
      want = _spec(_decode(result_shape.sharding, mesh), len(out_dims))
      have = (*batch_axes, m_axes, n_axes)
      shards = math.prod(sizes[ax] for ax in k_axes)
      for d, (w, h, size) in enumerate(zip(want, have, out_dims)):
        if w == k_axes and not h and size % shards == 0:
          scatter_dim = d
          break
    return cls(mesh, batch_axes, m_axes, n_axes, k_axes, scatter_dim, has_c, n_in_blocks,
               k_in_blocks, n, k)

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
    # Scales are replicated along a dimension whose shards may cut blocks.
    sn = n if self.n_in_blocks else None
    sk = k if self.k_in_blocks else None
    specs = [P(*batch, m, k), P(*batch, m, sk), P(n, k), P(sn, sk)]
    if self.has_c:
      specs.append(self._out_spec())
    return tuple(NamedSharding(self.mesh, s) for s in specs)

  def body(self, prim, params):
    """The per-shard computation (runs on local shards, in a manual context)."""
    k_axes, scatter_dim = self.k_axes, self.scatter_dim
    align_n = bool(self.n_axes) and not self.n_in_blocks
    align_k = bool(k_axes) and not self.k_in_blocks
    if not (k_axes or align_n):
      return _without_mesh(lambda *xs: prim.bind(*xs, **params))
    beta, out_dtype, has_c = params["beta"], params["out_dtype"], params["has_c"]
    sizes = dict(self.mesh.shape)
    shards = lambda axes: math.prod(sizes[ax] for ax in axes)

    @_without_mesh
    def body(*xs):
      a, a_scale, b, b_scale = xs[:4]
      if align_k:
        (a, b), (a_scale, b_scale), _ = _align_to_blocks(
            [(a, a.ndim - 1), (b, 1)], [(a_scale, a.ndim - 1), (b_scale, 1)],
            size=self.k, shards=shards(k_axes), axes=k_axes)
      if align_n:
        (b,), (b_scale,), n_start = _align_to_blocks(
            [(b, 0)], [(b_scale, 0)], size=self.n, shards=shards(self.n_axes),
            axes=self.n_axes)
      if not k_axes and not has_c:
        out = prim.bind(a, a_scale, b, b_scale, **params)
        return lax.dynamic_slice_in_dim(out, n_start, self.n // shards(self.n_axes), -1)
      acc = prim.bind(a, a_scale, b, b_scale, **dict(params, beta=1.0,
                                                      out_dtype=np.dtype(jnp.float32),
                                                      has_c=False))
      if align_n:
        acc = lax.dynamic_slice_in_dim(acc, n_start, self.n // shards(self.n_axes), -1)
      if scatter_dim is not None:
        acc = lax.psum_scatter(acc, k_axes, scatter_dimension=scatter_dim, tiled=True)
      elif k_axes:
        acc = lax.psum(acc, k_axes)
      if has_c:
        acc = acc + jnp.float32(beta) * xs[4].astype(jnp.float32)
      return acc.astype(out_dtype)
    return body


def _align_to_blocks(operands, scales, *, size, shards, axes):
  """This device's shard of a dimension of `size` split evenly `shards` ways
  over mesh `axes` (which may cut 128-blocks), laid out in whole blocks.

  operands: (array, axis) pairs holding the shard; scales: (array, axis) pairs
  of block scales replicated along that dimension. Returns the operands
  zero-padded in front to start at their first block's boundary (and at the
  back to whole blocks), the scales of those blocks (0 for a block the shard
  does not touch, so no infinite scale meets a zero block sum), and where the
  shard starts inside the padded range.
  """
  local = size // shards
  starts = [i * local for i in range(shards)]
  # Blocks touched by the widest shard: every device pads to the same shape.
  blocks = max(-(-(s + local) // BLOCK) - s // BLOCK for s in starts)
  start = lax.axis_index(axes) * local
  first = start // BLOCK
  if local % BLOCK == 0:  # whole blocks: only the scales to slice
    return [x for x, _ in operands], [lax.dynamic_slice_in_dim(s, first, blocks, axis)
                                      for s, axis in scales], 0
  offset = start - first * BLOCK
  padded = []
  for x, axis in operands:
    shape = list(x.shape)
    shape[axis] = blocks * BLOCK
    padded.append(lax.dynamic_update_slice_in_dim(jnp.zeros(shape, x.dtype), x, offset, axis))
  # Block t of this range is touched if it starts before the shard ends.
  touched = (first + jnp.arange(blocks)) * BLOCK < start + local
  sliced = []
  for s, axis in scales:
    # Room past the last block, so the slice is never clamped (shifted) at the end.
    extra = max(st // BLOCK for st in starts) + blocks - s.shape[axis]
    if extra > 0:
      widths = [(0, 0)] * s.ndim
      widths[axis] = (0, extra)
      s = jnp.pad(s, widths)
    s = lax.dynamic_slice_in_dim(s, first, blocks, axis)
    mask = touched.reshape([blocks if d == axis % s.ndim else 1 for d in range(s.ndim)])
    sliced.append(jnp.where(mask, s, jnp.zeros_like(s)))
  return padded, sliced, offset


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

def out_sharding(a, a_scale, b, b_scale, c, *, op: str = "blockwise_fp8_dot"):
  """Output sharding under Explicit mesh axes, like lax.dot_general's rule
  (`op` names the public function in errors: the fused ops share the rule).

  Batch dims and M come from a, N from b, K is a reduction (the output is
  replicated over K's axes: the op sums over them). a_scale, b_scale and c must
  agree with that, dimension by dimension, where they are sharded at all; a
  replicated dimension is fine (each device slices its part).
  """
  avals = dict(zip(ARG_NAMES, (a, a_scale, b, b_scale, c)))
  avals = {k: v for k, v in avals.items() if v is not None}
  checked = explicit_specs(op, avals)
  if checked is None:
    # No mesh: say so explicitly, else the context mesh (e.g. set_mesh while a
    # per-shard body is traced) would be assumed, as for lax.dot_general.
    if getattr(a, "sharding", None) is None:
      return None
    return NamedSharding(a.sharding.mesh, P(*[None] * a.ndim))
  mesh, specs = checked
  nb = a.ndim - 2
  # Dimensions that must agree, per factor: (argument, dimension), leader first.
  factors = {f"batch dim {i}": [("a", i), ("a_scale", i), ("c", i)] for i in range(nb)}
  factors["M"] = [("a", nb), ("a_scale", nb), ("c", nb)]
  factors["N"] = [("b", 0), ("b_scale", 0), ("c", nb + 1)]
  factors["K"] = [("a", nb + 1), ("b", 1), ("a_scale", nb + 1), ("b_scale", 1)]
  resolved = resolve_factors(op, specs, factors)
  out = [resolved[f"batch dim {i}"] for i in range(nb)] + [resolved["M"], resolved["N"]]
  return NamedSharding(mesh, P(*map(_entry, out)))


def explicit_specs(op: str, avals: dict):
  """(mesh, {name: spec, a tuple of mesh axes per dimension}) of arguments typed with
  Explicit mesh axes, after checking that they share one mesh and that none is
  unreduced or reduced (`op` names the public function in errors); an argument
  without a mesh counts as replicated. None where no argument has a mesh."""
  meshes = {name: v.sharding.mesh for name, v in avals.items()
            if getattr(v, "sharding", None) is not None and not v.sharding.mesh.empty}
  if not meshes:
    return None
  first = next(iter(meshes))
  mesh = meshes[first]
  for name, other in meshes.items():
    if other != mesh:
      raise core.ShardingTypeError(
          f"{op}: all arguments must be on one mesh; {name} is on {other} "
          f"but {first} is on {mesh}")
    spec = avals[name].sharding.spec
    if spec.unreduced or spec.reduced:
      raise core.ShardingTypeError(f"{op}: {name} must not be unreduced/reduced, got {spec}")
  return mesh, {name: (_spec(v.sharding, v.ndim) if name in meshes else [()] * v.ndim)
                for name, v in avals.items()}


def resolve_factors(op: str, specs: dict, factors: dict) -> dict:
  """{factor: its mesh axes}: factors maps each factor (a dimension several
  arguments share) to its (argument, dimension) pairs, leader first; the sharded
  ones must agree, and a mesh axis may shard one factor only (else a
  ShardingTypeError saying which argument to reshard, and how). Arguments not in
  specs are skipped."""
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
            f"{op}: {factor} of {name} is sharded over {here} but {factor} of "
            f"{leader} over {axes}; reshard {name} with jax.sharding.reshard({name}, "
            f"{_suggest(name, specs, dim, axes)})")
    for ax in axes:
      if ax in owner:
        raise core.ShardingTypeError(
            f"{op}: mesh axis {ax!r} shards both {owner[ax][0]} (of "
            f"{owner[ax][1]}) and {factor} (of {leader}); reshard {leader} with "
            "jax.sharding.reshard so that each mesh axis shards one dimension")
      owner[ax] = (factor, leader)
    resolved[factor] = axes
  return resolved


def _suggest(name, specs, dim, axes):
  """The PartitionSpec `name` should have: its own, with `dim` set to `axes`."""
  spec = list(specs[name])
  spec[dim] = axes
  return P(*map(_entry, spec))
