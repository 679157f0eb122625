"""The 1x128 quantisation arithmetic, as every kernel computes it in registers.

The quantisers (pallas/quantize.py) and the FP8 output epilogues (hopper.py,
blackwell.py) share it, and it is the definition jax_fp8's jnp quantisers
follow bit for bit (README, "Quantisation"):

  amax = max |x| over the group, NaN-propagating;
  scale = amax / 448 rounded once to float32; a scale below float32's normal
    range (all zeros, or amax / 448 < 2^-126) is 1;
  power_of_two_scales: the smallest power of two 2^e >= 2^-126 with
    amax <= 448 * 2^e, by exponent arithmetic (all zeros: 1);
  q = float8_e4m3fn(clip(x / scale, -448, 448)), x / scale rounded once.

So a group holding a NaN gets scale NaN (its q are NaN), one holding an Inf but
no NaN gets scale Inf (its finite q are 0, the Inf ones NaN).

Exact arithmetic: Mosaic GPU compiles float32 `/` to PTX `div.full.f32` (an
approximation within 2 ulp), so compiled kernels divide with `div.rn.f32` in
inline PTX; in GPU interpret mode (XLA on the CPU) the division is XLA's, the
divisor behind an optimisation barrier (XLA rewrites a / broadcast(b) into
a * (1 / b), two roundings). The amax is an integer max of the magnitude bits:
NaN-propagating and subnormal-aware on every platform (a hardware or XLA float
max can drop NaN, and XLA's CPU code flushes subnormals).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import device

E4M3_MAX = 448.0      # largest finite float8_e4m3fn
FP8 = jnp.float8_e4m3fn
MIN_NORMAL = float(np.finfo(np.float32).tiny)   # 2^-126


def exact_div(a, b, layout):
  """a / b rounded once to float32 (round to nearest even), elementwise.

  a, b: float32 arrays of one shape, in `layout`.
  """
  if device.interpret_mode_active():
    # XLA's algebraic simplifier rewrites a / broadcast(b) (and a / constant)
    # into a * (1 / b), which rounds twice; the barrier hides the broadcast.
    return a / lax.optimization_barrier(b)

  @plgpu.inline_mgpu(arg_types=(layout, layout),
                     return_type=plgpu.ShapeDtypeStruct(a.shape, jnp.float32, layout))
  def div_rn(_, a, b):
    # Mosaic lowers `/` to div.full.f32 (within 2 ulp); div.rn.f32 is IEEE's.
    return a._pointwise(mgpu.FragmentedArray._lift_fast_instr("div.rn.f32"), b)

  return div_rn(a, b)


def magnitude_bits(v):
  """|v| as same-width integers: float magnitudes order like their bit patterns, and
  every NaN's lies above Inf's, so an integer max is a NaN-propagating amax that
  sees subnormals on every platform."""
  int_type = {2: jnp.int16, 4: jnp.int32}[np.dtype(v.dtype).itemsize]
  sign_off = (1 << (8 * np.dtype(v.dtype).itemsize - 1)) - 1
  return lax.bitcast_convert_type(v, int_type) & sign_off


def as_amax(bits, dtype):
  """The float32 amax of magnitude bits of `dtype` (exact)."""
  return lax.bitcast_convert_type(bits, dtype).astype(jnp.float32)


def row_amax(v):
  """max |v| along the last axis (float32), NaN-propagating."""
  return as_amax(jnp.max(magnitude_bits(v), axis=-1), v.dtype)


def _pow2_scale(amax):
  """The smallest power of two 2^e >= 2^-126 with amax <= 448 * 2^e (finite amax)."""
  bits = lax.bitcast_convert_type(amax, jnp.int32)
  # amax = 1.m * 2^E and 448 = 1.75 * 2^8: e = E - 8, or E - 7 if 1.m > 1.75; the
  # same in biased exponents. A subnormal amax (biased 0) ends at the clamp.
  biased = (lax.shift_right_logical(bits, 23) - 8
            + jnp.where((bits & 0x7FFFFF) > 0x600000, 1, 0))
  scale = lax.bitcast_convert_type(lax.shift_left(jnp.maximum(biased, 1), 23), jnp.float32)
  return jnp.where(bits == 0, 1.0, scale)


def scale(amax, power_of_two: bool, layout):
  """The float32 group scale of each amax (NaN and Inf pass through).

  amax: one value per row, in `layout`.reduce(1) (layout: the rows' 2-D register
  layout, plgpu.Layout.WGMMA or TCGEN05).
  """
  if power_of_two:
    return jnp.where(amax < jnp.inf, _pow2_scale(amax), amax)  # amax >= 0: NaN, Inf fail
  # div.rn.f32 of a row layout, or of a constant (splat) operand, does not
  # compile (LLVM translation of their casts): divide the rows broadcast to an
  # (rows, 8) array, the narrowest of the 2-D layout, by a 448 computed from
  # amax's bits (the compiler cannot fold it into a constant), and take a row's
  # (equal) values back with a NaN-keeping max.
  bits = lax.bitcast_convert_type(amax, jnp.int32)   # amax >= 0: the sign bit is 0
  e4m3_max = lax.bitcast_convert_type(
      lax.shift_right_logical(bits, 31) + np.float32(E4M3_MAX).view(np.int32), jnp.float32)
  wide = lax.broadcast_in_dim(amax, (amax.shape[0], 8), [0])
  s = exact_div(wide, lax.broadcast_in_dim(e4m3_max, wide.shape, [0]), layout)
  s = as_amax(jnp.max(magnitude_bits(s), axis=1), jnp.float32)
  return jnp.where(s < MIN_NORMAL, 1.0, s)  # NaN < x is false: NaN stays


def quantize(v, scale_, layout):
  """FP8 of v / scale_ (scale_ broadcast to v's shape, both in `layout`)."""
  q = exact_div(v.astype(jnp.float32), scale_, layout)
  if device.interpret_mode_active():
    # The GPU's conversion (cvt.rn.satfinite.e4m3x2.f32) clamps to +-448 itself
    # (NaN stays NaN); ml_dtypes' would give NaN past 464.
    q = jnp.clip(q, -E4M3_MAX, E4M3_MAX)
  return q.astype(FP8)
