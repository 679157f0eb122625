"""`blockwise_fp8_dot` as a JAX primitive: validation, abstract evaluation,
per-platform lowering through `jax_fp8.backends`, batching and differentiation.

Differentiation: the op is linear in `c` (and in `beta` where beta is an
array), and that is all it differentiates: a gradient through the FP8 operands
or their scales raises, pointing to `jax_fp8.dense`, which quantises in its
forward pass and runs the FP8 backward GEMMs itself.
"""
from __future__ import annotations

import functools
import math
import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jax_fp8 import backends
from jax_fp8 import checks
from jax_fp8 import fused
from jax_fp8 import sharding
from jax_fp8.pallas import device
from jax_fp8.blocks import FP8, num_blocks

OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
# b's scale granularity: 128x128 blocks (weights), or 1x128 groups per row of b
# ("1D1D", for the weight gradient, where b is the transposed output gradient).
B_SCALE_BLOCKS = ((128, 128), (1, 128))


def _shape(x):
  return tuple(x.shape)


def _is_fp8(out_dtype) -> bool:
  try:
    return np.dtype(out_dtype) == np.dtype(FP8)
  except TypeError:
    return False


def is_static_beta(beta) -> bool:
  """A Python/NumPy real number (fused into the kernel); anything else is an array."""
  return isinstance(beta, numbers.Real)


def canonical_b_scale_block(b_scale_block) -> tuple[int, int]:
  """b_scale_block as a tuple of ints, or a ValueError naming the choices."""
  ok = (isinstance(b_scale_block, (tuple, list)) and len(b_scale_block) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                for v in b_scale_block))
  block = tuple(int(v) for v in b_scale_block) if ok else None
  if block not in B_SCALE_BLOCKS:
    raise ValueError(f"b_scale_block must be (128, 128) (one scale per 128x128 block of b) or "
                     f"(1, 128) (one scale per row of b per 128-wide K group), got "
                     f"{b_scale_block!r}")
  return block


def validate(a, a_scale, b, b_scale, c, *, beta, out_dtype, backend,
             b_scale_block=(128, 128)):
  """Checks every argument against the contract; returns (batch, m, n, k).

  Works on arrays and abstract values alike. Raises TypeError (dtypes, kinds)
  or ValueError (shapes, values) whose message names the argument and the rule.
  beta is a Python real number (static) or a scalar array (traced).
  """
  for name, x in (("a", a), ("a_scale", a_scale), ("b", b), ("b_scale", b_scale)):
    if not hasattr(x, "dtype"):
      raise TypeError(f"{name} must be an array, got {type(x).__name__}")
  checks.operand_dtypes(a, a_scale, b, b_scale)
  if len(_shape(a)) < 2:
    raise ValueError(f"a must be [..., M, K] (at least 2-D), got shape {_shape(a)}")
  if len(_shape(b)) != 2:
    raise ValueError(f"b must be 2-D [N, K], got shape {_shape(b)}")
  *batch, m, k = _shape(a)
  n, kb_ = _shape(b)
  if not all(isinstance(d, (int, np.integer)) for d in (n, kb_, k)):
    raise ValueError(f"N and K must be static (only M and the batch dims of a may be symbolic "
                     f"under jax.export), got a of shape {_shape(a)} and b of shape {_shape(b)}")
  if kb_ != k:
    raise ValueError(f"K mismatch: a is {_shape(a)} (K={k}) but b is {_shape(b)} (K={kb_}); "
                     "b must be [N, K] with the same K as a")
  if k < 1:
    raise ValueError(f"K must be >= 1, got a of shape {_shape(a)}")
  want = (*batch, m, num_blocks(k))
  if _shape(a_scale) != want:
    raise ValueError(f"a_scale must have shape a.shape[:-1] + (ceil(K/128),) = {want} "
                     f"(one scale per row per 128-wide K group), got {_shape(a_scale)}")
  if canonical_b_scale_block(b_scale_block) == (1, 128):
    want = (n, num_blocks(k))
    if _shape(b_scale) != want:
      raise ValueError(f"b_scale must have shape (N, ceil(K/128)) = {want} for "
                       f"b_scale_block=(1, 128) (one scale per row of b per 128-wide K group), "
                       f"got {_shape(b_scale)}")
  else:
    want = (num_blocks(n), num_blocks(k))
    if _shape(b_scale) != want:
      raise ValueError(f"b_scale must have shape (ceil(N/128), ceil(K/128)) = {want} "
                       f"(one scale per 128x128 block of b), got {_shape(b_scale)}")
  if c is not None:
    if not hasattr(c, "dtype"):
      raise TypeError(f"c must be an array or None, got {type(c).__name__}")
    if not jnp.issubdtype(c.dtype, jnp.floating):
      raise TypeError(f"c must be a floating-point array, got {c.dtype}")
    if _shape(c) != (*batch, m, n):
      raise ValueError(f"c must have the output's shape [..., M, N] = {(*batch, m, n)}, "
                       f"got {_shape(c)}")
  if isinstance(beta, bool) or not (is_static_beta(beta) or hasattr(beta, "dtype")):
    raise TypeError(f"beta must be a real number (static) or a scalar JAX array (traced), "
                    f"got {type(beta).__name__}")
  if is_static_beta(beta):
    if not np.isfinite(beta):
      raise ValueError(f"beta must be finite, got {beta}")
    if abs(beta) > float(np.finfo(np.float32).max):
      raise ValueError(f"beta must be finite in float32 (|beta| <= "
                       f"{np.finfo(np.float32).max:.8g}), the precision c is scaled in; got {beta}")
    if c is None and beta != 1.0:
      raise ValueError(f"beta={beta} was given but c is None; beta scales the residual c")
  else:
    if _shape(beta) != ():
      raise ValueError(f"beta must be a scalar, got an array of shape {_shape(beta)}")
    if not (jnp.issubdtype(beta.dtype, jnp.floating) or jnp.issubdtype(beta.dtype, jnp.integer)):
      raise TypeError(f"beta must be a real (floating or integer) scalar, got dtype {beta.dtype}")
    if c is None:
      raise ValueError("beta was given as an array but c is None; beta scales the residual c")
  checks.out_dtype(out_dtype, OUT_DTYPES, "bfloat16, float32 or float8_e4m3fn")
  checks.backend(backend)
  return tuple(batch), m, n, k


blockwise_fp8_dot_p = Primitive("blockwise_fp8_dot")
blockwise_fp8_dot_p.def_impl(functools.partial(dispatch.apply_primitive, blockwise_fp8_dot_p))
# A multi-device lowering partitions through custom_partitioning, which needs
# the device assignment and mesh at lowering time (jax_fp8.sharding).
dispatch.prim_requires_devices_during_lowering.add(blockwise_fp8_dot_p)

# The primitive's parameters: beta (static float), out_dtype (np.dtype),
# backend (str), has_c (bool), b_scale_block ((128, 128) or (1, 128)).


def _split(args, has_c):
  a, a_scale, b, b_scale = args[:4]
  return a, a_scale, b, b_scale, (args[4] if has_c else None)


def _abstract_eval(*args, beta, out_dtype, backend, has_c, b_scale_block):
  a, a_scale, b, b_scale, c = _split(args, has_c)
  batch, m, n, _ = validate(a, a_scale, b, b_scale, c, beta=beta, out_dtype=out_dtype,
                            backend=backend, b_scale_block=b_scale_block)
  # Explicit mesh axes: the output is sharded like a matmul's (jax_fp8.sharding).
  out_sharding = sharding.out_sharding(a, a_scale, b, b_scale, c)
  if out_sharding is None:
    return jax.core.ShapedArray((*batch, m, n), out_dtype)
  return jax.core.ShapedArray((*batch, m, n), out_dtype, sharding=out_sharding)


blockwise_fp8_dot_p.def_abstract_eval(_abstract_eval)


def _kernel_keywords(b_scale_block) -> dict:
  """The problem keywords backends receive beyond m, n, k, out_dtype, has_c."""
  return dict(b_scale_rows=b_scale_block[0])


def _folded(kernel, *, beta, out_dtype, b_scale_rows=128):
  """Wraps a 2-D implementation: leading batch dims of a (and c) fold into M.

  b_scale_rows is passed to the kernel only where it is not the default 128,
  so that a kernel module written before per-row b scales still runs the
  default (backends.select refuses it for b_scale_rows=1).
  """
  extra = {} if b_scale_rows == 128 else dict(b_scale_rows=b_scale_rows)

  def impl(a, a_scale, b, b_scale, c=None):
    *batch, m, k = a.shape
    n = b.shape[0]
    rows = math.prod(batch) * m  # may be symbolic (jax.export)
    out = kernel(a.reshape(rows, k), a_scale.reshape(rows, a_scale.shape[-1]), b, b_scale,
                 None if c is None else c.reshape(rows, n), beta=beta, out_dtype=out_dtype,
                 **extra)
    return out.reshape(*batch, m, n)
  return impl


def _lowering(ctx, *args, beta, out_dtype, backend, has_c, b_scale_block, platform):
  if sharding.wants_partitioning(ctx):
    # Several devices: partition like a matmul; each shard lowers back here
    # in a one-device (manual) context, so this does not recurse.
    return sharding.lower(ctx, blockwise_fp8_dot_p, *args, beta=beta, out_dtype=out_dtype,
                          backend=backend, has_c=has_c, b_scale_block=b_scale_block)
  a_aval, b_aval = ctx.avals_in[0], ctx.avals_in[2]
  *batch, m, k = a_aval.shape
  rows = math.prod(batch) * m  # may be symbolic (jax.export)
  keywords = _kernel_keywords(b_scale_block)
  name, kernel = backends.select(platform, backend, m=rows, n=b_aval.shape[0], k=k,
                                 out_dtype=out_dtype, has_c=has_c, **keywords)
  _warn_about_export_choice(ctx, platform, backend, name, rows)
  impl = _folded(kernel, beta=beta, out_dtype=out_dtype, **keywords)
  return sharding.lower_locally(ctx, impl, *args)


def _warn_about_export_choice(ctx, platform, backend, chosen, rows):
  """backend="auto" lowered for CUDA on a machine without a GPU picks a kernel by an
  assumed compute capability, and a symbolic M falls back to the reference: both are
  fixed into exported code, so say so."""
  if backend != "auto" or platform != "cuda":
    return
  if not backends.is_static(rows) and chosen == "reference":
    warnings.warn(
        f"blockwise_fp8_dot: M = {rows} is symbolic, and the GPU kernels need static shapes: "
        "the exported code runs the reference (jnp) path on the GPU. Export with a static M "
        "(one export per size) for the Pallas kernels.", stacklevel=2)
  elif device.compute_capability() is None and ctx.module_context.lowering_parameters.for_export:
    cc = device.target_compute_capability()
    warnings.warn(
        f"blockwise_fp8_dot: lowering for CUDA without a GPU here; backend='auto' assumed "
        f"compute capability {cc[0]}.{cc[1]} and embeds the {chosen!r} kernel, which runs only "
        "on GPUs of that generation. Pass backend= explicitly to choose (backend='reference' "
        "runs on any GPU).", stacklevel=2)


for _platform in ("cpu", "cuda"):
  mlir.register_lowering(blockwise_fp8_dot_p,
                         functools.partial(_lowering, platform=_platform),
                         platform=_platform)


def _batching_rule(args, dims, **params):
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)

  def to_front(x, d):
    if d is None:
      return jnp.broadcast_to(x, (size, *x.shape))
    return jnp.moveaxis(x, d, 0)

  if dims[2] is None and dims[3] is None:
    # Shared weights: the vmapped axis becomes a leading batch dim of a, which
    # the kernels fold into M. One launch.
    new = [to_front(x, d) if i in (0, 1, 4) else x for i, (x, d) in enumerate(zip(args, dims))]
    return blockwise_fp8_dot_p.bind(*new, **params), 0
  # A different b per batch element: one dot per element.
  new = [to_front(x, d) for x, d in zip(args, dims)]
  return lax.map(lambda xs: blockwise_fp8_dot_p.bind(*xs, **params), tuple(new)), 0


batching.primitive_batchers[blockwise_fp8_dot_p] = _batching_rule


def _as_array(x, name):
  """Array-likes (lists, scalars) as arrays; None stays None (only c may be None)."""
  if x is None or hasattr(x, "dtype"):
    return x
  try:
    return jnp.asarray(x)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{name} must be an array, got {type(x).__name__} ({e})") from None


class NotDifferentiableError(ValueError):
  """A derivative through blockwise_fp8_dot's FP8 operands or scales was asked for."""


def _jvp_rule(primals, tangents, *, beta, out_dtype, backend, has_c, b_scale_block):
  """d out = beta * d c: the op is linear in c and nothing else is differentiable.

  The tangent is written with jnp ops, so JAX transposes it for reverse mode
  (the cotangent of c is beta * the output's cotangent, in c's dtype).
  """
  for name, t in zip(("a", "a_scale", "b", "b_scale"), tangents[:4]):
    if type(t) is not ad.Zero:
      raise NotDifferentiableError(
          f"blockwise_fp8_dot is differentiable only with respect to c (and an array beta), "
          f"but a derivative with respect to {name} was requested. FP8 operands and their "
          f"scales come from quantisation, which has no useful derivative: for gradients "
          f"through a matmul computed in FP8, use jax_fp8.dense(x, kernel) (first-order "
          f"gradients with DeepSeek-V3's recipe: FP8 forward, dgrad and wgrad GEMMs).")
  params = dict(beta=beta, out_dtype=out_dtype, backend=backend, has_c=has_c,
                b_scale_block=b_scale_block)
  out = blockwise_fp8_dot_p.bind(*primals, **params)
  if not has_c or type(tangents[4]) is ad.Zero:
    return out, ad.Zero.from_primal_value(out)
  d_c = tangents[4].astype(jnp.float32)
  return out, (jnp.float32(beta) * d_c).astype(out_dtype)


ad.primitive_jvps[blockwise_fp8_dot_p] = _jvp_rule


def blockwise_fp8_dot(a, a_scale, b, b_scale, c=None, *, beta=1.0,
                      out_dtype=jnp.bfloat16, backend: str = "auto",
                      b_scale_block=(128, 128), power_of_two_scales: bool = False):
  """DeepSeek-style blockwise-scaled FP8 matmul.

  Args:
    a: float8_e4m3fn [..., M, K] (any leading batch dims).
    a_scale: float32 [..., M, ceil(K/128)], one scale per row per 1x128 group.
    b: float8_e4m3fn [N, K] (K-major, like a linear layer's weight).
    b_scale: float32, one scale per 128x128 block of b, [ceil(N/128), ceil(K/128)]
      (b_scale_block=(128, 128), the default), or per row of b per 128-wide K
      group, [N, ceil(K/128)] (b_scale_block=(1, 128): the weight-gradient
      recipe). The choice is explicit, never guessed from the shape.
    c: optional residual [..., M, N], any float dtype.
    beta: multiplier of c: a Python real number (static, fused into the kernel)
      or a scalar array (may be traced, e.g. a learnable gate; then
      out + beta * c is added in float32 after the kernel).
    out_dtype: jnp.bfloat16 or jnp.float32; or jnp.float8_e4m3fn: the result
      quantised 1x128 in the kernel's epilogue (the next layer's input), returned
      as (q, scale).
    backend: "auto", "reference", "pallas_sm90", "pallas_sm100" or "ffi".
    b_scale_block: (128, 128) or (1, 128), see b_scale.
    power_of_two_scales: with an FP8 output, its scales are powers of two.

  Returns:
    [..., M, N] out_dtype: sum over K blocks of (a_blk @ b_blk.T) * a_scale *
    b_scale, accumulated in float32, plus beta * c. With out_dtype
    float8_e4m3fn: (q [..., M, N] e4m3, scale [..., M, ceil(N/128)] f32).

  Differentiable with respect to c and an array beta only; see jax_fp8.dense
  for gradients of an FP8 matmul.
  """
  a, a_scale, b, b_scale, c = (_as_array(x, name) for x, name in zip(
      (a, a_scale, b, b_scale, c), ("a", "a_scale", "b", "b_scale", "c")))
  fp8_out = _is_fp8(out_dtype)
  validate(a, a_scale, b, b_scale, c, beta=beta, out_dtype=jnp.float32 if fp8_out else out_dtype,
           backend=backend, b_scale_block=b_scale_block)
  b_scale_block = canonical_b_scale_block(b_scale_block)
  if fp8_out:
    if not is_static_beta(beta):
      raise TypeError("beta must be a Python real number (static) with an FP8 output")
    return fused.blockwise_fp8_dot_fp8(a, a_scale, b, b_scale, c, beta=beta,
                                       power_of_two_scales=power_of_two_scales,
                                       backend=backend, b_scale_rows=b_scale_block[0])
  out_dtype = np.dtype(out_dtype)
  if not is_static_beta(beta):
    # A traced beta cannot reach the kernels' epilogue (it is compiled in):
    # the kernel computes the product in float32 and XLA adds beta * c in one
    # fused elementwise pass. JAX differentiates that add (c and beta).
    acc = blockwise_fp8_dot(a, a_scale, b, b_scale, out_dtype=jnp.float32, backend=backend,
                            b_scale_block=b_scale_block)
    return (acc + beta.astype(jnp.float32) * c.astype(jnp.float32)).astype(out_dtype)
  if backend in backends.PALLAS and device.interpret_mode_active():
    # GPU interpret mode turns a Pallas kernel into ordered io_callbacks, whose
    # effect tokens a primitive's lowering cannot thread (mlir.lower_fun has
    # none for it): call the kernel directly, batch dims folded into M. This
    # is the CPU/CI path of the Pallas kernels; jit and vmap still apply.
    *batch, m, k = a.shape
    rows = math.prod(batch) * m
    keywords = _kernel_keywords(b_scale_block)
    _, kernel = backends.select("cpu", backend, m=rows, n=b.shape[0], k=k, out_dtype=out_dtype,
                                has_c=c is not None, **keywords)
    return _folded(kernel, beta=float(beta), out_dtype=out_dtype, **keywords)(
        a, a_scale, b, b_scale, c)
  operands = (a, a_scale, b, b_scale) + (() if c is None else (c,))
  return blockwise_fp8_dot_p.bind(*operands, beta=float(beta), out_dtype=out_dtype,
                                  backend=backend, has_c=c is not None,
                                  b_scale_block=b_scale_block)
