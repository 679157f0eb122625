"""Test helpers shared by the tests and the GPU check script.

- `random_operands`: fresh random FP8 operands with scales over several binades.
- `reference_f64`: the contract evaluated in float64 with numpy.
- `edge_operands` / `contract_magnitude`: operands with edge values (NaN, Inf,
  zeros, subnormals, extreme scales) and the size of each output's terms.
- `quantize_np`, `dense_reference_f64`: the quantisers and jax_fp8.dense's
  training recipe (forward, dgrad, wgrad) simulated in numpy: quantise as
  specified, then exact float64 arithmetic (`quantize_jnp`: the same with
  jax_fp8's quantisers).
- `assert_close`: the relative Frobenius bounds of the project (and no NaN).
- `assert_same_nonfinite_and_close`: the same where NaN/Inf are expected (edge values).
- `poison_like`: a NaN-filled array, to prove every output tile gets written.
- Grouped (MoE) GEMMs: `random_group_sizes`, `random_ragged_operands`,
  `random_masked_operands`, and the float64 references `reference_ragged_f64`,
  `reference_masked_f64`.
- `gpu_interpret_mode` / `run_in_gpu_interpret_mode`: run Pallas GPU kernels on
  the CPU with race detection and fail on any race.
- `jnp_quantize_kernels`: the fused quantiser kernels replaced by the jnp
  quantisers (the same bits), to test how the kernels partition on CPU meshes.
"""
from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_fp8 import quantize
# (the GPU faults on a TMA copy's SMEM address off it; the interpreter does not check)
from jax_fp8.pallas.common import TMA_SMEM_ALIGN

# Relative Frobenius error bounds against the float64 reference.
TOLERANCE = {np.dtype(jnp.float32): 1e-5, np.dtype(jnp.bfloat16): 4e-3}


@dataclasses.dataclass
class Operands:
  a: jax.Array        # [..., M, K] float8_e4m3fn
  a_scale: jax.Array  # [..., M, ceil(K/128)] float32
  b: jax.Array        # [N, K] float8_e4m3fn
  b_scale: jax.Array  # [ceil(N/128), ceil(K/128)] float32 (or [N, ceil(K/128)]: per-row)
  c: jax.Array | None  # [..., M, N] or None

  def args(self):
    return self.a, self.a_scale, self.b, self.b_scale, self.c


def random_fp8(rng: np.random.Generator, shape) -> np.ndarray:
  """Random e4m3 values spread over most of the format's range, never all zero."""
  x = rng.standard_normal(shape).astype(np.float32) * np.float32(64.0)
  return np.asarray(jnp.asarray(x).astype(quantize.FP8))


def random_scales(rng: np.random.Generator, shape) -> np.ndarray:
  """Positive float32 scales over several binades (2^-12 .. 2^-4)."""
  return np.exp2(rng.uniform(-12.0, -4.0, size=shape)).astype(np.float32)


def random_operands(seed: int, m: int, n: int, k: int, *, batch=(),
                    with_c: bool = False, c_dtype=jnp.float32,
                    b_scale_block=(128, 128)) -> Operands:
  """b_scale_block=(1, 128) gives per-row b scales [N, ceil(K/128)]."""
  rng = np.random.default_rng(seed)
  kb = quantize.num_blocks(k)
  nb = n if tuple(b_scale_block) == (1, 128) else quantize.num_blocks(n)
  c = None
  if with_c:
    c = jnp.asarray(rng.standard_normal((*batch, m, n)).astype(np.float32)).astype(c_dtype)
  return Operands(
      a=jnp.asarray(random_fp8(rng, (*batch, m, k))),
      a_scale=jnp.asarray(random_scales(rng, (*batch, m, kb))),
      b=jnp.asarray(random_fp8(rng, (n, k))),
      b_scale=jnp.asarray(random_scales(rng, (nb, kb))),
      c=c)


# Edge values: e4m3 has no Inf, so a and b get NaN; scales and c get both.
SUBNORMAL_E4M3 = 2.0 ** -9
SUBNORMAL_F32 = 2.0 ** -130


def edge_operands(seed: int, m: int, n: int, k: int, *, with_c: bool = True) -> Operands:
  """random_operands with edge values planted: zeros (single values and whole
  K blocks), e4m3 subnormals, +-448 and NaN in a and b; 0, float32 subnormals,
  448, NaN, +Inf and the pair 2^-120 x 2^120 in the scales; 0, subnormals,
  NaN and +-Inf in c. Which ones, and where, depend on the seed.

  Infinite and huge (2^120) scales all sit in one K block, so no output adds
  two overflowing terms: its float32 accumulation then overflows exactly where
  the float64 contract rounded to float32 does, whatever the summation order.
  """
  ops = random_operands(seed, m, n, k, with_c=with_c)
  rng = np.random.default_rng(seed + 7919)
  kb, nb = quantize.num_blocks(k), quantize.num_blocks(n)
  a = np.array(ops.a.astype(jnp.float32))
  b = np.array(ops.b.astype(jnp.float32))
  sa, sb = np.array(ops.a_scale), np.array(ops.b_scale)
  chance = lambda: rng.random() < 0.5
  at = lambda x: tuple(int(rng.integers(d)) for d in x.shape)

  for x in (a, b):
    for value in (0.0, SUBNORMAL_E4M3, -SUBNORMAL_E4M3, 448.0, -448.0):
      for _ in range(3):
        x[at(x)] = value
    if chance():  # a whole K block of one row (column) is zero: its block sum is 0
      row, blk = int(rng.integers(x.shape[0])), int(rng.integers(kb))
      x[row, blk * quantize.BLOCK:(blk + 1) * quantize.BLOCK] = 0.0
    if chance():
      x[at(x)] = np.nan
  big = int(rng.integers(kb))  # the one K block of huge and infinite scales
  if chance():  # 2^-120 * 2^120 = 1 exactly (a dequantise-first path overflows)
    sb[:, big] = 2.0 ** 120
    sa[:, big] = 2.0 ** -120
    sa[int(rng.integers(m)), big] = np.exp2(rng.uniform(-12.0, -4.0))  # a huge product
  for s in (sa, sb):
    for value in (0.0, SUBNORMAL_F32, 448.0):
      if chance():
        s[at(s)] = value
    if chance():
      s[at(s)] = np.nan
    if chance():
      s[int(rng.integers(s.shape[0])), big] = np.inf
  c = None
  if with_c:
    c = np.array(ops.c)
    for value in (0.0, SUBNORMAL_F32, np.nan, np.inf, -np.inf):
      if chance():
        c[at(c)] = value
    c = jnp.asarray(c)
  return Operands(a=jnp.asarray(a).astype(quantize.FP8), a_scale=jnp.asarray(sa),
                  b=jnp.asarray(b).astype(quantize.FP8), b_scale=jnp.asarray(sb), c=c)


def contract_magnitude(a, a_scale, b, b_scale, c=None, beta: float = 1.0, *,
                       flush_subnormal_scales: bool = False) -> np.ndarray:
  """reference_f64 of the absolute values: the size of the terms each output
  entry sums, the scale its rounding errors are measured against."""
  absolute = lambda x: None if x is None else jnp.abs(jnp.asarray(x).astype(jnp.float32))
  return reference_f64(absolute(a), absolute(a_scale), absolute(b), absolute(b_scale),
                       absolute(c), abs(beta), flush_subnormal_scales=flush_subnormal_scales)


def reference_f64(a, a_scale, b, b_scale, c=None, beta: float = 1.0,
                  b_scale_block=(128, 128), *, flush_subnormal_scales: bool = False
                  ) -> np.ndarray:
  """The contract in float64 with numpy, one K block at a time.

  out = sum over K blocks of (block dot, exact in float64) * (a_scale * b_scale
  as float32, the one rounding the contract makes there), + beta * c. Non-finite
  values follow IEEE arithmetic (an infinite scale times a negative block sum is
  -inf, times a zero block sum NaN). b_scale_block=(1, 128): b_scale is per row
  of b, [N, ceil(K/128)]. flush_subnormal_scales: read subnormal scales and
  scale products as 0, as XLA on the CPU does (so the reference backend and GPU
  interpret mode there).
  """
  a64 = np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64)
  b64 = np.asarray(jnp.asarray(b).astype(jnp.float32), dtype=np.float64)
  n, k = b64.shape
  sa = np.asarray(a_scale, np.float32)
  sb = np.asarray(b_scale, np.float32)
  if tuple(b_scale_block) != (1, 128):
    sb = np.repeat(sb, quantize.BLOCK, axis=0)[:n]  # [N, kb]: each row's block scales
  flush = _flush_subnormals if flush_subnormal_scales else (lambda x: x)
  sa, sb = flush(sa), flush(sb)
  out = np.zeros((*a64.shape[:-1], n))
  with np.errstate(invalid="ignore", over="ignore"):
    for j in range(quantize.num_blocks(k)):
      blk = slice(j * quantize.BLOCK, (j + 1) * quantize.BLOCK)
      scale = flush(sa[..., :, j, None] * sb[None, :, j])  # float32, as the contract says
      out += (a64[..., blk] @ b64[:, blk].T) * scale.astype(np.float64)
    if c is not None:
      beta = float(np.asarray(beta, np.float64))
      out = out + beta * np.asarray(jnp.asarray(c).astype(jnp.float32), np.float64)
  return out


def _flush_subnormals(x: np.ndarray) -> np.ndarray:
  return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0), x)


def rel_error(out, ref: np.ndarray) -> float:
  out64 = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
  if out64.shape != ref.shape:
    raise AssertionError(f"shape {out64.shape} != reference shape {ref.shape}")
  if not np.all(np.isfinite(out64)):
    return float("nan")
  denom = np.linalg.norm(ref)
  return float(np.linalg.norm(out64 - ref) / (denom if denom > 0 else 1.0))


def assert_close(out, ref: np.ndarray, out_dtype=None, tol: float | None = None):
  """Relative Frobenius error within the bound for out_dtype; NaN never passes."""
  dtype = np.dtype(out_dtype if out_dtype is not None else jnp.asarray(out).dtype)
  if np.dtype(jnp.asarray(out).dtype) != dtype:
    raise AssertionError(f"output dtype {jnp.asarray(out).dtype} != expected {dtype}")
  bound = TOLERANCE[dtype] if tol is None else tol
  err = rel_error(out, ref)
  if not err <= bound:  # also catches NaN
    raise AssertionError(f"relative Frobenius error {err:.3e} > {bound:.1e} ({dtype})")
  return err


def assert_same_nonfinite_and_close(out, ref: np.ndarray, out_dtype=None, *,
                                    magnitude: np.ndarray | None = None,
                                    tol: float | None = None, atol: float = 0.0):
  """For results that may hold NaN/Inf by design (edge values): every entry is
  NaN, +Inf or -Inf exactly where `ref` rounded to out_dtype is, and the finite
  entries are close: each within tol * magnitude + atol where `magnitude`
  (contract_magnitude) is given, else within the relative Frobenius bound."""
  dtype = np.dtype(out_dtype if out_dtype is not None else jnp.asarray(out).dtype)
  if np.dtype(jnp.asarray(out).dtype) != dtype:
    raise AssertionError(f"output dtype {jnp.asarray(out).dtype} != expected {dtype}")
  got = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
  with np.errstate(over="ignore", invalid="ignore"):
    want = np.asarray(jnp.asarray(ref.astype(np.float32)).astype(dtype).astype(jnp.float32),
                      np.float64)
  if got.shape != want.shape:
    raise AssertionError(f"shape {got.shape} != reference shape {want.shape}")
  for what, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
    bad = test(got) != test(want)
    if bad.any():
      idx = tuple(int(i) for i in np.argwhere(bad)[0])
      raise AssertionError(f"{int(bad.sum())} entries differ in being {what}, e.g. at {idx}: "
                           f"got {got[idx]}, want {want[idx]} (float64: {ref[idx]})")
  finite = np.isfinite(want)
  bound = TOLERANCE[dtype] if tol is None else tol
  if magnitude is not None:
    with np.errstate(invalid="ignore"):  # Inf - Inf where both are Inf: not compared
      err = np.abs(got - ref)
    allowed = bound * magnitude + atol
    bad = finite & ~(err <= allowed)
    if bad.any():
      idx = tuple(int(i) for i in np.argwhere(bad)[0])
      raise AssertionError(f"{int(bad.sum())} finite entries off, e.g. at {idx}: got "
                           f"{got[idx]}, want {ref[idx]} (allowed error {allowed[idx]:.3e})")
    return
  diff = np.linalg.norm(got[finite] - ref[finite])
  allowed = bound * np.linalg.norm(ref[finite]) + atol * np.sqrt(finite.sum())
  if not diff <= allowed:
    raise AssertionError(f"finite entries: error norm {diff:.3e} > {allowed:.3e} ({dtype})")


def poison_like(shape, dtype) -> jax.Array:
  """An output-sized NaN array: a kernel that leaves a tile unwritten fails."""
  return jnp.full(shape, jnp.nan, dtype)


# ---- the training recipe in numpy ----------------------------------------------

def quantize_np(x, group) -> np.ndarray:
  """x [R, C] quantised in groups of `group` = (rows, cols) elements (1x128 or
  128x128; the last groups may be partial), returned dequantised in float64.

  An independent implementation of the quantisers' rule for finite input:
  scale = float32(amax) / 448 rounded once (below float32's normal range, e.g.
  an all-zero group: 1), q = clip(x / scale, +-448) rounded to e4m3 (nearest
  even), value = q * scale exactly.
  """
  x = np.asarray(jnp.asarray(x).astype(jnp.float32))
  if not np.all(np.isfinite(x)):
    raise ValueError("quantize_np simulates finite input only")
  gr, gc = group
  r, c = x.shape
  rb, cb = -(-r // gr), -(-c // gc)
  padded = np.zeros((rb * gr, cb * gc), np.float32)  # zeros change no group's amax
  padded[:r, :c] = x
  blocks = padded.reshape(rb, gr, cb, gc)
  scale = np.max(np.abs(blocks), axis=(1, 3)) / np.float32(quantize.E4M3_MAX)  # float32
  tiny = np.finfo(np.float32).tiny  # a scale below float32's normal range (all zeros): 1
  scale = np.where(scale < tiny, np.float32(1.0), scale)[:, None, :, None]
  q = np.clip(blocks / scale, -quantize.E4M3_MAX, quantize.E4M3_MAX).astype(
      ml_dtypes.float8_e4m3fn)
  out = q.astype(np.float64) * scale.astype(np.float64)
  return out.reshape(rb * gr, cb * gc)[:r, :c]


def quantize_jnp(x, group) -> np.ndarray:
  """Like quantize_np, through jax_fp8's own quantisers (dequantised exactly in float64)."""
  x = jnp.asarray(x)
  if tuple(group) == (128, 128):
    q, s = jax.jit(quantize.quantize_128x128)(x)
    s = np.repeat(np.asarray(s, np.float64), quantize.BLOCK, 0)[:x.shape[0]]
  elif tuple(group) == (1, 128):
    q, s = jax.jit(quantize.quantize_1x128)(x)
    s = np.asarray(s, np.float64)
  else:
    raise ValueError(f"group must be (1, 128) or (128, 128), got {group}")
  s = np.repeat(s, quantize.BLOCK, 1)[:, :x.shape[1]]
  return np.asarray(jnp.asarray(q).astype(jnp.float32), np.float64) * s


def dense_reference_f64(x, kernel, dy, quantize_fn=quantize_np):
  """jax_fp8.dense's recipe on x [T, K], kernel [K, N] and the output gradient
  dy [T, N], in float64 after quantisation: (y, dx, dkernel).

  forward  y  = Q(x, 1x128 along K)   @ Q(kernel, 128x128)
  dgrad    dx = Q(dy, 1x128 along N)  @ Q(kernel, 128x128)^T
  wgrad    dk = Q(x, 1x128 along T)^T @ Q(dy, 1x128 along T)

  quantize_fn(x, group) -> dequantised float64: quantize_np (the rule, in
  numpy) or quantize_jnp (jax_fp8's quantisers, to check the recipe's wiring
  apart from the quantisers' last bits).
  """
  x32 = np.asarray(jnp.asarray(x).astype(jnp.float32))
  dy32 = np.asarray(jnp.asarray(dy).astype(jnp.float32))
  w = quantize_fn(jnp.asarray(kernel), (128, 128))
  y = quantize_fn(x32, (1, 128)) @ w
  dx = quantize_fn(dy32, (1, 128)) @ w.T
  dk = quantize_fn(x32.T, (1, 128)) @ quantize_fn(dy32.T, (1, 128)).T
  return y, dx, dk


# ---- grouped (MoE) GEMMs ----------------------------------------------------------

# Group sizes that catch off-by-one tiling: empty, one row, one short of and one
# past a 128-row tile.
SPECIAL_GROUP_SIZES = (0, 1, 127, 129)


@dataclasses.dataclass
class GroupedOperands:
  a: jax.Array        # ragged [M, K] / masked [G, M, K] float8_e4m3fn
  a_scale: jax.Array  # a.shape[:-1] + (ceil(K/128),) float32
  b: jax.Array        # [G, N, K] float8_e4m3fn
  b_scale: jax.Array  # [G, ceil(N/128), ceil(K/128)] float32
  sizes: jax.Array    # group_sizes (ragged) or masked_m (masked), [G] int32

  def args(self):
    return self.a, self.a_scale, self.b, self.b_scale, self.sizes


def random_group_sizes(seed: int, m: int, groups: int, *, special=SPECIAL_GROUP_SIZES,
                       fill: bool = True) -> np.ndarray:
  """[groups] int32 sizes summing to m (fill) or to less than m (rows past the sum).

  As many of `special` as fit are given to groups at random positions, keeping
  one group back; the others share the remaining rows at random.
  """
  rng = np.random.default_rng(seed)
  total = m if fill or m == 0 else int(rng.integers(0, m))
  sizes = np.zeros(groups, np.int64)
  slots = list(rng.permutation(groups))
  for s in special:
    if len(slots) > 1 and s <= total - sizes.sum():
      sizes[slots.pop()] = s
  if slots:
    rest = total - sizes.sum()
    cuts = np.sort(rng.integers(0, rest + 1, size=len(slots) - 1))
    sizes[slots] = np.diff(np.concatenate([[0], cuts, [rest]]))
  return sizes.astype(np.int32)


def _random_experts(rng, groups, n, k):
  nb, kb = quantize.num_blocks(n), quantize.num_blocks(k)
  return (jnp.asarray(random_fp8(rng, (groups, n, k))),
          jnp.asarray(random_scales(rng, (groups, nb, kb))))


def random_ragged_operands(seed: int, m: int, n: int, k: int, group_sizes) -> GroupedOperands:
  """a [M, K] and G = len(group_sizes) experts b [G, N, K], scales over several binades."""
  rng = np.random.default_rng(seed)
  sizes = np.asarray(group_sizes, np.int32)
  b, b_scale = _random_experts(rng, len(sizes), n, k)
  return GroupedOperands(
      a=jnp.asarray(random_fp8(rng, (m, k))),
      a_scale=jnp.asarray(random_scales(rng, (m, quantize.num_blocks(k)))),
      b=b, b_scale=b_scale, sizes=jnp.asarray(sizes))


def random_masked_operands(seed: int, m: int, n: int, k: int, masked_m) -> GroupedOperands:
  """a [G, M, K] and G = len(masked_m) experts b [G, N, K], scales over several binades."""
  rng = np.random.default_rng(seed)
  mm = np.asarray(masked_m, np.int32)
  g = len(mm)
  b, b_scale = _random_experts(rng, g, n, k)
  return GroupedOperands(
      a=jnp.asarray(random_fp8(rng, (g, m, k))),
      a_scale=jnp.asarray(random_scales(rng, (g, m, quantize.num_blocks(k)))),
      b=b, b_scale=b_scale, sizes=jnp.asarray(mm))


def _f64(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _expert_f64(a64, sa64, b64, sb64) -> np.ndarray:
  """reference_f64 on float64 numpy operands: rows a64 [R, K] times b64 [N, K]^T."""
  n, k = b64.shape
  sa = np.repeat(sa64, quantize.BLOCK, axis=-1)[..., :k]
  sb = np.repeat(np.repeat(sb64, quantize.BLOCK, 0), quantize.BLOCK, 1)[:n, :k]
  return (a64 * sa) @ (b64 * sb).T


def reference_ragged_f64(a, a_scale, b, b_scale, group_sizes) -> np.ndarray:
  """blockwise_fp8_ragged_dot in float64: rows of group g times expert g; rows past
  the groups 0 (negative sizes count as 0, groups are cut at M). Only the rows a
  group owns are read, so anything (NaN) in the others cannot leak."""
  a64, sa64, b64, sb64 = map(_f64, (a, a_scale, b, b_scale))
  m, n = a64.shape[0], b64.shape[1]
  out = np.zeros((m, n))
  start = 0
  for g, size in enumerate(np.asarray(group_sizes, np.int64)):
    end = min(start + max(int(size), 0), m)
    if end > start:
      out[start:end] = _expert_f64(a64[start:end], sa64[start:end], b64[g], sb64[g])
    start = end
  return out


def reference_masked_f64(a, a_scale, b, b_scale, masked_m) -> np.ndarray:
  """blockwise_fp8_masked_dot in float64: rows < masked_m[g] (clamped to [0, M]) of
  group g times expert g, the other rows 0 (and never read)."""
  a64, sa64, b64, sb64 = map(_f64, (a, a_scale, b, b_scale))
  g, m, _ = a64.shape
  out = np.zeros((g, m, b64.shape[1]))
  for i, rows in enumerate(np.clip(np.asarray(masked_m, np.int64), 0, m)):
    if rows:
      out[i, :rows] = _expert_f64(a64[i, :rows], sa64[i, :rows], b64[i], sb64[i])
  return out


# ---- GPU interpret mode -------------------------------------------------------

def _interpret_modules():
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
  return gpu_callbacks, interpret_pallas_call


class _TmaAlignment:
  """Wraps the interpreter's TMA callbacks to record every copy whose SMEM side
  starts off a TMA_SMEM_ALIGN-byte boundary of its buffer (the offset of the
  logical, row-major slice: buffers are allocated aligned, and the kernels
  slice tiled buffers by whole slots or whole rows of tiles only)."""
  _COPIES = {"copy_smem_to_gmem": "src", "copy_gmem_to_smem": "dst"}

  def __init__(self, gpu_callbacks):
    self.callbacks = gpu_callbacks
    self.originals = {name: getattr(gpu_callbacks, name) for name in self._COPIES}
    self.misaligned: list[str] = []

  def smem_offset_bytes(self, key_array, transforms) -> int:
    cb = self.callbacks
    memory = cb._get_shared_memory()
    key = cb.HostAllocationKey.from_array(key_array)
    transforms = jax.tree.map(int, cb._remove_noop_transforms(transforms))
    access = memory.access(key, transforms)
    buffer = memory.buffer_shape_and_dtype(key)
    strides = np.cumprod((1, *buffer.shape[::-1]))[-2::-1]
    starts = [r if isinstance(r, int) else r.start for r in access.range]
    return int(np.dot(starts, strides)) * np.dtype(buffer.dtype).itemsize

  def _wrapped(self, name):
    original, side = self.originals[name], self._COPIES[name]

    def copy(**kwargs):
      offset = self.smem_offset_bytes(kwargs[f"{side}_allocation_key_as_array"],
                                      kwargs[f"{side}_transforms"])
      if offset % TMA_SMEM_ALIGN:
        self.misaligned.append(f"{name} at SMEM byte offset {offset} "
                               f"({_summarize(kwargs.get('source_info'))})")
      return original(**kwargs)
    return copy

  def __enter__(self):
    for name in self._COPIES:
      setattr(self.callbacks, name, self._wrapped(name))
    return self

  def __exit__(self, *exc):
    for name, original in self.originals.items():
      setattr(self.callbacks, name, original)


def _summarize(source_info) -> str:
  """Where in the kernel's source a primitive was traced, if the interpreter says."""
  try:
    from jax._src import source_info_util
    return source_info_util.summarize(source_info)
  except Exception:  # (internal API: only a hint in a message)
    return "source unknown"


# The interpreter runs each warpgroup of a CTA as its own XLA computation on the
# CPU client's threads, whose number grows with the CPU devices (and cores): on 2
# cores with 1-2 CPU devices a kernel of 4 warpgroups (3 consumers + the producer)
# whose first three waited for the fourth never ran it; with 3 devices it ran
# (2026-11-28). tests/conftest.py configures 8.
_MIN_CPU_THREADS_HINT = 3


def _warn_if_interpreter_may_starve():
  import os
  import warnings
  if len(jax.devices("cpu")) < _MIN_CPU_THREADS_HINT and (os.cpu_count() or 1) < 4:
    warnings.warn(
        "GPU interpret mode on a machine of few cores and CPU devices: a kernel whose "
        "warpgroups wait for one another can hang (each warpgroup takes one of XLA's "
        "CPU threads). Set XLA_FLAGS=--xla_force_host_platform_device_count=8 before "
        "jax initialises.", RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def gpu_interpret_mode(detect_races: bool = True, check_tma_alignment: bool = True,
                       **params):
  """Runs Pallas GPU kernels traced inside on the CPU; asserts no race was found
  and (check_tma_alignment) that every TMA copy's SMEM address is aligned as the
  GPU needs (TMA_SMEM_ALIGN), which the interpreter does not check.

  Also resets the interpreter's state when a kernel raised, so that the next
  test in the process starts clean.
  """
  from jax.experimental.pallas import mosaic_gpu as plgpu
  _warn_if_interpreter_may_starve()
  gpu_callbacks, interpret_pallas_call = _interpret_modules()
  interpret_pallas_call.reset_gpu_interpret_mode_state()
  alignment = _TmaAlignment(gpu_callbacks) if check_tma_alignment else contextlib.nullcontext()
  ok = False
  try:
    with alignment, plgpu.force_gpu_interpret_mode(
        plgpu.InterpretGPUParams(detect_races=detect_races, **params)):
      yield
    ok = True
  except Exception as e:
    # jax >= 0.12 raises a race from inside the interpreter (jax 0.11 records it).
    if detect_races and _RACE_RAISED in str(e):
      raise AssertionError(f"{_RACE_FOUND} (raised by the interpreter)") from e
    raise
  finally:
    if not ok:
      interpret_pallas_call.reset_gpu_interpret_mode_state()
  races = gpu_callbacks._races
  if detect_races and races is not None and races.races_found:
    raise AssertionError(_RACE_FOUND)
  if check_tma_alignment and alignment.misaligned:
    raise AssertionError(
        f"{len(alignment.misaligned)} TMA copies with an SMEM address not "
        f"{TMA_SMEM_ALIGN}-byte aligned (the GPU faults), e.g. {alignment.misaligned[0]}")


_RACE_RAISED = "RACE DETECTED"
_RACE_FOUND = "GPU interpret mode detected a data race in the kernel"


def run_in_gpu_interpret_mode(fn, *args, detect_races: bool = True, **params):
  """Calls fn(*args) under GPU interpret mode (jit-compiled inside) and blocks."""
  with gpu_interpret_mode(detect_races=detect_races, **params):
    out = jax.block_until_ready(jax.jit(fn)(*args))
  return out


# ---- a stand-in for the fused quantiser kernels ------------------------------------

class JnpQuantizeKernels:
  """Stands in for jax_fp8.pallas.quantize with the jnp quantisers (which give
  the same bits) and records the shape of every x it is traced with.

  Interpret-mode kernels cannot run on several devices, so on the CPU this is
  how tests see the kernels' partitioning (jax_fp8.quantize_sharding): the
  rule, the per-shard calls (`shapes`) and the collectives around them.
  """

  def __init__(self):
    self.shapes: list[tuple[int, ...]] = []

  def unsupported_reason(self, op, shape, dtype, **_):
    from jax_fp8.pallas import quantize as kernels
    return kernels.unsupported_reason(op, shape, dtype)

  def quantize_1x128(self, x, *, power_of_two_scales=False):
    self.shapes.append(tuple(x.shape))
    return quantize._jnp_quantize_1x128(x, power_of_two_scales=power_of_two_scales)

  def quantize_1x128_with_transpose(self, x, *, power_of_two_scales=False):
    self.shapes.append(tuple(x.shape))
    return quantize._jnp_quantize_1x128_with_transpose(
        x, power_of_two_scales=power_of_two_scales)

  def quantize_128x128(self, w, *, power_of_two_scales=False, with_transpose=False):
    self.shapes.append(tuple(w.shape))
    fn = (quantize._jnp_quantize_128x128_with_transpose if with_transpose
          else quantize._jnp_quantize_128x128)
    return fn(w, power_of_two_scales=power_of_two_scales)


@contextlib.contextmanager
def jnp_quantize_kernels():
  """Inside, backend="pallas" quantisers run a JnpQuantizeKernels (yielded) in
  the kernels' place, on any platform, through the kernels' partitioning."""
  stand_in = JnpQuantizeKernels()
  previous, quantize._stand_in_kernels = quantize._stand_in_kernels, stand_in
  try:
    yield stand_in
  finally:
    quantize._stand_in_kernels = previous
