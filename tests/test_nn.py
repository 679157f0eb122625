"""jax_fp8.nn.Linear (Flax NNX): a drop-in for nnx.Linear computing with jax_fp8.dense.

Parameter layout and initialisation identical to nnx.Linear's; the output is
jax_fp8.dense's plus the bias; gradients through nnx transforms; flax stays
optional (`import jax_fp8` never imports it; jax_fp8.nn without it names the
extra); a 2-layer MLP trained with it ends within a few percent of the same
model in bf16 (benchmarks/train_mlp.py, small).
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")

import jax_fp8  # noqa: E402
import jax_fp8.nn  # noqa: E402
from jax_fp8 import testing  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import train_mlp  # noqa: E402

F32, BF16 = jnp.float32, jnp.bfloat16


def _shapes_and_dtypes(module):
  return jax.tree.map(lambda v: (v.shape, v.dtype), nnx.state(module))


@pytest.mark.parametrize("kwargs", [{}, dict(use_bias=False), dict(param_dtype=BF16),
                                    dict(kernel_init=nnx.initializers.ones_init(),
                                         bias_init=nnx.initializers.constant(0.5))])
def test_parameters_match_nnx_linear(kwargs):
  ours = jax_fp8.nn.Linear(300, 200, rngs=nnx.Rngs(0), **kwargs)
  theirs = nnx.Linear(300, 200, rngs=nnx.Rngs(0), **kwargs)
  assert isinstance(ours, nnx.Linear)
  assert str(_shapes_and_dtypes(ours)) == str(_shapes_and_dtypes(theirs))
  for a, b in zip(jax.tree.leaves(nnx.state(ours)), jax.tree.leaves(nnx.state(theirs))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same initialisation
  # Checkpoints carry over: nnx.Linear's state loads into ours.
  nnx.update(ours, nnx.state(theirs))


@pytest.mark.parametrize("dtype,preferred,want", [(None, None, F32), (BF16, None, BF16),
                                                  (BF16, F32, F32)])
def test_output_is_dense_plus_bias(dtype, preferred, want):
  layer = jax_fp8.nn.Linear(260, 140, dtype=dtype, preferred_element_type=preferred,
                            bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(1))
  x = jax.random.normal(jax.random.key(2), (2, 33, 260), F32)
  y = nnx.jit(lambda m, x: m(x))(layer, x)
  assert y.shape == (2, 33, 140) and y.dtype == want
  cdt = dtype or F32
  expect = jax.jit(lambda x, k, b: jax_fp8.dense(x.astype(cdt), k.astype(cdt), out_dtype=want)
                   + b.astype(cdt).astype(want))(x, layer.kernel[...], layer.bias[...])
  np.testing.assert_array_equal(np.asarray(y.astype(F32)), np.asarray(expect.astype(F32)))
  # Within FP8's error of nnx.Linear (and not nnx.Linear itself).
  ref = nnx.Linear(260, 140, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(1),
                   precision="highest")(x)
  err = testing.rel_error(y, np.asarray(ref, np.float64))
  assert 1e-3 < err < 0.05, err


def test_gradients_through_nnx_transforms_are_dense_gradients():
  layer = jax_fp8.nn.Linear(256, 128, rngs=nnx.Rngs(3))
  x = jax.random.normal(jax.random.key(4), (64, 256), F32)
  dy = jax.random.normal(jax.random.key(5), (64, 128), F32)

  @nnx.jit
  def grads(layer, x):
    return nnx.grad(lambda m: jnp.sum(m(x) * dy))(layer)
  g = grads(layer, x)
  _, dk = jax.jit(lambda x, k: jax.vjp(jax_fp8.dense, x, k)[1](dy))(x, layer.kernel[...])
  testing.assert_close(g["kernel"][...], np.asarray(dk, np.float64), F32)
  testing.assert_close(g["bias"][...], np.asarray(dy, np.float64).sum(0), F32)


def test_custom_dot_general_and_out_sharding_are_refused():
  with pytest.raises(ValueError, match="custom dot_general"):
    jax_fp8.nn.Linear(8, 8, dot_general=lambda *a, **k: None, rngs=nnx.Rngs(0))
  layer = jax_fp8.nn.Linear(8, 8, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="out_sharding is not supported"):
    layer(jnp.ones((2, 8)), out_sharding=object())
  with pytest.raises(TypeError, match="bfloat16 or float32"):
    jax_fp8.nn.Linear(8, 8, dtype=jnp.float16, rngs=nnx.Rngs(0))(jnp.ones((2, 8)))


def _python(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # conftest's 8 virtual devices are not wanted here
  return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_flax_is_optional():
  # import jax_fp8 does not import flax; without flax, jax_fp8.nn names the extra.
  code = ("import sys; sys.modules['flax'] = None\n"
          "import jax_fp8\n"
          "assert not any(m == 'flax' or m.startswith('flax.') for m in sys.modules "
          "if sys.modules[m] is not None)\n"
          "try:\n"
          "  import jax_fp8.nn\n"
          "except ImportError as e:\n"
          "  print('ImportError:', e)\n")
  proc = _python("-c", code)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "pip install 'jax_fp8[flax]'" in proc.stdout


def test_mlp_trains_like_bf16(tmp_path):
  # benchmarks/train_mlp.py on a small model: its JSON has both loss curves.
  out = tmp_path / "mlp.json"
  proc = _python("benchmarks/train_mlp.py", "--steps=300", "--batch=128", "--in_features=128",
                 "--hidden=256", "--out_features=32", "--train_size=4096", "--eval_size=1024",
                 "--eval_every=150", f"--json_out={out}", f"--png_out={tmp_path / 'mlp.png'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "FP8 / bf16 final held-out loss" in proc.stdout
  assert (tmp_path / "mlp.png").exists() or "pip install '.[plot]'" in proc.stdout
  result = json.loads(out.read_text())
  fp8, bf16 = result["fp8"], result["bf16"]
  assert len(fp8["train_loss"]) == len(bf16["train_loss"]) == 300
  assert fp8["eval_steps"] == [150, 300]
  assert fp8["final_eval_loss"] < 0.3 * fp8["train_loss"][0]  # it did learn
  # Measured 1.006-1.007 over three seeds.
  assert abs(result["fp8_over_bf16"] - 1) < 0.03, result["fp8_over_bf16"]
