"""Backend "pallas_sm90": the Hopper kernel (pallas/hopper.py) with its tiling
rules (pallas/hopper_tiling.py), in jax_fp8.backends' protocol."""
from __future__ import annotations

import numpy as np

from jax_fp8.pallas import hopper, hopper_tiling
from jax_fp8.pallas.common import SCALE_N, unsupported_reason

__all__ = ["blockwise_fp8_dot", "unsupported_reason"]


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype, b_scale_rows=SCALE_N,
                      config: hopper.HopperConfig | None = None):
  """2-D blockwise FP8 matmul on a Hopper GPU (or in GPU interpret mode)."""
  m, k = a.shape
  c_dtype = None if c is None else np.dtype(c.dtype)
  if c_dtype is not None and c_dtype not in hopper.C_DTYPES:
    c_dtype = np.dtype(np.float32)
  cfg = config or hopper_tiling.config_for(m, b.shape[0], k, out_dtype=out_dtype,
                                           c_dtype=c_dtype, b_scale_rows=b_scale_rows)
  return hopper.blockwise_fp8_dot(a, a_scale, b, b_scale, c, beta=beta, out_dtype=out_dtype,
                                  b_scale_rows=b_scale_rows, config=cfg)
