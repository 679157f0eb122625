"""Backend "pallas_sm90": the Hopper kernel (pallas/hopper.py) with its tiling
rules (pallas/hopper_tiling.py), in jax_fp8.backends' protocol."""
from __future__ import annotations

import numpy as np

from jax_fp8.pallas import hopper, hopper_tiling, quantize
from jax_fp8.pallas.common import FP8_OUT, SCALE_N, gate_activation, unsupported_reason

__all__ = ["blockwise_fp8_dot", "glu", "masked_dot", "ragged_dot", "unsupported_reason"]


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype, b_scale_rows=SCALE_N,
                      power_of_two_scales=False, config: hopper.HopperConfig | None = None):
  """2-D blockwise FP8 matmul on a Hopper GPU (or in GPU interpret mode)."""
  m, k = a.shape
  n = b.shape[0]
  if (config is None and np.dtype(out_dtype) == FP8_OUT
      and hopper_tiling.fp8_output_quantized_after(m, n, k, b_scale_rows=b_scale_rows)):
    # Up to 1024 rows the fused epilogue's tiles may leave SMs idle: the float32
    # result of the bf16 rules' tiling, quantised by the same arithmetic after it.
    out = blockwise_fp8_dot(a, a_scale, b, b_scale, c, beta=beta, out_dtype=np.float32,
                            b_scale_rows=b_scale_rows)
    return quantize.quantize_1x128(out, power_of_two_scales=power_of_two_scales)
  c_dtype = None if c is None else np.dtype(c.dtype)
  if c_dtype is not None and c_dtype not in hopper.C_DTYPES:
    c_dtype = np.dtype(np.float32)
  cfg = config or hopper_tiling.config_for(m, n, k, out_dtype=out_dtype,
                                           c_dtype=c_dtype, b_scale_rows=b_scale_rows)
  return hopper.blockwise_fp8_dot(a, a_scale, b, b_scale, c, beta=beta, out_dtype=out_dtype,
                                  b_scale_rows=b_scale_rows,
                                  power_of_two_scales=power_of_two_scales, config=cfg)


def ragged_dot(a, a_scale, b, b_scale, group_sizes, *, out_dtype,
               config: hopper.HopperConfig | None = None):
  """Grouped rows of a [M, K] times b [G, N, K] (see hopper.ragged_dot)."""
  m, k = a.shape
  cfg = config or hopper_tiling.default_config(m, b.shape[1], k, out_dtype=out_dtype,
                                               groups=b.shape[0], grouped=True, row_masks=True)
  return hopper.ragged_dot(a, a_scale, b, b_scale, group_sizes, out_dtype=out_dtype, config=cfg)


def masked_dot(a, a_scale, b, b_scale, masked_m, *, out_dtype,
               config: hopper.HopperConfig | None = None, expected_m: int | None = None):
  """G masked GEMMs a [G, M, K] times b [G, N, K] (see hopper.masked_dot);
  expected_m: the rows a group is expected to hold (the default config's hint)."""
  g, m, k = a.shape
  cfg = config or hopper_tiling.default_config(m, b.shape[1], k, out_dtype=out_dtype,
                                               groups=g, grouped=True, expected_m=expected_m)
  return hopper.masked_dot(a, a_scale, b, b_scale, masked_m, out_dtype=out_dtype, config=cfg)


def glu(a, a_scale, b, b_scale, *, activation: str, out_dtype, power_of_two_scales=False,
        config: hopper.HopperConfig | None = None):
  """A fused GLU, act(a @ gate.T) * (a @ up.T), b [2F, K] = [gate; up] (see hopper.glu)."""
  (m, k), f = a.shape, b.shape[0] // 2
  if config is None and hopper_tiling.glu_unfused(m, f, k):
    # At decode the fused tiles (256 weight rows each) leave a tail wave: the
    # gate|up GEMM's float32 result with the dense rules' tiles, then the same
    # activation in XLA.
    out = blockwise_fp8_dot(a, a_scale, b, b_scale, None, beta=1.0, out_dtype=np.float32)
    h = gate_activation(activation, out[:, :f]) * out[:, f:]
    if np.dtype(out_dtype) == FP8_OUT:
      return quantize.quantize_1x128(h, power_of_two_scales=power_of_two_scales)
    return h.astype(out_dtype)
  cfg = config or hopper_tiling.glu_config(m, f, k, out_dtype=out_dtype)
  return hopper.glu(a, a_scale, b, b_scale, activation=activation, out_dtype=out_dtype,
                    power_of_two_scales=power_of_two_scales, config=cfg)
