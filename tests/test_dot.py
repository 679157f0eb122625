"""The blockwise_fp8_dot primitive on the CPU (reference lowering): numerics
against a float64 reference, jit, vmap, export, and input validation."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_fp8
from jax_fp8 import testing
from jax_fp8.pallas import device

F32, BF16 = jnp.float32, jnp.bfloat16

SHAPES = [  # (M, N, K): aligned, unaligned everywhere, partial last K block, tiny
    (1, 1, 1), (7, 130, 300), (128, 256, 256), (129, 2112, 1000), (64, 8, 16), (3, 200, 129),
]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_matches_float64_reference(m, n, k, out_dtype):
  ops = testing.random_operands(m * 7 + n + k, m, n, k)
  out = jax_fp8.blockwise_fp8_dot(*ops.args()[:4], out_dtype=out_dtype)
  assert out.shape == (m, n)
  testing.assert_close(out, testing.reference_f64(*ops.args()), out_dtype)


@pytest.mark.parametrize("c_dtype", [F32, BF16])
@pytest.mark.parametrize("beta", [1.0, -0.5])
@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_residual_add(c_dtype, beta, out_dtype):
  ops = testing.random_operands(11, 33, 300, 260, with_c=True, c_dtype=c_dtype)
  # Scale c to the size of the product so that both terms matter.
  ref0 = testing.reference_f64(*ops.args()[:4])
  ops.c = (ops.c.astype(F32) * np.float32(np.std(ref0))).astype(c_dtype)
  out = jax_fp8.blockwise_fp8_dot(*ops.args(), beta=beta, out_dtype=out_dtype)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=beta), out_dtype)
  # The residual really is in there: without it the result is far off.
  assert testing.rel_error(out, ref0) > 0.1


@pytest.mark.parametrize("batch", [(2,), (2, 3)])
def test_leading_batch_dims(batch):
  ops = testing.random_operands(5, 9, 140, 200, batch=batch, with_c=True)
  out = jax_fp8.blockwise_fp8_dot(*ops.args(), beta=0.25, out_dtype=F32)
  assert out.shape == (*batch, 9, 140)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.25), F32)


def test_every_k_block_is_scaled_by_its_own_scales():
  # One k block's scale changed: only a correct per-block promotion follows it.
  ops = testing.random_operands(3, 16, 256, 384)
  ops.a_scale = ops.a_scale.at[:, 1].multiply(1024.0)
  ops.b_scale = ops.b_scale.at[1, 2].multiply(1 / 512.0)
  out = jax_fp8.blockwise_fp8_dot(*ops.args()[:4], out_dtype=F32)
  testing.assert_close(out, testing.reference_f64(*ops.args()[:4]), F32)


def test_jit_matches_eager_and_sees_a_primitive():
  ops = testing.random_operands(4, 40, 130, 256, with_c=True)
  f = lambda *x: jax_fp8.blockwise_fp8_dot(*x, beta=2.0, out_dtype=F32)
  np.testing.assert_array_equal(np.asarray(jax.jit(f)(*ops.args())), np.asarray(f(*ops.args())))
  jaxpr = jax.make_jaxpr(f)(*ops.args())
  assert "blockwise_fp8_dot" in str(jaxpr)
  assert jax.eval_shape(f, *ops.args()).shape == (40, 130)


def test_vmap_over_activations_folds_into_one_call():
  ops = testing.random_operands(6, 12, 130, 200, batch=(3,), with_c=True)
  f = lambda a, sa, c: jax_fp8.blockwise_fp8_dot(a, sa, ops.b, ops.b_scale, c, out_dtype=F32)
  out = jax.vmap(f)(ops.a, ops.a_scale, ops.c)
  testing.assert_close(out, testing.reference_f64(*ops.args()), F32)
  jaxpr = str(jax.make_jaxpr(jax.vmap(f))(ops.a, ops.a_scale, ops.c))
  assert jaxpr.count("blockwise_fp8_dot") == 1 and "scan" not in jaxpr


def test_vmap_over_axis_1_and_unbatched_scale():
  ops = testing.random_operands(7, 10, 130, 200, batch=(4,))
  a_t = jnp.moveaxis(ops.a, 0, 1)  # [M, B, K], vmapped over axis 1
  f = lambda a, sa: jax_fp8.blockwise_fp8_dot(a, sa, ops.b, ops.b_scale, out_dtype=F32)
  out = jax.vmap(f, in_axes=(1, 0), out_axes=2)(a_t, ops.a_scale)
  assert out.shape == (10, 130, 4)
  ref = testing.reference_f64(*ops.args()[:4])
  testing.assert_close(jnp.moveaxis(out, 2, 0), ref, F32)
  # Only c batched: a is shared by every element.
  c = jax.random.normal(jax.random.key(0), (2, 10, 130))
  g = lambda c: jax_fp8.blockwise_fp8_dot(ops.a[0], ops.a_scale[0], ops.b, ops.b_scale, c,
                                          out_dtype=F32)
  out = jax.vmap(g)(c)
  for i in range(2):
    testing.assert_close(out[i], testing.reference_f64(ops.a[0], ops.a_scale[0], ops.b,
                                                       ops.b_scale, c[i]), F32)


def test_vmap_over_weights():
  rng_ops = [testing.random_operands(20 + i, 9, 140, 260) for i in range(3)]
  stack = lambda name: jnp.stack([getattr(o, name) for o in rng_ops])
  f = lambda a, sa, b, sb: jax_fp8.blockwise_fp8_dot(a, sa, b, sb, out_dtype=F32)
  out = jax.jit(jax.vmap(f))(stack("a"), stack("a_scale"), stack("b"), stack("b_scale"))
  for i, o in enumerate(rng_ops):
    testing.assert_close(out[i], testing.reference_f64(*o.args()[:4]), F32)
  # Shared activations, batched weights.
  out = jax.vmap(f, in_axes=(None, None, 0, 0))(rng_ops[0].a, rng_ops[0].a_scale,
                                                 stack("b"), stack("b_scale"))
  for i, o in enumerate(rng_ops):
    ref = testing.reference_f64(rng_ops[0].a, rng_ops[0].a_scale, o.b, o.b_scale)
    testing.assert_close(out[i], ref, F32)


def test_export_round_trip():
  ops = testing.random_operands(8, 20, 140, 300, with_c=True)
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, beta=0.5, out_dtype=BF16))
  exp = jax.export.export(f, platforms=["cpu"])(*ops.args())
  restored = jax.export.deserialize(exp.serialize())
  out = restored.call(*ops.args())
  np.testing.assert_array_equal(np.asarray(out.astype(F32)), np.asarray(f(*ops.args()).astype(F32)))
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), BF16)
  text = exp.mlir_module()
  assert "callback" not in text.lower()


def test_cuda_lowering_of_reference_works_without_a_gpu():
  ops = testing.random_operands(9, 16, 256, 256)
  f = lambda *x: jax_fp8.blockwise_fp8_dot(*x, backend="reference", out_dtype=F32)
  avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ops.args()[:4]]
  text = jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  assert "dot_general" in text


def test_end_to_end_against_unquantized_jnp_dot():
  kx, kw = jax.random.split(jax.random.key(10))
  x = jax.random.normal(kx, (64, 1000), F32)
  w = jax.random.normal(kw, (300, 1000), F32) * 0.02
  qx, sx = jax_fp8.quantize_1x128(x)
  qw, sw = jax_fp8.quantize_128x128(w)
  out = jax_fp8.blockwise_fp8_dot(qx, sx, qw, sw, out_dtype=F32)
  want = jnp.dot(x, w.T, precision="highest")
  err = testing.rel_error(out, np.asarray(want, np.float64))
  # FP8 quantisation of both operands costs a few percent, no more.
  assert err < 0.06, err
  # The same check catches a wrongly laid out scale (it cannot pass by accident).
  bad = jax_fp8.blockwise_fp8_dot(qx, sx, qw, sw.at[0, 0].multiply(4.0), out_dtype=F32)
  assert testing.rel_error(bad, np.asarray(want, np.float64)) > 0.06


def test_assert_close_rejects_nan_and_wrong_results():
  ref = np.ones((4, 4))
  with pytest.raises(AssertionError):
    testing.assert_close(jnp.full((4, 4), jnp.nan, F32), ref, F32)
  with pytest.raises(AssertionError):
    testing.assert_close(jnp.ones((4, 4), F32) * 1.001, ref, F32)
  with pytest.raises(AssertionError):
    testing.assert_close(testing.poison_like((4, 4), BF16), ref, BF16)


# ---- bad input -------------------------------------------------------------------

def _good():
  return testing.random_operands(12, 8, 130, 300, with_c=True)


def _call(over, jit):
  o = _good()
  arrays = dict(a=o.a, a_scale=o.a_scale, b=o.b, b_scale=o.b_scale, c=o.c)
  params = dict(beta=1.0, out_dtype=BF16, backend="auto", b_scale_block=(128, 128))
  for key, value in over.items():
    (arrays if key in arrays else params)[key] = value

  def f(a, a_scale, b, b_scale, c):
    return jax_fp8.blockwise_fp8_dot(a, a_scale, b, b_scale, c, **params)
  return (jax.jit(f) if jit else f)(**arrays)


BAD_INPUTS = [
    (dict(a=jnp.ones((8, 300), BF16)), TypeError, "a must be float8_e4m3fn"),
    (dict(b=jnp.ones((130, 300), F32)), TypeError, "b must be float8_e4m3fn"),
    (dict(a_scale=jnp.ones((8, 3), BF16)), TypeError, "a_scale must be float32"),
    (dict(b_scale=jnp.ones((2, 3), jnp.float16)), TypeError, "b_scale must be float32"),
    (dict(a=jnp.ones((300,), jnp.float8_e4m3fn)), ValueError, "a must be [..., M, K]"),
    (dict(b=jnp.ones((1, 130, 300), jnp.float8_e4m3fn)), ValueError, "b must be 2-D [N, K]"),
    (dict(b=jnp.ones((130, 256), jnp.float8_e4m3fn)), ValueError, "K mismatch"),
    (dict(a_scale=jnp.ones((8, 2), F32)), ValueError, "a_scale must have shape"),
    (dict(a_scale=jnp.ones((3,), F32)), ValueError, "a_scale must have shape"),
    (dict(b_scale=jnp.ones((1, 3), F32)), ValueError, "b_scale must have shape"),
    (dict(b_scale=jnp.ones((3, 2), F32)), ValueError, "b_scale must have shape"),
    (dict(c=jnp.ones((8, 129), F32)), ValueError, "c must have the output's shape"),
    (dict(c=jnp.ones((8, 130), jnp.int32)), TypeError, "c must be a floating-point"),
    (dict(c=None, beta=0.5), ValueError, "beta=0.5 was given but c is None"),
    (dict(beta="2"), TypeError, "beta must be a real number (static) or a scalar JAX array"),
    (dict(beta=True), TypeError, "beta must be a real number (static) or a scalar JAX array"),
    (dict(beta=jnp.ones((2,), F32)), ValueError, "beta must be a scalar"),
    (dict(beta=jnp.array(1 + 1j)), TypeError, "beta must be a real (floating or integer)"),
    (dict(c=None, beta=jnp.float32(0.5)), ValueError, "beta was given as an array but c is None"),
    (dict(b_scale_block=(1, 64)), ValueError, "b_scale_block must be (128, 128)"),
    (dict(b_scale_block="1x128"), ValueError, "b_scale_block must be (128, 128)"),
    (dict(b_scale_block=(1, 128)), ValueError,
     "b_scale must have shape (N, ceil(K/128)) = (130, 3)"),
    (dict(beta=float("nan")), ValueError, "beta must be finite"),
    (dict(out_dtype=jnp.float16), TypeError, "out_dtype must be bfloat16, float32 or float8_e4m3fn"),
    (dict(out_dtype="int8"), TypeError, "out_dtype must be bfloat16, float32 or float8_e4m3fn"),
    (dict(backend="cublas"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("over,exc,msg", BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS])
def test_bad_input_is_named(over, exc, msg):
  with pytest.raises(exc, match=re.escape(msg)):
    _call(over, jit=False)
  with pytest.raises(exc, match=re.escape(msg)):  # the same under jit
    _call(over, jit=True)


def test_k_zero_is_rejected():
  with pytest.raises(ValueError, match="K must be >= 1"):
    jax_fp8.blockwise_fp8_dot(jnp.ones((4, 0), jnp.float8_e4m3fn), jnp.ones((4, 0)),
                              jnp.ones((8, 0), jnp.float8_e4m3fn), jnp.ones((1, 0)))


@pytest.mark.skipif(bool(device.gpus()), reason="on a GPU machine these backends may run")
@pytest.mark.parametrize("backend", ["pallas_sm90", "pallas_sm100", "ffi"])
def test_gpu_backends_on_the_cpu_say_why(backend):
  o = _good()
  with pytest.raises(jax_fp8.BackendUnavailableError, match=f"backend='{backend}' needs"):
    jax_fp8.blockwise_fp8_dot(*o.args()[:4], backend=backend)
  if backend != "ffi":
    with pytest.raises(jax_fp8.BackendUnavailableError, match="interpret mode"):
      jax_fp8.blockwise_fp8_dot(*o.args()[:4], backend=backend)


def test_interpret_mode_runs_a_named_kernel_on_any_gpu(monkeypatch):
  """In GPU interpret mode a named Pallas backend runs on the host whatever GPU lowers
  the call (the Blackwell kernel's interpret-mode tests on a Hopper machine); "auto"
  still picks by the GPU's generation, and outside interpret mode the generation
  decides."""
  from jax_fp8 import backends
  monkeypatch.setattr(device, "target_compute_capability", lambda: (9, 0))
  problem = dict(m=8, n=128, k=128, out_dtype=F32, has_c=False)
  with pytest.raises(jax_fp8.BackendUnavailableError, match="compute capability 9.0"):
    backends.select("cuda", "pallas_sm100", **problem)
  with testing.gpu_interpret_mode():
    assert backends.select("cuda", "pallas_sm100", **problem)[0] == "pallas_sm100"
    assert backends.select("cuda", "auto", **problem)[0] == "pallas_sm90"
    monkeypatch.setattr(device, "target_compute_capability", lambda: (8, 0))
    with pytest.raises(jax_fp8.BackendUnavailableError, match="compute capability 8.0"):
      backends.select("cuda", "ffi", **problem)  # no interpret mode: its generation decides
    with pytest.raises(jax_fp8.BackendUnavailableError, match="platform 'rocm'"):
      backends.select("rocm", "pallas_sm100", **problem)


# ---- per-row b scales (b_scale_block=(1, 128)) ---------------------------------------

ROW = (1, 128)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 130, 300), (64, 256, 256), (3, 200, 129)])
@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_per_row_b_scales_match_float64_reference(m, n, k, out_dtype):
  ops = testing.random_operands(m + 3 * n + k, m, n, k, b_scale_block=ROW, with_c=True)
  assert ops.b_scale.shape == (n, -(-k // 128))
  out = jax_fp8.blockwise_fp8_dot(*ops.args(), beta=-0.5, out_dtype=out_dtype,
                                  b_scale_block=ROW)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=-0.5, b_scale_block=ROW),
                       out_dtype)


def test_per_row_b_scales_are_per_row_and_per_k_block():
  # Neighbouring rows of b get scales 2^10 apart: a 128-row block scale cannot match.
  ops = testing.random_operands(30, 16, 256, 384, b_scale_block=ROW)
  ops.b_scale = ops.b_scale.at[1::2, 1].multiply(1024.0)
  out = jax_fp8.blockwise_fp8_dot(*ops.args()[:4], out_dtype=F32, b_scale_block=ROW)
  testing.assert_close(out, testing.reference_f64(*ops.args()[:4], b_scale_block=ROW), F32)
  # The same scales read as if the first row's applied to its whole 128-row block: far off.
  blocks = ops.b_scale[::128]
  wrong = testing.reference_f64(*ops.args()[:3], blocks, b_scale_block=(128, 128))
  assert testing.rel_error(out, wrong) > 0.1


def test_per_row_b_scales_under_jit_and_vmap():
  ops = testing.random_operands(31, 10, 140, 260, batch=(3,), b_scale_block=ROW)
  f = lambda a, sa, b, sb: jax_fp8.blockwise_fp8_dot(a, sa, b, sb, out_dtype=F32,
                                                     b_scale_block=ROW)
  ref = testing.reference_f64(*ops.args()[:4], b_scale_block=ROW)
  testing.assert_close(jax.jit(jax.vmap(f, in_axes=(0, 0, None, None)))(*ops.args()[:4]),
                       ref, F32)
  # Batched weights with per-row scales: one dot per element.
  bs = jnp.stack([ops.b, ops.b[::-1]])
  ss = jnp.stack([ops.b_scale, ops.b_scale[::-1]])
  out = jax.vmap(f, in_axes=(None, None, 0, 0))(ops.a[0], ops.a_scale[0], bs, ss)
  for i in range(2):
    testing.assert_close(out[i], testing.reference_f64(ops.a[0], ops.a_scale[0], bs[i], ss[i],
                                                       b_scale_block=ROW), F32)


def test_per_row_b_scales_backend_selection():
  from jax_fp8 import backends
  import jax_fp8.ffi as ffi
  # The CUDA fallback says it has no per-row kernel (before it looks for a GPU).
  reason = ffi.unsupported_reason("blockwise_fp8_dot", 64, 64, 256, out_dtype=F32,
                                  b_scale_rows=1)
  assert "per-row b scales" in reason and "FFI" in reason
  # A kernel function without the keyword is refused for the non-default value only.
  def old_kernel(a, a_scale, b, b_scale, c, *, beta, out_dtype):
    del a, a_scale, b, b_scale, c, beta, out_dtype
  def new_kernel(a, a_scale, b, b_scale, c, *, beta, out_dtype, b_scale_rows=128):
    del a, a_scale, b, b_scale, c, beta, out_dtype, b_scale_rows
  op = "blockwise_fp8_dot"
  assert backends._missing_keywords(old_kernel, op, dict(b_scale_rows=1)) == ["b_scale_rows"]
  assert backends._missing_keywords(old_kernel, op, dict(b_scale_rows=128)) == []
  assert backends._missing_keywords(new_kernel, op, dict(b_scale_rows=1)) == []
  name, fn = backends.select("cpu", "auto", m=8, n=8, k=8, out_dtype=F32, has_c=False,
                             b_scale_rows=1)
  assert name == "reference"


# ---- differentiation: linear in c and beta; FP8 operands refused ----------------------

def _c_ops(seed=40):
  ops = testing.random_operands(seed, 24, 140, 260, with_c=True)
  scale = np.float32(np.std(testing.reference_f64(*ops.args()[:4])))
  ops.c = ops.c * scale  # both terms of the same size
  return ops


@pytest.mark.parametrize("out_dtype,c_dtype", [(F32, F32), (BF16, BF16), (F32, BF16)])
def test_grad_with_respect_to_c(out_dtype, c_dtype):
  ops = _c_ops()
  c = ops.c.astype(c_dtype)
  g = jax.random.normal(jax.random.key(1), c.shape, F32)
  def loss(c):
    out = jax_fp8.blockwise_fp8_dot(*ops.args()[:4], c, beta=-0.75, out_dtype=out_dtype)
    return jnp.sum(out.astype(F32) * g)
  dc = jax.jit(jax.grad(loss))(c)
  assert dc.dtype == c_dtype
  want = (-0.75 * np.asarray(g, np.float64))
  testing.assert_close(dc, want, c_dtype)


def test_jvp_and_linear_transpose_in_c():
  ops = _c_ops(41)
  f = lambda c: jax_fp8.blockwise_fp8_dot(*ops.args()[:4], c, beta=2.0, out_dtype=F32)
  t = jax.random.normal(jax.random.key(2), ops.c.shape, F32)
  out, tangent = jax.jvp(f, (ops.c,), (t,))
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=2.0), F32)
  np.testing.assert_allclose(np.asarray(tangent), 2.0 * np.asarray(t), rtol=1e-6)
  # Reverse mode of the tangent map (jax.linearize + linear_transpose).
  _, f_lin = jax.linearize(f, ops.c)
  ct, = jax.linear_transpose(f_lin, ops.c)(t)
  np.testing.assert_allclose(np.asarray(ct), 2.0 * np.asarray(t), rtol=1e-6)


@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_traced_beta_matches_static_and_is_differentiable(out_dtype):
  ops = _c_ops(42)
  dot = lambda beta, c: jax_fp8.blockwise_fp8_dot(*ops.args()[:4], c, beta=beta,
                                                  out_dtype=out_dtype)
  traced = jax.jit(dot)(jnp.float32(-0.3), ops.c)
  static = dot(-0.3, ops.c)
  assert traced.dtype == static.dtype == out_dtype
  testing.assert_close(traced, testing.reference_f64(*ops.args(), beta=-0.3), out_dtype)
  # d/dbeta sum(out * g) = sum(c * g); d/dc = beta * g.
  g = jax.random.normal(jax.random.key(3), ops.c.shape, F32)
  loss = lambda beta, c: jnp.sum(dot(beta, c).astype(F32) * g)
  dbeta, dc = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.float32(-0.3), ops.c)
  want = float(np.sum(np.asarray(ops.c, np.float64) * np.asarray(g, np.float64)))
  tol = 1e-5 if out_dtype == F32 else 4e-3  # bf16 output: the cotangent is rounded to it
  assert abs(float(dbeta) - want) <= tol * float(np.linalg.norm(np.asarray(ops.c)) *
                                                 np.linalg.norm(np.asarray(g)))
  testing.assert_close(dc, -0.3 * np.asarray(g, np.float64), F32, tol=tol)
  # A learnable gate per example: beta batched under vmap.
  betas = jnp.array([0.5, -2.0], F32)
  out = jax.vmap(dot, in_axes=(0, None))(betas, ops.c)
  for i, b in enumerate((0.5, -2.0)):
    testing.assert_close(out[i], testing.reference_f64(*ops.args(), beta=b), out_dtype)


@pytest.mark.parametrize("argnum,name", [(0, "a"), (1, "a_scale"), (2, "b"), (3, "b_scale")])
def test_grad_through_fp8_operands_points_to_dense(argnum, name):
  ops = _c_ops(43)
  f = lambda *xs: jnp.sum(jax_fp8.blockwise_fp8_dot(*xs, out_dtype=F32))
  with pytest.raises(jax_fp8.NotDifferentiableError,
                     match=rf"derivative with respect to {name}\b.*jax_fp8\.dense"):
    jax.grad(f, argnums=argnum)(*ops.args())


def test_grad_through_quantised_activations_points_to_dense():
  ops = _c_ops(44)
  def f(x):
    q, s = jax_fp8.quantize_1x128(x)
    return jnp.sum(jax_fp8.blockwise_fp8_dot(q, s, ops.b, ops.b_scale, out_dtype=F32))
  x = jax.random.normal(jax.random.key(4), ops.a.shape, F32)
  with pytest.raises(ValueError, match="use jax_fp8.dense"):
    jax.jit(jax.grad(f))(x)


@pytest.mark.parametrize("backend", ["pallas_sm90", "pallas_sm100"])
def test_per_row_b_scales_reach_the_pallas_kernels_in_interpret_mode(backend):
  # The public API passes b_scale_rows=1 through to the kernels (GPU interpret mode).
  ops = testing.random_operands(50, 70, 136, 300, b_scale_block=ROW, with_c=True)
  f = lambda *xs: jax_fp8.blockwise_fp8_dot(*xs, beta=0.5, out_dtype=F32, backend=backend,
                                            b_scale_block=ROW)
  out = testing.run_in_gpu_interpret_mode(f, *ops.args())
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5, b_scale_block=ROW), F32)
