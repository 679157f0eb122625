"""Fused FP8 quantisers in Pallas Mosaic GPU (Hopper sm_90a; Blackwell sm_100a).

    quantize_1x128(x [T, K])                -> q [T, K] e4m3, s [T, ceil(K/128)] f32
    quantize_1x128_with_transpose(x [T, K]) -> q, s, q_t [K, T] e4m3, s_t [K, ceil(T/128)] f32
    quantize_128x128(w [N, K])              -> q [N, K] e4m3, s [ceil(N/128), ceil(K/128)] f32
        with_transpose=True: also q_t [K, N] e4m3, s_t = s^T [ceil(K/128), ceil(N/128)]

The row-wise groups are 128 consecutive elements of a row; the column-wise
groups (q_t) are 128 consecutive rows (tokens) of one column, stored
transposed so that the weight-gradient GEMM reads K-major operands; a 128x128
block grid is transpose-invariant, so q_t of a weight shares its blocks' scales.

Semantics (jax_fp8's quantiser decisions; scales bitwise, q bitwise):
  amax = max |x| over the group, NaN-propagating;
  scale = amax / 448 rounded once to float32; a scale below float32's normal
    range (all zeros, or amax / 448 < 2^-126) -> 1;
  power_of_two_scales: the smallest power of two 2^e >= 2^-126 with
    amax <= 448 * 2^e, by exponent arithmetic (all zeros -> 1);
  q = float8_e4m3fn(clip(x / scale, -448, 448)) with x / scale rounded once.
So a group holding a NaN gets scale NaN (its q are NaN), one holding an Inf
but no NaN gets scale Inf (its finite q are 0, the Inf ones NaN).

Structure: one tile of x per CTA, one warpgroup (memory-bound: no tensor
cores, nothing Hopper-only, so the same kernel serves Blackwell). The CTA
loads its (tile_rows, tile_cols) tile with one TMA, then:
- the row pass quantises it in (64, 128) register chunks (one group per row
  of a chunk; the amax is a reduction inside each 4-lane quad) into an FP8
  SMEM tile, which leaves by TMA while
- the transposed pass loads the transposed view of the same SMEM tile
  (64 columns x 128 rows, again one group per row of the chunk) and
  quantises it into a second FP8 tile, stored by TMA at the transposed
  position. (A transposed FP8 SMEM write does not lower; a transposed bf16
  read does.)
Scales go from registers straight to GMEM (a 4-byte column per chunk: too
narrow for TMA, 1/64 of the bytes). Several CTAs per SM (48-64 KiB of SMEM each
for bf16) keep enough loads in flight; there is no pipeline inside a CTA.

Bytes per element (bf16 in): 2 read + 1 written per FP8 copy + 4/128 per
scale; the benchmark (benchmarks/quantize.py) counts them and compares with a
device-to-device copy of the input.

Edges: TMA needs every GMEM dimension to be a multiple of its SMEM tile (or
smaller), so a shape that is not a multiple of the CTA tile is zero-padded
(exact: zeros change no amax, and padded groups' outputs are sliced off). The
row-wise quantiser pads rows only to whole 8-row tiles (not at all up to 8):
its last row tile loads and stores only x's rows (an XLA pad of x is a copy
of it, as long as the quantiser).

Exact arithmetic: Mosaic GPU compiles float32 `/` to PTX `div.full.f32` (an
approximation within 2 ulp), so the compiled kernels divide with
the group's correctly rounded reciprocal with one two-FMA correction per element
(two for float32 inputs; QuantizeConfig(division="reciprocal"), the default: the same FP8 values as
`div.rn.f32` in inline PTX, division="div_rn", at a fraction of the
instructions: quant_math.quantize_rows).
In GPU interpret mode (XLA on the CPU) the
division is XLA's, with the divisor behind an optimisation barrier (XLA
rewrites a / broadcast(b) into a * (1 / b), two roundings). The amax is an
integer max of the magnitude bits (NaN-propagating, subnormals included, on
every platform). XLA's CPU code flushes subnormal inputs of x / scale to zero,
so interpret mode cannot show a group whose subnormal elements quantise to
nonzero FP8 (amax below about 448 * 2^-116); the GPU tests do.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import device, quant_math
from jax_fp8.pallas.common import for_row_tile_box, short_box_padded_rows

GROUP = 128           # elements of one scale group (row-wise and column-wise); block edge
E4M3_MAX = 448.0      # largest finite float8_e4m3fn
FP8 = jnp.dtype(jnp.float8_e4m3fn)
IN_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(jnp.float32))
MIN_NORMAL = float(np.finfo(np.float32).tiny)   # 2^-126
SMEM_BYTES = 227 * 1024
CHUNK = 64            # rows of one register chunk (a warpgroup array in the WGMMA layout)
OPS = ("quantize_1x128", "quantize_1x128_with_transpose", "quantize_128x128")
DIVISIONS = ("div_rn", "reciprocal")

_CHUNK_LAYOUT = plgpu.Layout.WGMMA
_ROW_LAYOUT = plgpu.Layout.WGMMA.reduce(1)   # one value per row of a chunk


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _num_groups(n: int) -> int:
  return -(-n // GROUP)


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
  """The CTA's tile of x: tile_rows x tile_cols elements (TMA boxes <= 256).

  Row-wise groups need tile_cols to be a multiple of 128 and column-wise
  groups tile_rows; 64-row tiles exist for the row-wise kernel only (small T).
  quantize_128x128 takes 128 x 128 (one block per CTA).

  division: how x / scale is computed (the result is the same, bitwise):
  "div_rn", a div.rn.f32 per element; "reciprocal", the group's correctly
  rounded reciprocal and a two-FMA correction per element, or a product alone
  for power-of-two scales (quant_math.quantize_rows; float32 inputs take the
  correction twice).
  """
  tile_rows: int = 128
  tile_cols: int = 128
  division: str = "reciprocal"

  def check(self, op: str, dtype) -> None:
    """Raises ValueError naming the field if this tiling cannot run `op` on `dtype`."""
    if op not in OPS:
      raise ValueError(f"op must be one of {OPS}, got {op!r}")
    rows, cols = self.tile_rows, self.tile_cols
    if self.division not in DIVISIONS:
      raise ValueError(f"division must be one of {DIVISIONS}, got {self.division!r}")
    if op == "quantize_128x128":
      if (rows, cols) != (GROUP, GROUP):
        raise ValueError(f"quantize_128x128 takes 128 x 128 tiles (one block per CTA), got "
                         f"tile_rows={rows}, tile_cols={cols}")
    else:
      row_unit = GROUP if op == "quantize_1x128_with_transpose" else CHUNK
      if rows % row_unit or not row_unit <= rows <= 256:
        raise ValueError(f"tile_rows={rows} must be a multiple of {row_unit} in "
                         f"[{row_unit}, 256] for {op}")
      if cols % GROUP or not GROUP <= cols <= 256:
        raise ValueError(f"tile_cols={cols} must be 128 or 256 for {op}")
    need = self.smem_bytes(op, dtype)
    if need > SMEM_BYTES:
      raise ValueError(f"a {rows} x {cols} tile of {np.dtype(dtype).name} needs {need} bytes "
                       f"of SMEM for {op}, more than the {SMEM_BYTES} available")

  def smem_bytes(self, op: str, dtype) -> int:
    tile = self.tile_rows * self.tile_cols
    fp8_tiles = 2 if op == "quantize_1x128_with_transpose" else 1
    return tile * np.dtype(dtype).itemsize + fp8_tiles * tile + 1024  # + barrier, slack


def default_config(op: str, t: int) -> QuantizeConfig:
  """128 x 128 tiles; 64-row tiles for row-wise quantisation of at most 64 rows."""
  if op == "quantize_1x128" and t <= CHUNK:
    return QuantizeConfig(tile_rows=CHUNK, tile_cols=GROUP)
  return QuantizeConfig()


def unsupported_reason(op: str, shape, dtype, **_) -> str | None:
  """Why these kernels cannot take this call (2-D x of `shape`), or None."""
  if op not in OPS:
    return f"no Pallas kernel for {op!r}"
  if np.dtype(dtype) not in IN_DTYPES:
    return f"input dtype must be bfloat16, float16 or float32, got {np.dtype(dtype).name}"
  if len(shape) != 2:
    return f"the kernels take 2-D arrays, got shape {tuple(shape)}"
  if min(shape) < 1:
    return "empty array"
  if max(shape) >= 2**31:
    return "dimensions must fit in int32"
  return None


# ---- the kernel ------------------------------------------------------------------

def _smem_transforms(dtype, cols: int):
  """Tiling + swizzle of a (rows, cols) SMEM tile of `dtype` (TMA and register loads)."""
  swizzle = plgpu.find_swizzle(cols * np.dtype(dtype).itemsize * 8)
  return (plgpu.TilingTransform((8, swizzle // np.dtype(dtype).itemsize)),
          plgpu.SwizzleTransform(swizzle))


def _kernel(x_gmem, *refs, op: str, pow2: bool, rows: int, cols: int, col_tiles: int,
            transpose: bool, division: str, short_rows: bool):
  n_out = 4 if transpose else 2
  outs, scratch = refs[:n_out], refs[n_out:]
  q_gmem, s_gmem = outs[:2]
  qt_gmem, st_gmem = outs[2:] if transpose else (None, None)
  x_smem, q_smem = scratch[:2]
  qt_smem = scratch[2] if transpose else None
  barrier = scratch[-1]

  # Tiles in row-major order: consecutive CTAs read neighbouring columns of the
  # same rows (and write neighbouring scales of them).
  ti, ki = lax.div(lax.axis_index("tile"), col_tiles), lax.rem(lax.axis_index("tile"), col_tiles)
  r0, c0 = ti * rows, ki * cols

  def row_boxes(body):
    """body(box rows): a whole tile, or (short_rows) only x's rows of its last
    row tile (the SMEM rows past them hold garbage, and so do their row-wise
    groups' outputs, which are never stored: their q past x's rows, their
    scales sliced off)."""
    if short_rows:
      for_row_tile_box(x_gmem.shape[0], rows, r0, body)
    else:
      body(rows)

  def load(box):
    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(r0, box), pl.ds(c0, cols)],
                            x_smem if box == rows else x_smem.at[pl.ds(0, box)], barrier)
  row_boxes(load)
  plgpu.barrier_wait(barrier)

  # Register chunks: (x_smem window, q_smem window) of the row pass; of the
  # transposed pass, the window of x is read transposed.
  row_chunks = [(pl.ds(h, CHUNK), pl.ds(g, GROUP))
                for h in range(0, rows, CHUNK) for g in range(0, cols, GROUP)]
  col_chunks = [(pl.ds(g, GROUP), pl.ds(h, CHUNK))
                for h in range(0, cols, CHUNK) for g in range(0, rows, GROUP)]

  if op == "quantize_128x128":
    # One block per CTA: its scale first (each row's amax, then over rows).
    row_bits = None
    for r, c in row_chunks:
      v = plgpu.load(x_smem.at[r, c], layout=_CHUNK_LAYOUT)
      bits = jnp.max(quant_math.magnitude_bits(v), axis=1)
      row_bits = bits if row_bits is None else jnp.maximum(row_bits, bits)
    # The scale arithmetic runs on arrays (inline PTX and bitcasts take no
    # scalars): the block's amax in every row of a chunk-row vector.
    block_bits = plgpu.layout_cast(jnp.full((CHUNK,), jnp.max(row_bits)), _ROW_LAYOUT)
    block_scale = quant_math.scale(quant_math.as_amax(block_bits, x_smem.dtype), pow2,
                                   _CHUNK_LAYOUT)
    scale_value = jnp.max(block_scale)  # all equal; max.NaN keeps a NaN
    if device.interpret_mode_active():
      # XLA's CPU max reduction can drop NaN.
      scale_value = jnp.where(jnp.isnan(block_scale).any(), jnp.nan, scale_value)
    s_gmem[ti, ki] = scale_value
    if transpose:
      st_gmem[ki, ti] = scale_value

  def quantize_pass(chunks, transposed: bool, out_smem, scale_gmem):
    for r, c in chunks:
      tile = x_smem.at[r, c]
      v = plgpu.load(tile.T if transposed else tile, layout=_CHUNK_LAYOUT)
      if op == "quantize_128x128":
        row_scale = block_scale
      else:
        amax = quant_math.as_amax(jnp.max(quant_math.magnitude_bits(v), axis=1), v.dtype)
        row_scale = quant_math.scale(amax, pow2, _CHUNK_LAYOUT)
        # This chunk's rows are x's columns c (transposed) or rows r; its group
        # is x's row group r // 128 (transposed) or column group c // 128.
        if transposed:
          where = pl.ds(c0 + c.start, CHUNK), ti * (rows // GROUP) + r.start // GROUP
        else:
          where = pl.ds(r0 + r.start, CHUNK), ki * (cols // GROUP) + c.start // GROUP
        scale_gmem[where] = row_scale
      q = quant_math.quantize_rows(v, row_scale, _CHUNK_LAYOUT, power_of_two=pow2,
                                   division=division)
      if transposed:
        out_smem[c, r] = q
      else:
        out_smem[r, c] = q

  quantize_pass(row_chunks, False, q_smem, s_gmem)
  plgpu.commit_smem()  # the generic-proxy SMEM writes, before TMA reads them
  row_boxes(lambda box: plgpu.copy_smem_to_gmem(
      q_smem if box == rows else q_smem.at[pl.ds(0, box)],
      q_gmem.at[pl.ds(r0, box), pl.ds(c0, cols)]))
  if transpose:
    quantize_pass(col_chunks, True, qt_smem, st_gmem)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(qt_smem, qt_gmem.at[pl.ds(c0, cols), pl.ds(r0, rows)])
  # The CTA's SMEM must outlive the TMA stores' reads of it.
  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _quantize_call(x, op: str, *, pow2: bool, transpose: bool, config: QuantizeConfig | None):
  if np.dtype(x.dtype) not in IN_DTYPES:
    raise TypeError(f"x must be bfloat16, float16 or float32, got {np.dtype(x.dtype).name}")
  if x.ndim != 2:
    raise ValueError(f"x must be 2-D, got shape {x.shape}")
  reason = unsupported_reason(op, x.shape, x.dtype)
  if reason is not None:
    raise ValueError(reason)
  t, k = x.shape
  cfg = config or default_config(op, t)
  cfg.check(op, x.dtype)
  rows, cols = cfg.tile_rows, cfg.tile_cols
  tp, kp = _round_up(t, rows), _round_up(k, cols)
  # Row-wise groups take x's rows as they are, padded to whole 8-row TMA tiles
  # only (not at all up to 8), the last row tile in a short box
  # (common.short_a_box_rows: a box mostly past an array's rows is slow); the
  # other ops' groups span rows (128 x 128 blocks, columns of q_t): x padded to
  # whole tiles.
  short_rows = op == "quantize_1x128"
  xr = short_box_padded_rows(t) if short_rows else tp
  if (xr, kp) != (t, k):
    x = jnp.pad(x, ((0, xr - t), (0, kp - k)))  # zeros: exact for every amax
  qr = max(xr, 8) if short_rows else tp  # (q's store box: whole 8-row tiles)
  rg, cg = _num_groups(tp), kp // GROUP
  f32 = jnp.float32
  if op == "quantize_128x128":
    out_type = [jax.ShapeDtypeStruct((tp, kp), FP8), jax.ShapeDtypeStruct((rg, cg), f32)]
    if transpose:
      out_type += [jax.ShapeDtypeStruct((kp, tp), FP8), jax.ShapeDtypeStruct((cg, rg), f32)]
  else:
    out_type = [jax.ShapeDtypeStruct((qr, kp), FP8), jax.ShapeDtypeStruct((tp, cg), f32)]
    if transpose:
      out_type += [jax.ShapeDtypeStruct((kp, tp), FP8), jax.ShapeDtypeStruct((kp, rg), f32)]
  scratch = [plgpu.SMEM((rows, cols), x.dtype, transforms=_smem_transforms(x.dtype, cols)),
             plgpu.SMEM((rows, cols), FP8, transforms=_smem_transforms(FP8, cols))]
  if transpose:
    scratch.append(plgpu.SMEM((cols, rows), FP8, transforms=_smem_transforms(FP8, rows)))
  scratch.append(plgpu.Barrier())
  kernel = plgpu.kernel(
      functools.partial(_kernel, op=op, pow2=pow2, rows=rows, cols=cols, col_tiles=kp // cols,
                        transpose=transpose, division=cfg.division, short_rows=short_rows),
      out_type=tuple(out_type),
      scratch_types=scratch,
      grid=((tp // rows) * (kp // cols),),
      grid_names=("tile",),
      compiler_params=plgpu.CompilerParams(approx_math=False, unsafe_no_auto_barriers=True),
  )
  outs = kernel(x)
  if (tp, kp) == (t, k):
    return outs
  tg, kg = _num_groups(t), _num_groups(k)
  if op == "quantize_128x128":
    want = [(t, k), (tg, kg), (k, t), (kg, tg)]
  else:
    want = [(t, k), (t, kg), (k, t), (k, tg)]
  return tuple(o[:a, :b] for o, (a, b) in zip(outs, want))


def quantize_1x128(x, *, power_of_two_scales: bool = False,
                   config: QuantizeConfig | None = None):
  """x [T, K] (bf16/f16/f32) -> (q [T, K] e4m3, s [T, ceil(K/128)] f32): 128-element groups
  along each row."""
  return _quantize_call(x, "quantize_1x128", pow2=power_of_two_scales, transpose=False,
                        config=config)


def quantize_1x128_with_transpose(x, *, power_of_two_scales: bool = False,
                                  config: QuantizeConfig | None = None):
  """x [T, K] -> (q [T, K], s [T, ceil(K/128)], q_t [K, T], s_t [K, ceil(T/128)]), from one read.

  q, s: 128-element groups along each row of x; q_t, s_t: 128-element groups
  along each column of x (128 tokens of one feature), stored transposed.
  """
  return _quantize_call(x, "quantize_1x128_with_transpose", pow2=power_of_two_scales,
                        transpose=True, config=config)


def quantize_128x128(w, *, power_of_two_scales: bool = False, with_transpose: bool = False,
                     config: QuantizeConfig | None = None):
  """w [N, K] -> (q [N, K] e4m3, s [ceil(N/128), ceil(K/128)] f32), 128 x 128 blocks;
  with_transpose: (q, s, q_t [K, N], s_t [ceil(K/128), ceil(N/128)]) from the same read."""
  return _quantize_call(w, "quantize_128x128", pow2=power_of_two_scales,
                        transpose=with_transpose, config=config)
