"""Flax NNX layers that compute in FP8: `Linear`, a drop-in for `flax.nnx.Linear`.

Needs flax, an optional extra: `pip install 'jax_fp8[flax]'`. `import jax_fp8`
never imports this module (nor flax).
"""
from __future__ import annotations

try:
  from flax import nnx
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
  raise ImportError("jax_fp8.nn needs flax, an optional extra of jax_fp8: "
                    "pip install 'jax_fp8[flax]' (or pip install flax)") from e

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_fp8.dense import DTYPES, dense


class Linear(nnx.Linear):
  """`nnx.Linear` whose matmul is `jax_fp8.dense` (FP8, DeepSeek-V3's training recipe).

  Same constructor arguments, parameters (`kernel` [in_features, out_features],
  `bias` [out_features]) and initialisers as `nnx.Linear`, so a model switches
  by replacing the class and checkpoints carry over. The inputs, kernel and
  bias are promoted to `dtype` as nnx.Linear does (`promote_dtype`); the
  computation dtype must be bfloat16 or float32. The product is returned in
  `preferred_element_type` if given, else in the computation dtype; the bias is
  added after it, in that dtype.

  FP8 fixes the matmul's precision: `precision` is accepted for compatibility
  and has no effect. A custom `dot_general` cannot be honoured and is refused.
  """

  def __init__(self, in_features: int, out_features: int, *args, **kwargs):
    dot_general = kwargs.get("dot_general", lax.dot_general)
    if dot_general is not lax.dot_general:
      raise ValueError("jax_fp8.nn.Linear computes its matmul with jax_fp8.dense; a custom "
                       f"dot_general ({dot_general!r}) cannot be used with it")
    super().__init__(in_features, out_features, *args, **kwargs)

  def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
    if out_sharding is not None:
      raise ValueError("jax_fp8.nn.Linear: out_sharding is not supported; the output is "
                       "sharded like the matmul's operands (jax_fp8.dense's sharding rules)")
    kernel = self.kernel[...]
    bias = self.bias[...] if self.bias is not None else None
    inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
    if np.dtype(inputs.dtype) not in DTYPES:
      raise TypeError(f"jax_fp8.nn.Linear computes in bfloat16 or float32, got {inputs.dtype} "
                      "(set dtype= or param_dtype= to one of them)")
    out_dtype = self.preferred_element_type or inputs.dtype
    y = dense(inputs, kernel, out_dtype=out_dtype)
    if bias is not None:
      y = y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,)).astype(y.dtype)
    return y
