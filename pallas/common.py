"""What the Hopper and Blackwell kernels share: the contract's constants, the
shapes they accept, SMEM layouts, and the zero padding tiled TMA needs; with the
row-wise quantiser, the short TMA boxes of a last row tile (for_row_tile_box)."""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

K_BLOCK = 128          # one scale block of K = one pipeline step
SCALE_N = 128          # columns sharing one b_scale value
SMEM_BYTES = 227 * 1024
OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
FP8_OUT = np.dtype(jnp.float8_e4m3fn)   # quantised 1x128 in the epilogue (dense op)
C_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(jnp.float32))
# A TMA copy's shared-memory address must be 128-byte aligned (the GPU faults with
# "misaligned address" otherwise).
TMA_SMEM_ALIGN = 128


def round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def unsupported_reason(op, m, n, k, *, out_dtype, has_c=False, b_scale_rows=SCALE_N,
                       **problem) -> str | None:
  """Why a Pallas kernel cannot take this call, or None (jax_fp8.backends' protocol)."""
  del has_c, problem
  if b_scale_rows not in (SCALE_N, 1):
    return f"b_scale_rows must be {SCALE_N} (128x128 blocks) or 1 (per row), got {b_scale_rows}"
  if b_scale_rows != SCALE_N and op != "blockwise_fp8_dot":
    return f"{op} takes 128x128 b scales only"
  if np.dtype(out_dtype) not in OUT_DTYPES + ((FP8_OUT,) if op in ("blockwise_fp8_dot", "glu")
                                              else ()):
    return f"out_dtype must be bfloat16 or float32 (or float8_e4m3fn), got {out_dtype}"
  if min(m, n, k) < 1:
    return "empty problem"
  if m >= 2**31 or n >= 2**31 or k >= 2**31:
    return "dimensions must fit in int32"
  return None


def rows_buffer_shape(rows: int, cols: int, dtype) -> tuple[int, int, int]:
  """The SMEM buffer of row-exact stores (OutputStores.store_rows) of pieces of
  (rows, cols) in dtype: (copies, rows per copy, cols). A store copies a piece's
  rows from any row by TMA, whose shared-memory address must be TMA_SMEM_ALIGN-
  aligned: where a row is less (bf16 pieces of 32 or 16 columns, float32 of 16),
  copy j holds the piece shifted down by j rows, so that every row starts an
  aligned address in one copy (each copy TMA_SMEM_ALIGN-aligned: one row more)."""
  row_bytes = cols * np.dtype(dtype).itemsize
  copies = TMA_SMEM_ALIGN // math.gcd(TMA_SMEM_ALIGN, row_bytes)
  return copies, rows + (copies if copies > 1 else 0), cols


def rows_buffer_bytes(rows: int, cols: int, dtype) -> int:
  """SMEM bytes of rows_buffer_shape(rows, cols, dtype)."""
  return math.prod(rows_buffer_shape(rows, cols, dtype)) * np.dtype(dtype).itemsize


def tiled(dtype, cols):
  """SMEM tiling + swizzle for a (rows, cols) TMA tile of `dtype`."""
  swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8)
  elems = swizzle // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


@dataclasses.dataclass(frozen=True)
class TmaOperands:
  """Operands padded for tiled TMA, each with its leading group axis; the
  kernel's output is (groups, rows, out_cols)."""
  a: jax.Array         # [Ga, rows, K'] (short_a_box: M rounded up to 8 where M > 8)
  # The A-scales, either transposed ([Ga, K blocks, rows]: a tile's scales of
  # one K block are one (1, tile_m) TMA box) or as given ([Ga, rows', K
  # blocks], rows padded for kernels that load them straight from GMEM).
  a_scale: jax.Array
  b: jax.Array         # [Gb, N', K']
  c: jax.Array | None  # [1, rows, out_cols]
  rows: int
  out_cols: int


def _pad_last2(x, rows: int, cols: int):
  """x [..., r, c] zero-padded to [..., rows, cols] (no copy when it fits)."""
  r, c = x.shape[-2:]
  if (r, c) == (rows, cols):
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, rows - r), (0, cols - c)])


def pad_for_tma(a, a_scale, b, c, *, tile_m: int, tile_n: int, out_cols_multiple: int,
                transpose_a_scale: bool = True, a_scale_rows_multiple: int = 1,
                few_a_scale_rows: int = 0, out_n: int | None = None,
                short_a_box: bool = False):
  """Zero-pads a [Ga, M, K], b [Gb, N, K], c [1, M, N] (and the A-scales
  [Ga, M, kb]) to what tiled TMA and the kernel can address.

  Mosaic's TMA views a global array through the SMEM tiling ((8, 128) for the
  FP8 operands, (8, 128 B) for the epilogue), so a dimension must be a multiple
  of its tile or smaller than it. A box past the array reads zeros, slowly where
  it is mostly past (short_a_box_rows), so a is padded to a whole tile unless the
  kernel shortens its box.
  Zero padding is exact (padded K adds zero products) and is sliced off the
  output. The DeepSeek-V3 shapes (K, N multiples of 128) need none for a, b.
  out_n: the output's columns where they are not b's rows (a GLU's are half).
  short_a_box: the kernel loads the last row tile of a in a short box where a's
  rows end inside it (for_row_tile_box): a is padded to whole 8-row tiles only,
  and not at all where M <= 8 (a dimension smaller than its tile).
  few_a_scale_rows: A-scales (as given) of at most this many rows are not padded:
  the kernel reads them one by one (a decode call then runs no XLA pad at all).
  """
  m, k = a.shape[-2:]
  n = b.shape[-2]
  kp = round_up(k, K_BLOCK)
  rows = max(round_up(m, 8), tile_m)
  out_cols = max(round_up(out_n or n, out_cols_multiple), tile_n)
  a = _pad_last2(a, short_box_padded_rows(m) if short_a_box else rows, kp)
  b = _pad_last2(b, max(round_up(n, 8), tile_n), kp)
  if c is not None:
    c = _pad_last2(c, rows, out_cols)
  if transpose_a_scale:
    # (A (tile_m, 1) float32 box would be narrower than TMA's 16-byte minimum.)
    a_scale = _pad_last2(jnp.swapaxes(a_scale, -1, -2), a_scale.shape[-1], rows)
  else:
    # Every row a tile reads must exist: plain loads have no TMA bounds check.
    if m > few_a_scale_rows:
      a_scale = _pad_last2(a_scale, round_up(m, a_scale_rows_multiple), a_scale.shape[-1])
  return TmaOperands(a, a_scale, b, c, rows, out_cols)


def short_a_box_rows(a_rows: int, tile_m: int) -> int:
  """Rows of a's TMA box for its last row tile (a as padded, short_a_box): whole
  8-row tiles of the rows it holds, tile_m where they fill it; the rest of the
  SMEM tile is left as it was (its rows' outputs are never stored). A box mostly
  past a's rows is slow: at one row of a, a 64-row box made a decode kernel ~5 us
  slower (H100, 2026-11-28)."""
  rows = a_rows % tile_m
  return tile_m if rows == 0 else round_up(rows, 8)


def short_box_padded_rows(m: int) -> int:
  """The rows an array of m rows is padded to where its row tiles are loaded in
  short boxes (for_row_tile_box): whole 8-row TMA tiles, none up to 8 rows (a
  dimension smaller than its tile)."""
  return m if m <= 8 else round_up(m, 8)


def for_row_tile_box(array_rows: int, tile_m: int, m0, body):
  """body(box_rows) for the row tile from m0 of an array of array_rows rows:
  tile_m, or for the last row tile where the rows end inside it,
  short_a_box_rows (the TMA box of a row tile, as both kernels and the row-wise
  quantiser take it)."""
  box = short_a_box_rows(array_rows, tile_m)
  last_m0 = (array_rows - 1) // tile_m * tile_m
  if box == tile_m:
    body(tile_m)
  elif last_m0 == 0:  # one row tile (and a CTA pair's second, past the rows)
    body(box)
  else:
    # (Two comparisons: Blackwell's producer warp lowers no logical not.)
    pl.when(m0 == last_m0)(lambda: body(box))
    pl.when(m0 != last_m0)(lambda: body(tile_m))


def copy_a_rows(a_gmem, group, m0, kcols, dst, barrier, *, tile_m: int, collective_axes=None):
  """The TMA of a's row tile from row m0 (columns kcols) into dst ([tile_m, ...]
  SMEM): a box of tile_m rows, or, for the last row tile where a's rows end
  inside it, of short_a_box_rows (into dst's first rows). A multicast copy
  (collective_axes) keeps whole tiles."""
  def copy(rows):
    plgpu.copy_gmem_to_smem(a_gmem.at[group, pl.ds(m0, rows), kcols],
                            dst if rows == tile_m else dst.at[pl.ds(0, rows)], barrier,
                            collective_axes=collective_axes)
  if collective_axes:
    copy(tile_m)
  else:
    for_row_tile_box(a_gmem.shape[1], tile_m, m0, copy)


def gate_activation(name: str, x):
  """The gate activation of a fused GLU epilogue (float32 registers)."""
  if name == "silu":
    return x / (1.0 + jnp.exp(-x))
  if name == "gelu":  # the tanh approximation, as jax.nn.gelu's default
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
  if name == "relu":
    return jnp.maximum(x, 0.0)
  raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


ACTIVATIONS = ("silu", "gelu", "relu")
