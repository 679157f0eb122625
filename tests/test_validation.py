"""Every argument gets a clear TypeError/ValueError naming it, or correct
handling (issue 19): array-likes for c and the dequantisers' arguments, beta
beyond float32, arguments that are no arrays at all."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_fp8
from jax_fp8 import testing

F32 = jnp.float32


def _ops():
  return testing.random_operands(30, 8, 130, 300, with_c=True)


@pytest.mark.parametrize("as_list", [lambda c: np.asarray(c).tolist(), np.asarray])
def test_c_as_an_array_like_is_used(as_list):
  ops = _ops()
  out = jax_fp8.blockwise_fp8_dot(*ops.args()[:4], as_list(ops.c), beta=0.5, out_dtype=F32)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), F32)


@pytest.mark.parametrize("over,exc,msg", [
    (dict(c=2.0), ValueError, "c must have the output's shape"),
    (dict(c=[[1.0, 2.0]]), ValueError, "c must have the output's shape"),
    (dict(c=object()), TypeError, "c must be an array"),
    (dict(c="residual"), TypeError, "c must be an array"),
    (dict(c=jnp.ones((8, 130), jnp.int32)), TypeError, "c must be a floating-point"),
    (dict(a_scale=None), TypeError, "a_scale must be an array"),
    (dict(b=None), TypeError, "b must be an array"),
    (dict(beta=1e39), ValueError, "beta must be finite in float32"),
    (dict(beta=-3.5e38), ValueError, "beta must be finite in float32"),
], ids=lambda x: re.sub(r"\W+", "_", str(x))[:40])
@pytest.mark.parametrize("jit", [False, True])
def test_bad_arguments_are_named(over, exc, msg, jit):
  ops = _ops()
  args = dict(a=ops.a, a_scale=ops.a_scale, b=ops.b, b_scale=ops.b_scale, c=ops.c)
  over = dict(over)
  beta = over.pop("beta", 0.5)
  args.update(over)
  f = lambda **kw: jax_fp8.blockwise_fp8_dot(**kw, beta=beta, out_dtype=F32)
  if jit and all(hasattr(v, "dtype") or v is None for v in args.values()):
    f = jax.jit(f)
  with pytest.raises(exc, match=re.escape(msg)):
    f(**args)


def test_beta_at_the_edge_of_float32_is_accepted():
  ops = _ops()
  out = jax_fp8.blockwise_fp8_dot(*ops.args()[:4], jnp.zeros_like(ops.c), beta=3e38,
                                  out_dtype=F32)
  testing.assert_close(out, testing.reference_f64(*ops.args()[:4]), F32)


def test_dequantizers_take_array_likes():
  x = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32)
  q, s = jax_fp8.quantize_1x128(x.tolist())  # lists quantise too
  want = np.asarray(jax_fp8.dequantize_1x128(q, s))
  got = jax_fp8.dequantize_1x128(np.asarray(q.astype(F32)).tolist(), np.asarray(s).tolist())
  np.testing.assert_array_equal(np.asarray(got), want)
  q, s = jax_fp8.quantize_128x128(x)
  want = np.asarray(jax_fp8.dequantize_128x128(q, s, jnp.bfloat16).astype(F32))
  got = jax_fp8.dequantize_128x128(np.asarray(q.astype(F32)).tolist(), np.asarray(s).tolist(),
                                   jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(got.astype(F32)), want)


@pytest.mark.parametrize("fn", [jax_fp8.dequantize_1x128, jax_fp8.dequantize_128x128])
def test_dequantizers_name_bad_arguments(fn):
  q, s = jax_fp8.quantize_128x128(jnp.ones((4, 300)))
  with pytest.raises(TypeError, match="q must be a floating-point"):
    fn(jnp.ones((4, 300), jnp.int32), s)
  with pytest.raises(TypeError, match="scale must be a floating-point"):
    fn(q, jnp.ones(s.shape, jnp.int32))
  with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
    fn(q, s if fn is jax_fp8.dequantize_128x128 else jnp.ones((4, 3)), jnp.int8)
  with pytest.raises(TypeError, match="q must be an array"):
    fn(object(), s)
  with pytest.raises(ValueError, match="scale must have shape"):
    fn(q, jnp.ones((9, 9)))
  with pytest.raises(ValueError, match="q must "):
    fn(jnp.ones((), F32), jnp.ones((1,)))
