"""The fused gated-MLP input, `blockwise_fp8_glu`, as a JAX primitive.

    out = act(a @ gate.T) * (a @ up.T),  b = [gate; up]  ([2F, K]: gate rows
    [0, F), up rows [F, 2F)), each product the dense op's blockwise contract

computed in one kernel: a CTA holds a gate tile and the same columns' up
tile, so the [M, 2F] intermediate never reaches memory. With
out_dtype=float8_e4m3fn the result is also quantised 1x128 in the epilogue:
(q [..., M, F] e4m3, scale [..., M, ceil(F/128)] f32), the next layer's input.

Sharding (jax_fp8/fused_sharding.py): batch and M split with no communication;
the FP8-output dot's N in whole 128-column groups; K and a GLU's gate/up rows
are gathered. Under Explicit mesh axes the outputs are typed by the same rule.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_fp8 import backends
from jax_fp8 import checks
from jax_fp8 import fused_sharding, sharding
from jax_fp8.pallas import device
from jax_fp8.blocks import BLOCK, FP8, num_blocks

OP = "glu"
ACTIVATIONS = ("silu", "gelu", "relu")
OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32), np.dtype(FP8))


def validate(a, a_scale, b, b_scale, *, activation, out_dtype, backend):
  """Checks every argument; returns (batch, m, f, k). TypeError / ValueError
  naming the argument and the rule."""
  checks.operand_dtypes(a, a_scale, b, b_scale)
  if a.ndim < 2:
    raise ValueError(f"a must be [..., M, K] (at least 2-D), got shape {a.shape}")
  *batch, m, k = a.shape
  if b.ndim != 2 or b.shape[1] != k:
    raise ValueError(f"b must be [2F, K] with a's K={k} (gate rows, then up rows), got shape "
                     f"{b.shape}")
  if b.shape[0] % 2:
    raise ValueError(f"b must hold 2F rows (F gate rows, then F up rows), got {b.shape[0]}")
  f = b.shape[0] // 2
  if f % BLOCK:
    raise ValueError(f"F (half of b's rows) must be a multiple of {BLOCK}, so that gate and up "
                     f"keep their own 128x128 scale blocks; got F={f}")
  want = (*batch, m, num_blocks(k))
  if tuple(a_scale.shape) != want:
    raise ValueError(f"a_scale must have shape a.shape[:-1] + (ceil(K/128),) = {want}, got "
                     f"{tuple(a_scale.shape)}")
  want = (num_blocks(2 * f), num_blocks(k))
  if tuple(b_scale.shape) != want:
    raise ValueError(f"b_scale must have shape (2F/128, ceil(K/128)) = {want}, got "
                     f"{tuple(b_scale.shape)}")
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
  checks.out_dtype(out_dtype, OUT_DTYPES, "bfloat16, float32 or float8_e4m3fn")
  checks.backend(backend)
  return tuple(batch), m, f, k


@dataclasses.dataclass(frozen=True)
class _Fused:
  """One fused-epilogue operation: its primitive, the backends' op and how a
  call's parameters become the 2-D kernel's keywords and its problem."""
  prim: Primitive
  op: str                        # the backend modules' function (jax_fp8.backends)
  columns: Callable              # b's shape -> the output's columns

  def problem(self, params) -> dict:
    if self.op == OP:
      return dict(activation=params["activation"])
    return dict(b_scale_rows=params["b_scale_rows"])

  def keywords(self, params) -> dict:
    keys = (("activation", "out_dtype", "power_of_two_scales") if self.op == OP else
            ("beta", "out_dtype", "power_of_two_scales", "b_scale_rows"))
    return {k: params[k] for k in keys}


def _make_primitive(name):
  prim = Primitive(name)
  prim.multiple_results = True
  prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
  return prim


blockwise_fp8_glu_p = _make_primitive("blockwise_fp8_glu")
blockwise_fp8_dot_fp8_p = _make_primitive("blockwise_fp8_dot_fp8")
_GLU = _Fused(blockwise_fp8_glu_p, OP, lambda b_shape: b_shape[0] // 2)
_DOT = _Fused(blockwise_fp8_dot_fp8_p, "blockwise_fp8_dot", lambda b_shape: b_shape[0])
_FUSED = {blockwise_fp8_glu_p: _GLU, blockwise_fp8_dot_fp8_p: _DOT}


def _out_avals(batch, m, f, out_dtype, out_sharding):
  # Explicit mesh axes: typed by jax_fp8.fused_sharding's rule (q and s alike).
  typed = {} if out_sharding is None else dict(sharding=out_sharding)
  if np.dtype(out_dtype) == np.dtype(FP8):
    return [jax.core.ShapedArray((*batch, m, f), FP8, **typed),
            jax.core.ShapedArray((*batch, m, num_blocks(f)), jnp.float32, **typed)]
  return [jax.core.ShapedArray((*batch, m, f), out_dtype, **typed)]


def _glu_abstract_eval(a, a_scale, b, b_scale, *, activation, out_dtype, power_of_two_scales,
                       backend):
  del power_of_two_scales
  batch, m, f, _ = validate(a, a_scale, b, b_scale, activation=activation, out_dtype=out_dtype,
                            backend=backend)
  return _out_avals(batch, m, f, out_dtype,
                    fused_sharding.out_sharding(a, a_scale, b, b_scale, glu=True))


def _dot_abstract_eval(a, a_scale, b, b_scale, *c, beta, out_dtype, power_of_two_scales,
                       b_scale_rows, backend):
  del beta, power_of_two_scales, b_scale_rows, backend  # checked before binding
  *batch, m, _ = a.shape
  return _out_avals(batch, m, b.shape[0], out_dtype,
                    fused_sharding.out_sharding(a, a_scale, b, b_scale, *c, glu=False))


blockwise_fp8_glu_p.def_abstract_eval(_glu_abstract_eval)
blockwise_fp8_dot_fp8_p.def_abstract_eval(_dot_abstract_eval)


def _folded(fused: _Fused, kernel, params):
  """The 2-D kernel with a's (and c's) leading batch dims folded into M."""
  def impl(a, a_scale, b, b_scale, *c):
    *batch, m, k = a.shape
    rows = int(np.prod(batch, dtype=np.int64)) * m
    args = [a.reshape(rows, k), a_scale.reshape(rows, -1), b, b_scale]
    if fused is _DOT:
      args.append(c[0].reshape(rows, -1) if c else None)
    out = kernel(*args, **fused.keywords(params))
    outs = out if isinstance(out, tuple) else (out,)
    return [x.reshape(*batch, m, x.shape[-1]) for x in outs]
  return impl


def _select(fused: _Fused, platform, a_shape, b_shape, params, has_c):
  *batch, m, k = a_shape
  rows = int(np.prod(batch, dtype=np.int64)) * m
  return backends.select(platform, params["backend"], fused.op, m=rows, n=fused.columns(b_shape),
                         k=k, out_dtype=params["out_dtype"], has_c=has_c,
                         **fused.problem(params))


def _lowering(ctx, *args, prim, platform, **params):
  fused = _FUSED[prim]
  if sharding.wants_partitioning(ctx):
    # Several devices (jax_fp8/fused_sharding.py); each shard lowers back here in
    # a one-device (manual) context, so this does not recurse.
    return fused_sharding.lower(ctx, prim, *args, glu=fused is _GLU, **params)
  _, kernel = _select(fused, platform, ctx.avals_in[0].shape, ctx.avals_in[2].shape, params,
                      has_c=len(args) > 4)
  return sharding.lower_locally(ctx, _folded(fused, kernel, params), *args,
                                multiple_results=True)


def _batching_rule(args, dims, *, prim, **params):
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  front = lambda x, d: jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
  if dims[2] is None and dims[3] is None:
    # Shared weights: the vmapped axis becomes a leading batch dim of a (and c),
    # folded into M: one call.
    new = [x if i in (2, 3) else front(x, d) for i, (x, d) in enumerate(zip(args, dims))]
    outs = prim.bind(*new, **params)
  else:  # a weight per batch element: one call each
    outs = lax.map(lambda xs: tuple(prim.bind(*xs, **params)),
                   tuple(front(x, d) for x, d in zip(args, dims)))
  return list(outs), [0] * len(outs)


for _prim in _FUSED:
  # custom_partitioning needs the device assignment and mesh at lowering time.
  dispatch.prim_requires_devices_during_lowering.add(_prim)
  for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_prim, functools.partial(_lowering, prim=_prim, platform=_platform),
                           platform=_platform)
  batching.primitive_batchers[_prim] = functools.partial(_batching_rule, prim=_prim)


def _call(fused: _Fused, operands, params):
  """Binds the primitive, or in GPU interpret mode calls the kernel directly (its
  io_callbacks' effects cannot go through a primitive's lowering; jit still applies)."""
  a, _, b = operands[:3]
  if params["backend"] in backends.PALLAS and device.interpret_mode_active():
    _, kernel = _select(fused, "cpu", a.shape, b.shape, params, has_c=len(operands) > 4)
    outs = _folded(fused, kernel, params)(*operands)
  else:
    outs = fused.prim.bind(*operands, **params)
  return tuple(outs) if len(outs) == 2 else outs[0]


def blockwise_fp8_dot_fp8(a, a_scale, b, b_scale, c, *, beta, power_of_two_scales, backend,
                          b_scale_rows):
  """blockwise_fp8_dot with out_dtype float8_e4m3fn (arguments checked there):
  (q [..., M, N] e4m3, scale [..., M, ceil(N/128)] f32), quantised 1x128 in the
  epilogue from the float32 result (+ beta * c)."""
  params = dict(beta=float(beta), out_dtype=np.dtype(FP8),
                power_of_two_scales=bool(power_of_two_scales), b_scale_rows=b_scale_rows,
                backend=backend)
  operands = (a, a_scale, b, b_scale) + (() if c is None else (c,))
  return _call(_DOT, operands, params)


def blockwise_fp8_glu(a, a_scale, b, b_scale, *, activation: str = "silu",
                      out_dtype=jnp.bfloat16, power_of_two_scales: bool = False,
                      backend: str = "auto"):
  """The gated-MLP input act(a @ gate.T) * (a @ up.T) in one kernel.

  Args:
    a: float8_e4m3fn [..., M, K]; a_scale: float32 [..., M, ceil(K/128)].
    b: float8_e4m3fn [2F, K]: the gate weight's F rows, then the up weight's F
      rows (F a multiple of 128); b_scale: float32 [2F/128, ceil(K/128)].
    activation: "silu" (SwiGLU), "gelu" (tanh approximation) or "relu".
    out_dtype: bfloat16, float32, or float8_e4m3fn: then the result is
      quantised 1x128 in the epilogue and returned as (q, scale).
    power_of_two_scales: the FP8 output's scales are powers of two.
    backend: "auto", "reference", "pallas_sm90" or "pallas_sm100".

  Returns:
    [..., M, F] out_dtype, or (q [..., M, F] e4m3, scale [..., M, ceil(F/128)] f32).
  """
  a, a_scale, b, b_scale = (jnp.asarray(x) if not hasattr(x, "dtype") else x
                            for x in (a, a_scale, b, b_scale))
  validate(a, a_scale, b, b_scale, activation=activation, out_dtype=out_dtype, backend=backend)
  params = dict(activation=activation, out_dtype=np.dtype(out_dtype),
                power_of_two_scales=bool(power_of_two_scales), backend=backend)
  return _call(_GLU, (a, a_scale, b, b_scale), params)
