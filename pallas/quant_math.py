"""The 1x128 quantisation arithmetic, as kernels compute it in registers.

The same definition as jax_fp8's jnp quantisers (README, "Quantisation"):
amax of a group (NaN-propagating), scale = amax * float32(1/448) (1 for an
all-zero group), optionally instead the smallest power of two 2^e with
amax <= 448 * 2^e, and q = clip(x / scale, -448, 448) in float8_e4m3fn. A group
holding a NaN gets scale NaN, one holding an Inf (and no NaN) scale +Inf.

Every step is float32 arithmetic no compiler rewrites (a product by a
constant, exponent-bit masks, comparisons, products by powers of two, one
division by a non-constant), so kernels, interpret mode and the jnp reference
agree bit for bit, jitted or not. (XLA turns a division by the constant 448
into a product by its rounded reciprocal under jit but not eagerly: the
definition takes the product.)
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

E4M3_MAX = 448.0
INV_E4M3_MAX = np.float32(1.0 / E4M3_MAX)
FP8 = jnp.float8_e4m3fn
_MIN_NORMAL = np.float32(2.0**-126)
_EXPONENT_BITS = np.int32(0x7F800000)


def _floor_power_of_two(x):
  """2^floor(log2 x) for finite x >= 2^-126, by masking the mantissa bits."""
  return lax.bitcast_convert_type(
      lax.bitcast_convert_type(x, jnp.int32) & _EXPONENT_BITS, jnp.float32)


def power_of_two_scale(amax):
  """The smallest power of two p with amax <= 448 * p (exact: 448 * p is exact)."""
  s = amax * INV_E4M3_MAX
  # Subnormal s: scale into the normal range, where the mantissa mask works.
  tiny = s < _MIN_NORMAL
  lift = np.float32(2.0**64)
  t = jnp.where(tiny, s * lift, s)
  p = _floor_power_of_two(t)
  p = jnp.where(p < t, p * 2, p)
  p = jnp.where(tiny, p * np.float32(2.0**-64), p)
  # s is within an ulp of amax / 448: settle the definition by exact compares.
  p = jnp.where(amax > E4M3_MAX * p, p * 2, p)
  p = jnp.where((amax <= E4M3_MAX * (p * 0.5)) & (p > 0), p * 0.5, p)
  return jnp.where(amax != amax, amax, p)   # NaN stays NaN


def scale_from_amax(amax, power_of_two: bool):
  """The scale of groups with these amax values (any shape, float32)."""
  scale = power_of_two_scale(amax) if power_of_two else amax * INV_E4M3_MAX
  # All-zero groups (and scales underflowing to 0) get scale 1; NaN stays NaN.
  return jnp.where(scale == 0, jnp.ones_like(scale), scale)


def quantize(x, scale):
  """x / scale clipped to e4m3's range and rounded to e4m3 (NaN stays NaN)."""
  return jnp.clip(x / scale, -E4M3_MAX, E4M3_MAX).astype(FP8)


def row_amax(x):
  """max |x| along the last axis, NaN-propagating (a hardware max drops NaNs)."""
  amax = jnp.max(jnp.abs(x), axis=-1)
  nans = jnp.sum(jnp.where(x != x, jnp.ones_like(x), jnp.zeros_like(x)), axis=-1)
  return jnp.where(nans > 0, jnp.full_like(amax, jnp.nan), amax)
