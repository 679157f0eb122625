"""`dense(x, kernel)`: a matmul trained in FP8 with DeepSeek-V3's blockwise recipe.

    forward  y  = x @ kernel      x 1x128 along K,       kernel 128x128 blocks
    dgrad    dx = dy @ kernel^T   dy 1x128 along N,      the same quantised kernel, transposed
    wgrad    dk = x^T @ dy        x and dy 1x128 along the tokens (per-row scales on both
                                  operands, b_scale_block=(1, 128)), float32

All three are `blockwise_fp8_dot` calls, so each runs on the backend that
`backend="auto"` picks and partitions with the op's sharding rules. A 128x128
block grid is transpose-invariant, so dgrad uses the forward's quantised kernel
with its data and scale grid transposed (exact, no re-quantisation).

Saved for the backward pass (jax.custom_vjp residuals): x quantised along the
tokens (e4m3 [K, T] and float32 scales [K, ceil(T/128)]) and the quantised
kernel (e4m3 [K, N], float32 [ceil(K/128), ceil(N/128)]); never x itself, so
a layer keeps about half the activation bytes of a bf16 layer (which saves x).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_fp8.primitive import blockwise_fp8_dot
from jax_fp8.quantize import quantize_128x128_with_transpose, quantize_1x128_with_transpose

DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))


def _check(x, kernel, out_dtype):
  for name, v in (("x", x), ("kernel", kernel)):
    if np.dtype(v.dtype) not in DTYPES:
      raise TypeError(f"{name} must be bfloat16 or float32, got {v.dtype}")
  if x.ndim < 1:
    raise ValueError(f"x must be [..., K] (at least 1-D), got shape {x.shape}")
  if kernel.ndim != 2:
    raise ValueError(f"kernel must be 2-D [K, N] (Flax's layout), got shape {kernel.shape}")
  k, n = kernel.shape
  if x.shape[-1] != k:
    raise ValueError(f"K mismatch: x is {x.shape} (K={x.shape[-1]}) but kernel is "
                     f"{kernel.shape} (K={k}); kernel must be [K, N] with x's last dim as K")
  if k < 1 or n < 1:
    raise ValueError(f"kernel must have K >= 1 and N >= 1, got shape {kernel.shape}")
  if out_dtype is not None:
    try:
      dt = np.dtype(out_dtype)
    except TypeError:
      dt = None
    if dt not in DTYPES:
      raise TypeError(f"out_dtype must be bfloat16 or float32 (or None: x's dtype), "
                      f"got {out_dtype}")


def dense(x: jax.Array, kernel: jax.Array, *, out_dtype=None) -> jax.Array:
  """x @ kernel computed in FP8 (DeepSeek-V3 recipe), differentiable in x and kernel.

  Args:
    x: [..., K] bfloat16 or float32 (any leading dims: they are the tokens).
    kernel: [K, N] bfloat16 or float32 (Flax's layout).
    out_dtype: bfloat16 or float32; None: x's dtype.

  Returns:
    [..., N] out_dtype. Gradients: dx in x's dtype, dkernel computed in float32
    and returned in kernel's dtype. First-order only (jax.grad, jax.vjp), under
    jit, vmap, remat and sharding.
  """
  x, kernel = jnp.asarray(x), jnp.asarray(kernel)
  _check(x, kernel, out_dtype)
  dtypes = (np.dtype(out_dtype or x.dtype), np.dtype(x.dtype), np.dtype(kernel.dtype))
  *lead, k = x.shape
  y = _dense_2d(x.reshape(-1, k), kernel, dtypes)
  return y.reshape(*lead, kernel.shape[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense_2d(x, kernel, dtypes):
  return _forward(x, kernel, dtypes)[0]


def _forward(x, kernel, dtypes):
  """x [T, K], kernel [K, N] -> (y [T, N], residuals for the backward pass)."""
  out_dtype = dtypes[0]
  q, s, q_t, s_t = quantize_1x128_with_transpose(x)
  # [K, N] e4m3 and [ceil(K/128), ceil(N/128)] for dgrad; the forward's b is
  # [N, K] (K-major): the same blocks transposed, written from the same read.
  qk, sk, qk_t, sk_t = quantize_128x128_with_transpose(kernel)
  y = blockwise_fp8_dot(q, s, qk_t, sk_t, out_dtype=out_dtype)
  return y, (q_t, s_t, qk, sk)


def _backward(dtypes, residuals, dy):
  _, x_dtype, kernel_dtype = dtypes
  q_t, s_t, qk, sk = residuals
  tokens = dy.shape[0]
  dq, ds, dq_t, ds_t = quantize_1x128_with_transpose(dy)   # along N; along the tokens
  # dgrad: contracts over N; b = the quantised kernel [K, N] as it was stored.
  dx = blockwise_fp8_dot(dq, ds, qk, sk, out_dtype=x_dtype)
  if tokens == 0:  # nothing to contract over
    return dx, jnp.zeros(qk.shape, kernel_dtype)
  # wgrad: contracts over the tokens, per-row scales on both operands; float32
  # accumulation rounded once to the kernel's dtype in the GEMM's epilogue (no
  # float32 copy of the gradient through HBM).
  dk = blockwise_fp8_dot(q_t, s_t, dq_t, ds_t, out_dtype=kernel_dtype, b_scale_block=(1, 128))
  return dx, dk


_dense_2d.defvjp(_forward, _backward)
