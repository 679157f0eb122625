"""Argument checks every operation shares: the FP8 operands and their scales,
the output dtype and the backend name. Each raises TypeError / ValueError
naming the argument and the rule."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_fp8 import backends
from jax_fp8.blocks import FP8


def operand_dtypes(a, a_scale, b, b_scale):
  """a, b float8_e4m3fn; a_scale, b_scale float32."""
  for name, x, dtype in (("a", a, FP8), ("b", b, FP8), ("a_scale", a_scale, jnp.float32),
                         ("b_scale", b_scale, jnp.float32)):
    if np.dtype(x.dtype) != np.dtype(dtype):
      raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {x.dtype}")


def out_dtype(out_dtype, allowed: tuple, names: str) -> np.dtype:
  """out_dtype as a numpy dtype, if it is one of `allowed` (described by `names`)."""
  try:
    dtype = np.dtype(out_dtype)
  except TypeError:
    dtype = None
  if dtype not in allowed:
    raise TypeError(f"out_dtype must be {names}, got {out_dtype}")
  return dtype


def backend(name):
  if name not in backends.NAMES:
    raise ValueError(f"backend must be one of {backends.NAMES}, got {name!r}")
