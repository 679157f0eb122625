"""jax_fp8.blockwise_fp8_glu: the fused gated-MLP input (reference on the CPU,
both Pallas kernels in GPU interpret mode), validation, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import requires_gpu

import jax_fp8
from jax_fp8 import testing

FP8 = jnp.float8_e4m3fn
ACT = {"silu": lambda v: v / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
       "gelu": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))}


def _operands(seed, m, f, k, batch=()):
  ops = testing.random_operands(seed, m, 2 * f, k, batch=batch)
  full = testing.reference_f64(ops.a, ops.a_scale, ops.b, ops.b_scale)
  return ops, full[..., :f], full[..., f:]


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_reference_matches_float64(activation, out_dtype):
  ops, gate, up = _operands(1, 40, 256, 300, batch=(2,))
  out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(*x, activation=activation,
                                                     out_dtype=out_dtype))(
      ops.a, ops.a_scale, ops.b, ops.b_scale)
  assert out.shape == (2, 40, 256)
  testing.assert_close(out, ACT[activation](gate) * up, out_dtype)


@pytest.mark.parametrize("backend", ["pallas_sm90", "pallas_sm100"])
def test_kernels_in_interpret_mode(backend):
  ops, gate, up = _operands(2, 70, 256, 300)
  with testing.gpu_interpret_mode(uninitialized_memory="nan"):
    out = jax.block_until_ready(jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(
        *x, out_dtype=jnp.float32, backend=backend))(ops.a, ops.a_scale, ops.b, ops.b_scale))
  testing.assert_close(out, ACT["silu"](gate) * up, jnp.float32)


def test_fp8_output_is_the_quantised_result():
  ops, gate, up = _operands(3, 33, 384, 256)
  q, s = jax_fp8.blockwise_fp8_glu(ops.a, ops.a_scale, ops.b, ops.b_scale, out_dtype=FP8)
  assert q.dtype == FP8 and q.shape == (33, 384) and s.shape == (33, 3)
  deq = jax_fp8.dequantize_1x128(q, s)
  assert testing.rel_error(deq, ACT["silu"](gate) * up) < 0.05  # e4m3's rounding


def test_vmap_over_activations():
  ops, gate, up = _operands(4, 24, 128, 256, batch=(3,))
  out = jax.vmap(lambda a, sa: jax_fp8.blockwise_fp8_glu(a, sa, ops.b, ops.b_scale,
                                                          out_dtype=jnp.float32))(
      ops.a, ops.a_scale)
  testing.assert_close(out, ACT["silu"](gate) * up, jnp.float32)


@pytest.mark.parametrize("change,error,match", [
    (dict(b=jnp.zeros((257, 256), FP8)), ValueError, "2F rows"),
    (dict(b=jnp.zeros((320, 256), FP8), b_scale=jnp.ones((3, 2), jnp.float32)), ValueError,
     "multiple of 128"),
    (dict(activation="tanh"), ValueError, "activation"),
    (dict(out_dtype=jnp.float16), TypeError, "out_dtype"),
    (dict(b_scale=jnp.ones((3, 2), jnp.float32)), ValueError, "b_scale"),
    (dict(backend="cuda"), ValueError, "backend"),
])
def test_validation_names_the_argument(change, error, match):
  ops, _, _ = _operands(5, 8, 128, 256)
  args = dict(a=ops.a, a_scale=ops.a_scale, b=ops.b, b_scale=ops.b_scale)
  kw = {k: v for k, v in change.items() if k not in args}
  args.update({k: v for k, v in change.items() if k in args})
  with pytest.raises(error, match=match):
    jax_fp8.blockwise_fp8_glu(*args.values(), **kw)


def test_explicit_kernel_on_the_cpu_is_unavailable():
  ops, _, _ = _operands(6, 8, 128, 256)
  with pytest.raises(jax_fp8.BackendUnavailableError, match="interpret"):
    jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(*x, backend="pallas_sm90"))(
        ops.a, ops.a_scale, ops.b, ops.b_scale)


@requires_gpu(major=9)
@pytest.mark.parametrize("m", [64, 128, 4096])
def test_gpu_deepseek_v3_mlp_input(m):
  """7168 -> 2 x 18432 (gate, up), SiLU, bf16 and FP8 output (at 64 rows unfused:
  hopper_tiling.glu_unfused)."""
  ops, gate, up = _operands(7, m, 18432, 7168)
  out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(*x, out_dtype=jnp.bfloat16))(
      ops.a, ops.a_scale, ops.b, ops.b_scale)
  testing.assert_close(out, ACT["silu"](gate) * up, jnp.bfloat16)
  q, s = jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(*x, out_dtype=FP8))(
      ops.a, ops.a_scale, ops.b, ops.b_scale)
  assert testing.rel_error(jax_fp8.dequantize_1x128(q, s), ACT["silu"](gate) * up) < 0.05


@requires_gpu(major=9)
@pytest.mark.parametrize("power_of_two", [False, True])
def test_gpu_glu_fp8_output_is_its_float32_output_quantised(power_of_two):
  """On the tensor cores: the fused GLU's FP8 output is, bit for bit, the numpy model's
  1x128 quantisation of its float32 output (both tilings run the same K loop)."""
  from test_quantize_kernels import model_1x128
  ops, _, _ = _operands(8, 300, 512, 1000)
  call = lambda out_dtype: jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(
      *x, out_dtype=out_dtype, backend="pallas_sm90", power_of_two_scales=power_of_two))(
      ops.a, ops.a_scale, ops.b, ops.b_scale)
  q, s = call(FP8)
  want_q, want_s = model_1x128(np.asarray(call(jnp.float32)), power_of_two)
  np.testing.assert_array_equal(np.asarray(s), want_s)
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), want_q.astype(np.float32))


def test_glu_unfused_at_decode(monkeypatch):
  """The Hopper rules' decode path of the GLU (hopper_tiling.glu_unfused: the gate|up
  GEMM's float32 output, then the activation in XLA and, for an FP8 output, the
  quantiser kernel), taken here at a small shape in interpret mode: the float64
  contract, and the FP8 output the float32 output quantised, bit for bit."""
  from test_quantize_kernels import model_1x128
  from jax_fp8.pallas import hopper_tiling
  calls = []
  monkeypatch.setattr(hopper_tiling, "glu_unfused", lambda *a: calls.append(a) or True)
  ops, gate, up = _operands(10, 20, 256, 300)
  call = lambda out_dtype: jax.jit(lambda *x: jax_fp8.blockwise_fp8_glu(
      *x, activation="gelu", out_dtype=out_dtype, backend="pallas_sm90"))
  with testing.gpu_interpret_mode(uninitialized_memory="nan"):
    y = jax.block_until_ready(call(jnp.float32)(ops.a, ops.a_scale, ops.b, ops.b_scale))
    q, s = jax.block_until_ready(call(FP8)(ops.a, ops.a_scale, ops.b, ops.b_scale))
  assert len(calls) == 2, "the unfused path was not taken"
  testing.assert_close(y, ACT["gelu"](gate) * up, jnp.float32)
  want_q, want_s = model_1x128(np.asarray(y), False)
  np.testing.assert_array_equal(np.asarray(s), want_s)
  np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)), want_q.astype(np.float32))


@pytest.mark.parametrize("backend", ["reference", "pallas_sm90", "pallas_sm100",
                                     "pallas_sm90 quantised after"])
@pytest.mark.parametrize("power_of_two", [False, True])
def test_dot_fp8_output_is_its_float32_result_quantised(backend, power_of_two, monkeypatch):
  """blockwise_fp8_dot(..., out_dtype=float8_e4m3fn) -> (q, scale): the float32
  result (+ beta * c) quantised 1x128 (the decisions' numpy model), bit for bit.
  "quantised after": the Hopper rules' decode path (the float32 output, then the
  quantiser kernel), taken here at a small shape."""
  from test_quantize_kernels import model_1x128
  from jax_fp8.pallas import hopper_tiling
  quantised_after, backend = backend.endswith("quantised after"), backend.split()[0]
  calls = []
  if quantised_after:
    monkeypatch.setattr(hopper_tiling, "fp8_output_quantized_after",
                        lambda *a, **kw: calls.append(a) or True)
  ops = testing.random_operands(8, 70, 300, 300, with_c=True, batch=(2,))
  call = lambda out_dtype: jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
      *x, beta=0.5, out_dtype=out_dtype, backend=backend, power_of_two_scales=power_of_two))
  with testing.gpu_interpret_mode(uninitialized_memory="nan"):
    q, s = jax.block_until_ready(call(FP8)(*ops.args()))
    y = jax.block_until_ready(call(jnp.float32)(*ops.args()))
  assert q.dtype == FP8 and q.shape == (2, 70, 300) and s.shape == (2, 70, 3)
  assert bool(calls) == quantised_after, "the quantise-after path was (not) taken"
  want_q, want_s = model_1x128(np.asarray(y, np.float32).reshape(140, 300), power_of_two)
  got_s = np.asarray(s).reshape(140, 3)
  got_q = np.asarray(q.astype(jnp.float32)).reshape(140, 300)
  if jax.default_backend() == "cpu":
    np.testing.assert_array_equal(got_s, want_s)
    np.testing.assert_array_equal(got_q, want_q.astype(np.float32))
  else:
    # On a GPU the two programs' float32 results may differ in a last bit (XLA picks
    # each program's dot algorithm): a scale amax / 448 by an ulp, a value by one e4m3
    # step where it sits on a rounding boundary.
    np.testing.assert_allclose(got_s, want_s, rtol=1e-6)
    np.testing.assert_allclose(got_q, want_q.astype(np.float32), rtol=2.0**-3, atol=2.0**-9)


def test_dot_fp8_output_needs_a_static_beta():
  ops = testing.random_operands(9, 8, 128, 128, with_c=True)
  with pytest.raises(TypeError, match="static"):
    jax_fp8.blockwise_fp8_dot(*ops.args(), beta=jnp.float32(0.5), out_dtype=FP8)
