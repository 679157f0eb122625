"""The fused gated-MLP input, `blockwise_fp8_glu`, as a JAX primitive.

    out = act(a @ gate.T) * (a @ up.T),  b = [gate; up]  ([2F, K]: gate rows
    [0, F), up rows [F, 2F)), each product the dense op's blockwise contract

computed in one kernel: a CTA holds a gate tile and the same columns' up
tile, so the [M, 2F] intermediate never reaches memory. With
out_dtype=float8_e4m3fn the result is also quantised 1x128 in the epilogue:
(q [..., M, F] e4m3, scale [..., M, ceil(F/128)] f32), the next layer's input.

Sharding: no partitioning rule of its own; under a multi-device jit XLA
gathers its operands (the result is right, each device computes all of it).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_fp8 import backends
from jax_fp8.pallas import device
from jax_fp8.quantize import BLOCK, FP8, num_blocks

OP = "glu"
ACTIVATIONS = ("silu", "gelu", "relu")
OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32), np.dtype(FP8))


def validate(a, a_scale, b, b_scale, *, activation, out_dtype, backend):
  """Checks every argument; returns (batch, m, f, k). TypeError / ValueError
  naming the argument and the rule."""
  for name, x, dt in (("a", a, FP8), ("b", b, FP8), ("a_scale", a_scale, jnp.float32),
                      ("b_scale", b_scale, jnp.float32)):
    if np.dtype(x.dtype) != np.dtype(dt):
      raise TypeError(f"{name} must be {np.dtype(dt).name}, got {x.dtype}")
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
  try:
    dt = np.dtype(out_dtype)
  except TypeError:
    dt = None
  if dt not in OUT_DTYPES:
    raise TypeError(f"out_dtype must be bfloat16, float32 or float8_e4m3fn, got {out_dtype}")
  if backend not in backends.NAMES:
    raise ValueError(f"backend must be one of {backends.NAMES}, got {backend!r}")
  return tuple(batch), m, f, k


blockwise_fp8_glu_p = Primitive("blockwise_fp8_glu")
blockwise_fp8_glu_p.multiple_results = True
blockwise_fp8_glu_p.def_impl(functools.partial(dispatch.apply_primitive, blockwise_fp8_glu_p))


def _out_avals(batch, m, f, out_dtype):
  if np.dtype(out_dtype) == np.dtype(FP8):
    return [jax.core.ShapedArray((*batch, m, f), FP8),
            jax.core.ShapedArray((*batch, m, num_blocks(f)), jnp.float32)]
  return [jax.core.ShapedArray((*batch, m, f), out_dtype)]


def _abstract_eval(a, a_scale, b, b_scale, *, activation, out_dtype, power_of_two_scales,
                   backend):
  del power_of_two_scales
  batch, m, f, _ = validate(a, a_scale, b, b_scale, activation=activation, out_dtype=out_dtype,
                            backend=backend)
  return _out_avals(batch, m, f, out_dtype)


blockwise_fp8_glu_p.def_abstract_eval(_abstract_eval)


def _folded(kernel, *, activation, out_dtype, power_of_two_scales):
  """A 2-D implementation with a's leading batch dims folded into M."""
  def impl(a, a_scale, b, b_scale):
    *batch, m, k = a.shape
    rows = int(np.prod(batch, dtype=np.int64)) * m
    out = kernel(a.reshape(rows, k), a_scale.reshape(rows, -1), b, b_scale,
                 activation=activation, out_dtype=out_dtype,
                 power_of_two_scales=power_of_two_scales)
    outs = out if isinstance(out, tuple) else (out,)
    return [x.reshape(*batch, m, x.shape[-1]) for x in outs]
  return impl


def _select(platform, backend, a_shape, b_shape, out_dtype, activation):
  *batch, m, k = a_shape
  rows = int(np.prod(batch, dtype=np.int64)) * m
  return backends.select(platform, backend, OP, m=rows, n=b_shape[0] // 2, k=k,
                         out_dtype=out_dtype, has_c=False, activation=activation)


def _lowering(ctx, *args, activation, out_dtype, power_of_two_scales, backend, platform):
  _, kernel = _select(platform, backend, ctx.avals_in[0].shape, ctx.avals_in[2].shape,
                      out_dtype, activation)
  impl = _folded(kernel, activation=activation, out_dtype=out_dtype,
                 power_of_two_scales=power_of_two_scales)
  return mlir.lower_fun(impl, multiple_results=True)(ctx, *args)


for _platform in ("cpu", "cuda"):
  mlir.register_lowering(blockwise_fp8_glu_p, functools.partial(_lowering, platform=_platform),
                         platform=_platform)


def _batching_rule(args, dims, **params):
  if dims[2] is None and dims[3] is None:
    # Shared weights: the vmapped axis becomes a leading batch dim of a (folded into M).
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    a, a_scale = (jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
                  for x, d in zip(args[:2], dims[:2]))
    outs = blockwise_fp8_glu_p.bind(a, a_scale, args[2], args[3], **params)
    return outs, [0] * len(outs)
  # A weight per batch element: one call each.
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
  xs = [jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
        for x, d in zip(args, dims)]
  outs = lax.map(lambda x: tuple(blockwise_fp8_glu_p.bind(*x, **params)), tuple(xs))
  return list(outs), [0] * len(outs)


batching.primitive_batchers[blockwise_fp8_glu_p] = _batching_rule


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
  if backend in backends.PALLAS and device.interpret_mode_active():
    # GPU interpret mode: call the kernel directly (its io_callbacks' effects
    # cannot go through a primitive's lowering); jit still applies.
    _, kernel = _select("cpu", backend, a.shape, b.shape, params["out_dtype"], activation)
    outs = _folded(kernel, activation=activation, out_dtype=params["out_dtype"],
                   power_of_two_scales=params["power_of_two_scales"])(a, a_scale, b, b_scale)
  else:
    outs = blockwise_fp8_glu_p.bind(a, a_scale, b, b_scale, **params)
  return tuple(outs) if len(outs) == 2 else outs[0]
