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
  s = _rows_div(amax, _constant_like(amax, E4M3_MAX), layout)
  return jnp.where(s < MIN_NORMAL, 1.0, s)  # NaN < x is false: NaN stays


def _constant_like(rows, value: float):
  """`value` in every row, computed from the bits of `rows` (>= 0 or NaN) so that the
  compiler cannot fold it into a constant operand (which div.rn.f32 does not take)."""
  bits = lax.bitcast_convert_type(rows, jnp.int32)
  return lax.bitcast_convert_type(
      lax.shift_right_logical(bits, 31) + np.float32(value).view(np.int32), jnp.float32)


def _rows_div(a, b, layout):
  """|a / b| rounded once, for one value per row (a, b in `layout`.reduce(1), non-constant).

  div.rn.f32 of a row layout does not compile (LLVM translation of its casts):
  divide the rows broadcast to an (rows, 8) array, the narrowest of the 2-D
  layout, and take a row's (equal) values back with a NaN-keeping max.
  """
  wide = (a.shape[0], 8)
  q = exact_div(lax.broadcast_in_dim(a, wide, [0]), lax.broadcast_in_dim(b, wide, [0]), layout)
  return as_amax(jnp.max(magnitude_bits(q), axis=1), jnp.float32)


# ---- division by a group's reciprocal (QuantizeConfig(division="reciprocal")) ----
#
# A div.rn.f32 per element is a multi-instruction sequence (a MUFU reciprocal, its
# refinement, a range check and a slow-path branch), and the row+column quantiser
# does two per element it reads. The group's divisor is shared, so take
# r = RN(1 / s) once per group and per element
#   q0 = RN(x * r);  rem = fma(q0, s, -x) (exact);  q = fma(-rem, r, q0)
# (Markstein's correction: q = RN(x / s)). tests/test_quantize_kernels.py checks the
# sequence against IEEE division for every pair of 16-bit mantissas and the exponents
# where subnormals appear: the FP8 results match everywhere once a group with
# s < 2^-60 is computed with x and s scaled by 2^64 (exact; else rem falls into
# float32's subnormals and loses bits). Float32 inputs (the GEMM epilogues' FP8
# outputs) cannot be checked exhaustively: they take the correction twice. The
# first leaves q within half an ulp plus 2^-23 ulp of x / s, a faithful rounding;
# from a faithful q, rem is exact and one more correction is RN(x / s) (Markstein's
# theorem: r within half an ulp of 1 / s). Power-of-two scales need no correction:
# x * (1 / s) is x / s exactly.
# The signs are arranged so that a zero x keeps its sign (x = -0 gives -0) and a
# group with scale Inf gives signed zeros for finite x (s_fma = 0 in the fma).

SMALL_SCALE = 2.0**-60    # groups below this divide in a domain scaled by 2^64
SMALL_SCALE_LIFT = 2.0**64


def _rows(row, shape):
  return lax.broadcast_in_dim(row, shape, [0])


def _pointwise_ptx(instrs, *args, layout):
  """Elementwise inline PTX on float32 arrays in `layout`: instrs(ptx) returns a function
  of one register of each arg, where ptx("op.f32") lifts a PTX instruction to registers."""
  @plgpu.inline_mgpu(arg_types=(layout,) * len(args),
                     return_type=plgpu.ShapeDtypeStruct(args[0].shape, jnp.float32, layout))
  def body(_, *arrays):
    return arrays[0]._pointwise(instrs(mgpu.FragmentedArray._lift_fast_instr), *arrays[1:])

  return body(*args)


def _markstein(x, scale_rows, layout, corrections: int = 1):
  """RN(x / s) per element, s = scale_rows (> 0, Inf or NaN) broadcast along rows;
  corrections: 1 for 16-bit x, 2 for float32 x (above)."""
  lift = jnp.where(scale_rows < SMALL_SCALE, SMALL_SCALE_LIFT, 1.0)
  s = scale_rows * lift                                   # exact (a power of two)
  if device.interpret_mode_active():  # XLA has no fma: its division, = the sequence's result
    return exact_div(x * _rows(lift, x.shape), _rows(s, x.shape), layout)
  r = _rows_div(_constant_like(s, 1.0), s, layout)       # RN(1 / s); 0 for Inf, NaN for NaN
  s_fma = jnp.where(s < jnp.inf, s, 0.0)                  # Inf: q = q0 (signed zeros)

  def seq(ptx):
    mul, fma = ptx("mul.rn.f32"), ptx("fma.rn.f32")

    def one(x, neg_lift, neg_r, s_fma):
      neg_x = mul(x, neg_lift)          # -x * lift, exact
      q = mul(neg_x, neg_r)             # RN(x * r)
      for _ in range(corrections):
        rem = fma(q, s_fma, neg_x)      # q * s - x, exact
        q = fma(rem, neg_r, q)          # RN(q - rem * r)
      return q
    return one

  return _pointwise_ptx(seq, x, _rows(-lift, x.shape), _rows(-r, x.shape),
                        _rows(s_fma, x.shape), layout=layout)


def _times_reciprocal(x, scale_rows, layout):
  """x / s for power-of-two s: x * (1 / s), exact (1 / s is a power of two, or 0, or NaN)."""
  if device.interpret_mode_active():
    return exact_div(x, _rows(scale_rows, x.shape), layout)
  r = _rows_div(_constant_like(scale_rows, 1.0), scale_rows, layout)
  return _pointwise_ptx(lambda ptx: ptx("mul.rn.f32"), x, _rows(r, x.shape), layout=layout)


def quantize_rows(v, scale_rows, layout, *, power_of_two: bool, division: str = "div_rn"):
  """FP8 of v / s, s one scale per row of v (scale_rows in `layout`.reduce(1)).

  division: "div_rn" (div.rn.f32 per element) or "reciprocal" (the group's
  reciprocal, above: one correction for 16-bit v, two for float32 v).
  """
  x = v.astype(jnp.float32)
  if division == "reciprocal" and power_of_two:
    q = _times_reciprocal(x, scale_rows, layout)
  elif division == "reciprocal":
    q = _markstein(x, scale_rows, layout, corrections=1 if np.dtype(v.dtype).itemsize == 2 else 2)
  else:
    q = exact_div(x, _rows(scale_rows, x.shape), layout)
  if device.interpret_mode_active():
    # The GPU's conversion (cvt.rn.satfinite.e4m3x2.f32) clamps to +-448 itself
    # (NaN stays NaN); ml_dtypes' would give NaN past 464.
    q = jnp.clip(q, -E4M3_MAX, E4M3_MAX)
  return q.astype(FP8)
