"""How the grouped (MoE) GEMMs partition over a device mesh.

Ragged (contiguous) layout, out [M, N] = rows of a [M, K] times their group's b[g]:

    factor   a    a_scale   b      b_scale   group_sizes   out
    M        0    0         -      -         -             0
    N        -    -         1      1 (blks)  -             1
    K        1    1 (blks)  2      2 (blks)  -             -     (reduction)
    G        -    -         0      0         (replicated)  -     (reduction)

- N sharded: each device its columns, no communication.
- K sharded: float32 partial sums, one psum, then the cast (as the dense op).
- M sharded (a's rows): each device its rows, no communication. The groups are
  global (group_sizes is replicated, G int32s), so a device that holds rows
  [r0, r0 + M/d) runs the groups' intersections with its rows.
- G sharded (b's experts: expert parallelism): a is replicated over G's axes and
  each device multiplies the rows of its own experts (the rows are contiguous:
  they are rotated to the front for the call and back) and leaves the others 0;
  one psum over G's axes then assembles the output. It is exact in out_dtype,
  because every row is non-zero on one device only. The cost is that psum of
  [M, N]; expert-parallel code that dispatches the tokens itself calls the op
  under shard_map instead.
- One mesh axis cannot shard two of these; the later claim (in the order G, M,
  N, K) is replicated, with a warning.

Masked layout, out [G, M, N]:

    factor   a    a_scale   b      b_scale   masked_m   out
    G        0    0         0      0         0          0
    M        1    1         -      -         -          1
    N        -    -         1      1 (blks)  -          2
    K        2    2 (blks)  2      2 (blks)  -          -     (reduction)

- G sharded: expert parallelism, each device its experts, no communication.
- M sharded: each device its rows of every group, masked_m[g] moved to the
  shard's rows, no communication. N and K as above.

Everywhere: N and K shard only in whole 128-blocks (scales go with their
blocks), M and G only evenly; a split that is not gets replicated, with a
warning (the result is exact either way). The lowering machinery is the dense
op's (jax_fp8.sharding): custom_partitioning with a Shardy rule and GSPMD
callbacks under a multi-device jit; direct lowering in shard_map bodies, on one
device and for jax.export. `out_sharding` types the output under Explicit axes.
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
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_fp8.blocks import BLOCK
from jax_fp8.reference import ragged_group_bounds
from jax_fp8.sharding import (AxisClaims, _entry, _spec, _without_mesh, explicit_specs,
                              lower_locally, resolve_factors)

RAGGED, MASKED = "ragged_dot", "masked_dot"
PUBLIC = {RAGGED: "blockwise_fp8_ragged_dot", MASKED: "blockwise_fp8_masked_dot"}
ARG_NAMES = {RAGGED: ("a", "a_scale", "b", "b_scale", "group_sizes"),
             MASKED: ("a", "a_scale", "b", "b_scale", "masked_m")}
# Per factor, the (argument, dimension) pairs it spans, the leader first; and the
# factors of the output's dimensions. The others are reductions.
FACTORS = {
    RAGGED: {"M": [("a", 0), ("a_scale", 0)],
             "N": [("b", 1), ("b_scale", 1)],
             "K": [("a", 1), ("b", 2), ("a_scale", 1), ("b_scale", 2)],
             "G": [("b", 0), ("b_scale", 0), ("group_sizes", 0)]},
    MASKED: {"G": [("a", 0), ("a_scale", 0), ("b", 0), ("b_scale", 0), ("masked_m", 0)],
             "M": [("a", 1), ("a_scale", 1)],
             "N": [("b", 1), ("b_scale", 1)],
             "K": [("a", 2), ("b", 2), ("a_scale", 2), ("b_scale", 2)]},
}
OUT_FACTORS = {RAGGED: ("M", "N"), MASKED: ("G", "M", "N")}


# ----------------------------------------------------------------- lowering

def lower(ctx, prim, op, *args, out_dtype, backend, **hints):
  """Lowering rule of a grouped primitive under a multi-device sharding context
  (hints: the primitive's other parameters, e.g. the masked op's expected_m,
  which every shard gets as it is: a tiling hint, capped at a shard's rows)."""
  a_aval, b_aval = ctx.avals_in[0], ctx.avals_in[2]
  fn = _partitioned(prim, op, m=a_aval.shape[-2], n=b_aval.shape[1], k=b_aval.shape[2],
                    out_dtype=np.dtype(out_dtype), backend=backend,
                    hints=tuple(sorted(hints.items())))
  return lower_locally(ctx, fn, *args)


@functools.cache
def _partitioned(prim, op, *, m, n, k, out_dtype, backend, hints=()):
  """The primitive wrapped in custom_partitioning for one static configuration."""
  params = dict(out_dtype=out_dtype, backend=backend, **dict(hints))

  @custom_partitioning
  def grouped_dot(*xs):
    return prim.bind(*xs, **params)

  def partition(mesh, arg_shapes, result_shape):
    plan = _Plan.from_shardings(op, mesh, arg_shapes, result_shape)
    return mesh, plan.body(prim, params), plan.result_sharding(), plan.arg_shardings()

  def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
    # Used by the (deprecated) GSPMD partitioner only; Shardy uses the rule.
    return _Plan.from_shardings(op, mesh, arg_shapes, None, quiet=True).result_sharding()

  def propagate_user_sharding(mesh, user_shape):
    return user_shape.sharding  # Any output sharding is fine (GSPMD only).

  rule, factor_kwargs = _sharding_rule(op, n, k)
  grouped_dot.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                            propagate_user_sharding=propagate_user_sharding,
                            sharding_rule=rule, **factor_kwargs)
  return grouped_dot


def _sharding_rule(op, n, k):
  """Shardy's einsum-like rule. As for the dense op, aligned N/K are compound
  factors (blocks x 128) so that only whole 128-blocks can be sharded, and an
  unaligned N or K is never split."""
  replicate, sizes = [], {}
  if k % BLOCK == 0:
    x_k, s_k = "(kb ki)", "kb"
    replicate.append("ki")
    sizes["ki"] = BLOCK
  else:
    x_k, s_k = "k", "kb"
    replicate += ["k", "kb"]
  if n % BLOCK == 0:
    b_n, s_n = "(nb ni)", "nb"
    replicate.append("ni")
    sizes["ni"] = BLOCK
  else:
    b_n, s_n = "n", "nb"
    replicate += ["n", "nb"]
  reduction = ["kb"] if k % BLOCK == 0 else []
  if op == RAGGED:
    operands = [f"m {x_k}", f"m {s_k}", f"g {b_n} {x_k}", f"g {s_n} {s_k}", "g"]
    out = f"m {b_n}"
    reduction.append("g")
  else:
    operands = [f"g m {x_k}", f"g m {s_k}", f"g {b_n} {x_k}", f"g {s_n} {s_k}", "g"]
    out = f"g m {b_n}"
  rule = ", ".join(operands) + " -> " + out
  return rule, dict(reduction_factors=tuple(reduction), need_replication_factors=tuple(replicate),
                    **sizes)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Which mesh axes shard G, M, N and K inside one partitioned call."""
  op: str
  mesh: Any
  m: int                      # global M (rows of a; per group for the masked layout)
  g_axes: tuple[str, ...]
  m_axes: tuple[str, ...]
  n_axes: tuple[str, ...]
  k_axes: tuple[str, ...]
  scatter_dim: int | None     # Reduce with psum_scatter along this output dim.

  @classmethod
  def from_shardings(cls, op, mesh, arg_shapes, result_shape, *, quiet=False):
    a, b = arg_shapes[0], arg_shapes[2]
    g, n, k = b.shape
    m = a.shape[-2]
    a_spec, b_spec = _spec(a.sharding, a.ndim), _spec(b.sharding, 3)
    sizes = dict(mesh.shape)
    used: set[str] = set()
    dropped = []

    claim = AxisClaims(sizes, used, dropped)

    if op == RAGGED:
      g_axes = claim("G", b_spec[0], g, 0)
      m_axes = claim("M", a_spec[0], m, 0)
    else:
      g_axes = claim("G", a_spec[0] or b_spec[0], g, 0)
      m_axes = claim("M", a_spec[1], m, 0)
    n_axes = claim("N", b_spec[1], n, BLOCK)
    k_axes = claim("K", a_spec[-1] or b_spec[2], k, BLOCK)
    if dropped and not quiet:
      warnings.warn(f"{PUBLIC[op]}: replicating instead of sharding " + "; ".join(dropped)
                    + ". The result is exact but pays for the replication; shard N and K in "
                    "whole 128-blocks (per-shard size a multiple of 128) and G and M evenly, "
                    "each over its own mesh axes.", stacklevel=2)

    # When the caller wants the output split over exactly the reduced axes,
    # reduce with psum_scatter along that dimension instead of psum + slice.
    scatter_dim = None
    reduced = _reduced_axes(op, g_axes, k_axes)
    if reduced and result_shape is not None:
      out_dims = (m, n) if op == RAGGED else (g, m, n)
      have = (m_axes, n_axes) if op == RAGGED else (g_axes, m_axes, n_axes)
      want = _spec(result_shape.sharding, len(out_dims))
      shards = math.prod(sizes[ax] for ax in reduced)
      for d, (w, h, size) in enumerate(zip(want, have, out_dims)):
        if w == reduced and not h and size % shards == 0:
          scatter_dim = d
          break
    return cls(op, mesh, m, g_axes, m_axes, n_axes, k_axes, scatter_dim)

  def _out_spec(self):
    dims = ([self.m_axes, self.n_axes] if self.op == RAGGED
            else [self.g_axes, self.m_axes, self.n_axes])
    if self.scatter_dim is not None:
      dims[self.scatter_dim] = _reduced_axes(self.op, self.g_axes, self.k_axes)
    return P(*map(_entry, dims))

  def result_sharding(self):
    return NamedSharding(self.mesh, self._out_spec())

  def arg_shardings(self):
    g, m, n, k = map(_entry, (self.g_axes, self.m_axes, self.n_axes, self.k_axes))
    if self.op == RAGGED:
      # The groups are global: every device reads all G sizes.
      specs = [P(m, k), P(m, k), P(g, n, k), P(g, n, k), P()]
    else:
      specs = [P(g, m, k), P(g, m, k), P(g, n, k), P(g, n, k), P(g)]
    return tuple(NamedSharding(self.mesh, s) for s in specs)

  def body(self, prim, params):
    """The per-shard computation (runs on local shards, in a manual context)."""
    op, m_axes, g_axes, k_axes = self.op, self.m_axes, self.g_axes, self.k_axes
    out_dtype, scatter_dim, m_global = params["out_dtype"], self.scatter_dim, self.m
    reduced = _reduced_axes(op, g_axes, k_axes)
    # Partial sums over K must be added in float32 before the cast; the G
    # reduction alone adds exact zeros, so it may run in out_dtype.
    local_dtype = np.dtype(jnp.float32) if k_axes else out_dtype

    @_without_mesh
    def body(a, a_scale, b, b_scale, sizes):
      m_local = a.shape[-2]
      row0 = lax.axis_index(m_axes) * m_local if m_axes else 0
      shift = None
      if op == RAGGED:
        sizes, shift = _local_groups(sizes, m_global, row0, m_local, b.shape[0],
                                     g_axes if g_axes else None)
        if shift is not None:  # Rotate this device's rows to the front.
          a, a_scale = jnp.roll(a, -shift, axis=0), jnp.roll(a_scale, -shift, axis=0)
      elif m_axes:
        sizes = jnp.clip(sizes - row0, 0, m_local)
      out = prim.bind(a, a_scale, b, b_scale, sizes, **{**params, "out_dtype": local_dtype})
      if shift is not None:
        out = jnp.roll(out, shift, axis=0)
      if not reduced:
        return out
      if scatter_dim is None:
        out = lax.psum(out, reduced)
      else:
        out = lax.psum_scatter(out, reduced, scatter_dimension=scatter_dim, tiled=True)
      return out.astype(out_dtype)
    return body


def _reduced_axes(op, g_axes, k_axes):
  """The mesh axes the op sums over: K's, and for the ragged layout G's."""
  return (*g_axes, *k_axes) if op == RAGGED else tuple(k_axes)


def _local_groups(group_sizes, m_global, row0, m_local, g_local, g_axes):
  """The groups of one shard of the ragged layout: its rows [row0, row0 + m_local)
  and, when G is sharded, its experts. Returns (sizes [g_local], shift): the local
  groups start `shift` rows into the shard (None when G is not sharded: then the
  first local group starts at the shard's first row or before)."""
  starts, ends = ragged_group_bounds(group_sizes, m_global)
  if g_axes is not None:
    g0 = lax.axis_index(g_axes) * g_local
    starts = lax.dynamic_slice_in_dim(starts, g0, g_local)
    ends = lax.dynamic_slice_in_dim(ends, g0, g_local)
  lo = jnp.clip(starts - row0, 0, m_local)
  hi = jnp.clip(ends - row0, 0, m_local)
  return hi - lo, (None if g_axes is None else lo[0])


# ------------------------------------------------------- Explicit axes (typing)

def out_sharding(op, avals):
  """Output sharding under Explicit mesh axes, like lax.dot_general's rule.

  Each factor (G, M, N, K) takes its sharding from the arguments that have it,
  which must agree dimension by dimension where they are sharded at all (a
  replicated dimension is fine: each device slices its part). The output is
  sharded over its own factors' axes and replicated over the reductions' (K,
  and G for the ragged layout). None where no argument carries a sharding.
  """
  public = PUBLIC[op]
  avals = dict(zip(ARG_NAMES[op], avals))
  checked = explicit_specs(public, avals)
  if checked is None:
    # No mesh: say so explicitly, else the context mesh (e.g. set_mesh while a
    # per-shard body is traced) would be assumed, as for lax.dot_general.
    a = avals["a"]
    if getattr(a, "sharding", None) is None:
      return None
    return NamedSharding(a.sharding.mesh, P(*[None] * len(OUT_FACTORS[op])))
  mesh, specs = checked
  resolved = resolve_factors(public, specs, FACTORS[op])
  return NamedSharding(mesh, P(*(_entry(resolved[f]) for f in OUT_FACTORS[op])))
