"""What the Hopper and Blackwell kernels share: the contract's constants, the
shapes they accept, SMEM layouts, and the zero padding tiled TMA needs."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

K_BLOCK = 128          # one scale block of K = one pipeline step
SCALE_N = 128          # columns sharing one b_scale value
SMEM_BYTES = 227 * 1024
OUT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float32))
C_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16), np.dtype(jnp.float32))


def round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def unsupported_reason(op, m, n, k, *, out_dtype, has_c=False, **problem) -> str | None:
  """Why a Pallas kernel cannot take this call, or None (jax_fp8.backends' protocol)."""
  del op, has_c, problem
  if np.dtype(out_dtype) not in OUT_DTYPES:
    return f"out_dtype must be bfloat16 or float32, got {out_dtype}"
  if min(m, n, k) < 1:
    return "empty problem"
  if m >= 2**31 or n >= 2**31 or k >= 2**31:
    return "dimensions must fit in int32"
  return None


def tiled(dtype, cols):
  """SMEM tiling + swizzle for a (rows, cols) TMA tile of `dtype`."""
  swizzle = plgpu.find_swizzle(cols * jnp.dtype(dtype).itemsize * 8)
  elems = swizzle // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


@dataclasses.dataclass(frozen=True)
class TmaOperands:
  """Operands padded for tiled TMA; the kernel's output is (rows, out_cols)."""
  a: jax.Array
  # The A-scales, either transposed ([K blocks, rows]: a tile's scales of one K
  # block are one (1, tile_m) TMA box) or as given ([rows', K blocks], rows
  # padded to whole tiles for kernels that load them straight from GMEM).
  a_scale: jax.Array
  b: jax.Array
  c: jax.Array | None
  rows: int
  out_cols: int


def pad_for_tma(a, a_scale, b, c, *, tile_m: int, tile_n: int, out_cols_multiple: int,
                transpose_a_scale: bool = True, a_scale_rows_multiple: int = 1):
  """Zero-pads a, b, c (and the A-scales) to what tiled TMA and the kernel can address.

  Mosaic's TMA views a global array through the SMEM tiling ((8, 128) for the
  FP8 operands, (8, 128 B) for the epilogue), so a dimension must be a multiple
  of its tile or smaller than it, and a TMA box may not exceed the array.
  Zero padding is exact (padded K adds zero products) and is sliced off the
  output. The DeepSeek-V3 shapes (K, N multiples of 128) need none for a, b.
  """
  m, k = a.shape
  n = b.shape[0]
  kp = round_up(k, K_BLOCK)
  rows = max(round_up(m, 8), tile_m)
  b_rows = max(round_up(n, 8), tile_n)
  out_cols = max(round_up(n, out_cols_multiple), tile_n)
  if (rows, kp) != (m, k):
    a = jnp.pad(a, ((0, rows - m), (0, kp - k)))
  if (b_rows, kp) != (n, k):
    b = jnp.pad(b, ((0, b_rows - n), (0, kp - k)))
  if c is not None and c.shape != (rows, out_cols):
    c = jnp.pad(c, ((0, rows - m), (0, out_cols - n)))
  if transpose_a_scale:
    # (A (tile_m, 1) float32 box would be narrower than TMA's 16-byte minimum.)
    a_scale = jnp.pad(a_scale.T, ((0, 0), (0, rows - m)))
  else:
    # Every row a tile reads must exist: plain loads have no TMA bounds check.
    scale_rows = round_up(m, a_scale_rows_multiple)
    if scale_rows != m:
      a_scale = jnp.pad(a_scale, ((0, scale_rows - m), (0, 0)))
  return TmaOperands(a, a_scale, b, c, rows, out_cols)
