"""How the fused-epilogue ops partition over a device mesh (Auto and Explicit axes).

    factor   a      a_scale   b         b_scale    c / q      out scale
    batch    [..]   [..]      -         -          [..]       [..]
    M        -2     -2        -         -          -2         -2
    N        -      -         0         0          -1         -1 (groups)
    K        -1     -1        1         1          -          -

- `blockwise_fp8_dot(..., out_dtype=float8_e4m3fn)`: batch and M split evenly
  anywhere, with no communication; N only in whole 128-column groups per shard
  (an output scale covers 128 columns: q and its scales go with them; with
  per-row b scales, b_scale's rows go with b's); K is not split: the
  quantisation needs the whole sum, so a K-sharded operand is gathered.
- `blockwise_fp8_glu`: batch and M split evenly; b = [gate; up] is not split
  (a split of its 2F rows would give one device gate rows, another their up
  rows), nor K: the weights are gathered where they come sharded.
  (F over devices: lay b out per shard, [gate_0; up_0; gate_1; up_1; ...],
  and call the op in shard_map on local shards: README, Fused epilogues.)
- What cannot be split so is replicated, with the dense op's warning where it
  would warn (an uneven split, a mesh axis wanted twice, a sub-axis); an even
  split of N that cuts 128-groups, and a sharded K or 2F, are replicated
  silently: the rule says they cannot be split, the result stays exact.

Like the dense op (jax_fp8/sharding.py), the primitive is wrapped in
custom_partitioning with a Shardy rule only under a multi-device jit with a
mesh (not for jax.export); each shard binds the primitive again, lowered
directly. Under Explicit mesh axes `out_sharding` types the outputs by the same
rule (the dense op's type, less what the rule cannot split), so the partitioner
and the type agree and nothing is resharded after the call.
"""
from __future__ import annotations

import functools
import math
import warnings

from jax._src import core
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_fp8 import sharding
from jax_fp8.blocks import BLOCK


def lower(ctx, prim, *args, glu: bool, **params):
  """Lowering of a fused primitive under a multi-device sharding context."""
  a_aval, b_aval = ctx.avals_in[0], ctx.avals_in[2]
  axis_sizes = tuple(sharding._mesh_of(ctx.module_context.axis_context).shape.values())
  n = b_aval.shape[0]
  n_in_blocks = not glu and sharding._splits_in_blocks(n, axis_sizes)
  fn = _partitioned(prim, tuple(sorted(params.items())), batch_ndim=a_aval.ndim - 2,
                    has_c=len(args) > 4, n_in_blocks=n_in_blocks, glu=glu,
                    per_row_b=params.get("b_scale_rows") == 1)
  return sharding.lower_locally(ctx, fn, *args, multiple_results=True)


@functools.cache
def _partitioned(prim, params, *, batch_ndim, has_c, n_in_blocks, glu, per_row_b):
  params = dict(params)

  @custom_partitioning
  def fused(*xs):
    return tuple(prim.bind(*xs, **params))

  def partition(mesh, arg_shapes, result_shape):
    batch, m, n = _plan(mesh, arg_shapes, n_in_blocks=n_in_blocks)
    body = sharding._without_mesh(lambda *xs: tuple(prim.bind(*xs, **params)))
    return mesh, body, _results(mesh, batch, m, n, result_shape), _args(mesh, batch, m, n,
                                                                        has_c)

  def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
    # The (deprecated) GSPMD partitioner only; Shardy uses the rule.
    batch, m, n = _plan(mesh, arg_shapes, n_in_blocks=n_in_blocks, quiet=True)
    return _results(mesh, batch, m, n, result_shape)

  def propagate_user_sharding(mesh, user_shape):
    return tuple(s.sharding for s in user_shape)  # GSPMD only: the users' shardings.

  rule, factor_kwargs = _sharding_rule(batch_ndim, has_c, n_in_blocks=n_in_blocks,
                                       per_row_b=per_row_b, glu=glu,
                                       fp8_out=params["out_dtype"].itemsize == 1)
  fused.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                      propagate_user_sharding=propagate_user_sharding, sharding_rule=rule,
                      decode_shardings=False, **factor_kwargs)
  return fused


def _sharding_rule(batch_ndim, has_c, *, n_in_blocks, per_row_b, glu, fp8_out):
  """Shardy's rule: batch and M free; N a compound factor (groups x 128) where
  whole groups split over the mesh, else replicated; K (and a GLU's 2F rows,
  and its F output columns: another size) replicated."""
  batch = " ".join(f"b{i}" for i in range(batch_ndim))
  replicate, sizes = ["k", "kbs"], {}
  if glu:
    b_n, s_n, out_n, out_s = "n2", "n2b", "f", "fb"
    replicate += ["n2", "n2b", "f", "fb"]
  elif n_in_blocks:
    b_n, out_n, out_s = "(nb ni)", "(nb ni)", "nb"
    s_n = b_n if per_row_b else "nb"
    replicate.append("ni")
    sizes["ni"] = BLOCK
  else:
    b_n = out_n = "n"
    s_n = "n" if per_row_b else "nbs"
    out_s = "nbo"
    replicate += ["n", "nbo"] + ([] if per_row_b else ["nbs"])
  operands = [f"{batch} m k", f"{batch} m kbs", f"{b_n} k", f"{s_n} kbs"]
  if has_c:
    operands.append(f"{batch} m {out_n}")
  outs = [f"{batch} m {out_n}"] + ([f"{batch} m {out_s}"] if fp8_out else [])
  rule = ", ".join(operands) + " -> " + ", ".join(outs)
  order = list(dict.fromkeys(rule.replace("(", " ").replace(")", " ").replace(",", " ")
                             .replace("->", " ").split()))
  # Shardy wants them in the order the factors first appear in the rule.
  replicate = sorted({f for f in replicate if f in order}, key=order.index)
  return rule, dict(need_replication_factors=tuple(replicate), **sizes)


def _plan(mesh, arg_shapes, *, n_in_blocks, quiet=False):
  """The mesh axes of the batch dims, M and N inside one partitioned call."""
  a, b = arg_shapes[0], arg_shapes[2]
  *batch, m, _ = a.shape
  dropped = []
  decoded = {name: sharding._decode(x.sharding, mesh) for name, x in (("a", a), ("b", b))}
  for name, x in (("a", a), ("b", b)):
    if decoded[name] is None and not sharding._replicated(x.sharding):
      dropped.append(f"{name} (sharded over part of a mesh axis)")
  a_spec, b_spec = sharding._spec(decoded["a"], a.ndim), sharding._spec(decoded["b"], 2)
  claim = sharding.AxisClaims(dict(mesh.shape), set(), dropped)
  batch_axes = tuple(claim(f"batch dim {i}", a_spec[i], d, 0) for i, d in enumerate(batch))
  m_axes = claim("M", a_spec[-2], m, 0)
  n_axes = claim("N", b_spec[0], b.shape[0], BLOCK) if n_in_blocks else ()
  if dropped and not quiet:
    warnings.warn("blockwise_fp8 fused op: replicating instead of sharding " + "; ".join(dropped)
                  + ". The result is exact but pays for the replication; shard batch/M evenly "
                  "and N in whole 128-column groups.", stacklevel=2)
  return batch_axes, m_axes, n_axes


def _results(mesh, batch, m, n, result_shape):
  spec = P(*map(sharding._entry, batch), sharding._entry(m), sharding._entry(n))
  count = len(result_shape) if isinstance(result_shape, (tuple, list)) else 1
  return tuple(NamedSharding(mesh, spec) for _ in range(count))


def _args(mesh, batch, m, n, has_c):
  """b_scale's rows go with b's: per row, or its 128-blocks whole on every shard."""
  rows = tuple(map(sharding._entry, batch)) + (sharding._entry(m),)
  n_entry = sharding._entry(n)
  specs = [P(*rows, None), P(*rows, None), P(n_entry, None), P(n_entry, None)]
  if has_c:
    specs.append(P(*rows, n_entry))
  return tuple(NamedSharding(mesh, s) for s in specs)


# ------------------------------------------------------- Explicit axes (typing)

def out_sharding(a, a_scale, b, b_scale, c=None, *, glu: bool):
  """Both outputs' sharding under Explicit mesh axes (q and its scales alike):
  the dense op's (batch/M from a, N from b or c, K a reduction, conflicting
  arguments a ShardingTypeError naming the one to reshard), with the output's
  columns replicated where the rule cannot split them: always for the GLU (b's
  rows are gate then up, so their sharding says nothing about F), and for the
  FP8-output dot unless every shard holds whole 128-column groups. None where
  no argument carries a mesh."""
  op = "blockwise_fp8_glu" if glu else "blockwise_fp8_dot"
  if glu:
    b, b_scale = _rows_unsharded(b), _rows_unsharded(b_scale)
  out = sharding.out_sharding(a, a_scale, b, b_scale, c, op=op)
  if out is None or out.mesh.empty:
    return out
  spec = sharding._spec(out, a.ndim)
  sizes = dict(out.mesh.shape)
  n, shards = b.shape[0], math.prod(sizes[ax] for ax in spec[-1])
  whole_groups = (sharding._splits_in_blocks(n, tuple(sizes.values()))
                  and n % (shards * BLOCK) == 0)
  if glu or not whole_groups:
    spec[-1] = ()
  return out.update(spec=P(*map(sharding._entry, spec)))


def _rows_unsharded(x):
  """x's type with its first dimension replicated (the GLU's b and b_scale)."""
  s = getattr(x, "sharding", None)
  if s is None or s.mesh.empty:
    return x
  spec = list(s.spec) + [None] * (x.ndim - len(s.spec))
  return core.ShapedArray(x.shape, x.dtype, sharding=s.update(spec=P(None, *spec[1:])))
