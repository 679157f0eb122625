"""Backend "pallas_sm100": the Blackwell kernel (pallas/blackwell.py) with its
tiling rule, in jax_fp8.backends' protocol."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jax_fp8.pallas import blackwell
from jax_fp8.pallas.blackwell import BlackwellConfig
from jax_fp8.pallas.common import C_DTYPES, SCALE_N, SMEM_BYTES, unsupported_reason

__all__ = ["blockwise_fp8_dot", "default_config", "glu", "masked_dot", "ragged_dot",
           "unsupported_reason"]


def default_config(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16,
                   c_dtype=None, exact_rows: bool = False) -> BlackwellConfig:
  """128 x 128 tiles (the register accumulator is tile_n floats per thread), as
  many input stages as fit in SMEM (<= 6); untuned (no Blackwell to measure).
  A float32 output piece needs twice the registers and SMEM of a bf16 one, so
  its pieces are half as wide (compiled for sm_100a: no spills either way).
  exact_rows: for the ragged GEMM (its row-exact stores take SMEM)."""
  del m, n, k
  cfg = BlackwellConfig(epi_tile_n=32 if np.dtype(out_dtype) == np.dtype(jnp.float32) else 64)
  return _fit(cfg, out_dtype, c_dtype, exact_rows)


def _fit(cfg: BlackwellConfig, out_dtype, c_dtype, exact_rows=False) -> BlackwellConfig:
  """cfg with as many input stages as fit in SMEM (2 to 6)."""
  stages = 6
  while stages > 2 and dataclasses.replace(cfg, input_stages=stages).smem_bytes(
      out_dtype, c_dtype, exact_rows) > SMEM_BYTES:
    stages -= 1
  return dataclasses.replace(cfg, input_stages=stages)


def _c_dtype(c):
  if c is None:
    return None
  return np.dtype(c.dtype) if np.dtype(c.dtype) in C_DTYPES else np.dtype(np.float32)


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta, out_dtype, b_scale_rows=SCALE_N,
                      power_of_two_scales=False, config: BlackwellConfig | None = None):
  """2-D blockwise FP8 matmul on a Blackwell GPU (or in GPU interpret mode)."""
  cfg = config or default_config(a.shape[0], b.shape[0], a.shape[1], out_dtype=out_dtype,
                                 c_dtype=_c_dtype(c))
  return blackwell.blockwise_fp8_dot(a, a_scale, b, b_scale, c, beta=beta, out_dtype=out_dtype,
                                     b_scale_rows=b_scale_rows,
                                  power_of_two_scales=power_of_two_scales, config=cfg)


def ragged_dot(a, a_scale, b, b_scale, group_sizes, *, out_dtype,
               config: BlackwellConfig | None = None):
  """Grouped rows of a [M, K] times b [G, N, K] (see blackwell.ragged_dot)."""
  cfg = config or default_config(a.shape[0], b.shape[1], a.shape[1], out_dtype=out_dtype,
                                 exact_rows=True)
  return blackwell.ragged_dot(a, a_scale, b, b_scale, group_sizes, out_dtype=out_dtype,
                              config=cfg)


def masked_dot(a, a_scale, b, b_scale, masked_m, *, out_dtype,
               config: BlackwellConfig | None = None, expected_m: int | None = None):
  """G masked GEMMs a [G, M, K] times b [G, N, K] (see blackwell.masked_dot);
  expected_m (a Hopper tiling hint) is not used: the Blackwell tiling takes none."""
  del expected_m
  cfg = config or default_config(a.shape[1], b.shape[1], a.shape[2], out_dtype=out_dtype)
  return blackwell.masked_dot(a, a_scale, b, b_scale, masked_m, out_dtype=out_dtype,
                              config=cfg)


def glu(a, a_scale, b, b_scale, *, activation: str, out_dtype, power_of_two_scales=False,
        config: BlackwellConfig | None = None):
  """A fused GLU, act(a @ gate.T) * (a @ up.T), b [2F, K] = [gate; up] (see blackwell.glu)."""
  cfg = config or dataclasses.replace(
      default_config(a.shape[0], b.shape[0], a.shape[1], out_dtype=out_dtype), tile_n=256)
  cfg = _fit(cfg, out_dtype, None)
  return blackwell.glu(a, a_scale, b, b_scale, activation=activation, out_dtype=out_dtype,
                       power_of_two_scales=power_of_two_scales, config=cfg)
