"""The grouped GEMMs' Pallas kernels (the `ragged_dot` / `masked_dot` ops of the
pallas_sm90 and pallas_sm100 backend modules), through
jax_fp8.blockwise_fp8_ragged_dot / _masked_dot.

CPU (CI): tiny shapes in GPU interpret mode with race detection; outputs start as
NaN there (uninitialized_memory="nan"), so an unwritten row fails, and rows
outside every group must come back exactly 0 even where a holds NaN. Lowering
for CUDA at the benchmark shapes, without a GPU.
GPU: the benchmark shapes (DeepSeek-V3's expert GEMMs) against a float64
reference computed on the device; skipped without the GPU generation.

Each test skips while its backend module lacks the op (what jax_fp8.backends
checks), so the tests start running when the kernels land.

The contract the kernels are called with (jax_fp8.grouped):
  ragged_dot(a [M, K] e4m3, a_scale [M, ceil(K/128)] f32, b [G, N, K] e4m3,
             b_scale [G, ceil(N/128), ceil(K/128)] f32, group_sizes [G] int32, *,
             out_dtype) -> [M, N] out_dtype
  masked_dot(a [G, M, K], a_scale [G, M, ceil(K/128)], b [G, N, K],
             b_scale [G, ceil(N/128), ceil(K/128)], masked_m [G] int32, *,
             out_dtype) -> [G, M, N]
with normalised sizes (every group size >= 0 and their sum <= M; 0 <= masked_m
<= M) that live on the device; rows past the sum / at and past masked_m[g] must
be written as 0.
"""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import requires_gpu

import jax_fp8
from jax_fp8 import backends, testing

FP8 = jnp.float8_e4m3fn
BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float32)
KERNEL_MODULES = {name: importlib.import_module(backends.BACKENDS[name].module)
                  for name in ("pallas_sm90", "pallas_sm100")}
OPS = {"ragged": "ragged_dot", "masked": "masked_dot"}


def _missing(backend, op):
  return not hasattr(KERNEL_MODULES[backend], OPS[op])


def _params(op, *, gpu=False):
  """The two Pallas backends, each skipped while its `op` kernel is missing (and,
  for GPU tests, without its GPU generation)."""
  params = []
  for backend, major in (("pallas_sm90", 9), ("pallas_sm100", 10)):
    marks = [pytest.mark.skipif(
        _missing(backend, op),
        reason=f"{KERNEL_MODULES[backend].__name__} has no {OPS[op]} kernel yet")]
    if gpu:
      marks.append(requires_gpu(major=major))
    params.append(pytest.param(backend, marks=marks, id=backend))
  return params


def _call(op, backend, out_dtype, **hints):
  """hints: the masked op's expected_m."""
  fn = jax_fp8.blockwise_fp8_ragged_dot if op == "ragged" else jax_fp8.blockwise_fp8_masked_dot
  return lambda *x: fn(*x, out_dtype=out_dtype, backend=backend, **hints)


def _interpret(fn, *args):
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    return jax.block_until_ready(jax.jit(fn)(*args))


# ---- CPU: GPU interpret mode -------------------------------------------------------------

# (M, N, K, group_sizes, out_dtype): groups that start and end inside tiles, an
# empty group, one row, 129 rows (a tile and one row), rows past the sum; all
# rows in one group; partial N and K blocks. (The kernels' own tests, with small
# tiles and several CTAs: test_kernel_variants.py; these go through the API.)
RAGGED_INTERPRET = [
    (200, 192, 384, [37, 0, 1, 129, 3], F32),
    (130, 136, 300, [0, 130, 0], BF16),
]


@pytest.mark.parametrize("backend", _params("ragged"))
@pytest.mark.parametrize("m,n,k,sizes,out_dtype", RAGGED_INTERPRET)
def test_ragged_interpret(backend, m, n, k, sizes, out_dtype):
  ops = testing.random_ragged_operands(m + k, m, n, k, sizes)
  end = sum(sizes)
  ops.a = ops.a.at[end:].set(jnp.nan)  # rows past the sum: never read
  out = _interpret(_call("ragged", backend, out_dtype), *ops.args())
  assert out.shape == (m, n) and np.dtype(out.dtype) == out_dtype
  testing.assert_close(out, testing.reference_ragged_f64(*ops.args()), out_dtype)
  assert np.all(np.asarray(out[end:], np.float32) == 0)


# (G, M, N, K, masked_m, out_dtype): an empty group, a full one, odd counts.
MASKED_INTERPRET = [
    (3, 130, 136, 256, [0, 130, 65], F32),
    (2, 64, 192, 300, [1, 63], BF16),
]


@pytest.mark.parametrize("backend", _params("masked"))
@pytest.mark.parametrize("g,m,n,k,masked_m,out_dtype", MASKED_INTERPRET)
def test_masked_interpret(backend, g, m, n, k, masked_m, out_dtype):
  ops = testing.random_masked_operands(g + m + k, m, n, k, masked_m)
  for i, rows in enumerate(masked_m):
    ops.a = ops.a.at[i, rows:].set(jnp.nan)
  out = _interpret(_call("masked", backend, out_dtype), *ops.args())
  assert out.shape == (g, m, n) and np.dtype(out.dtype) == out_dtype
  testing.assert_close(out, testing.reference_masked_f64(*ops.args()), out_dtype)
  for i, rows in enumerate(masked_m):
    assert np.all(np.asarray(out[i, rows:], np.float32) == 0)


@pytest.mark.parametrize("backend", _params("ragged")[:1])   # the API's part: one kernel
def test_ragged_interpret_device_values_outside_the_contract(backend):
  # The API normalises: negative sizes count as 0, the groups are cut at M.
  ops = testing.random_ragged_operands(5, 100, 128, 256, [0, 0, 0])
  out = _interpret(_call("ragged", backend, F32), *ops.args()[:4],
                   jnp.asarray([40, -3, 90], jnp.int32))
  testing.assert_close(out, testing.reference_ragged_f64(*ops.args()[:4], [40, 0, 60]), F32)


# ---- CPU: lowering for CUDA (Mosaic GPU), no GPU needed ------------------------------------

def _avals(op, g, m, n, k):
  kb, nb = -(-k // 128), -(-n // 128)
  lead = () if op == "ragged" else (g,)
  return [jax.ShapeDtypeStruct((*lead, m, k), FP8),
          jax.ShapeDtypeStruct((*lead, m, kb), jnp.float32),
          jax.ShapeDtypeStruct((g, n, k), FP8), jax.ShapeDtypeStruct((g, nb, kb), jnp.float32),
          jax.ShapeDtypeStruct((g,), jnp.int32)]


@pytest.mark.parametrize("op,g,m,n,k", [
    ("ragged", 8, 32768, 4096, 7168), ("ragged", 4, 32768, 7168, 2048),
    ("ragged", 3, 1000, 7000, 1000),    # odd everything
    ("masked", 32, 128, 4096, 7168), ("masked", 2, 1024, 7168, 2048),
])
def test_lowers_for_cuda(op, g, m, n, k):
  if _missing("pallas_sm90", op):
    pytest.skip(f"{KERNEL_MODULES['pallas_sm90'].__name__} has no {OPS[op]} kernel yet")
  lowered = jax.jit(_call(op, "pallas_sm90", BF16)).trace(*_avals(op, g, m, n, k)).lower(
      lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


def test_expected_m_reaches_the_hopper_tiling(monkeypatch):
  """The masked op's expected_m is the Hopper kernel's tiling hint (lowered for
  CUDA, no GPU): the default config is asked with it."""
  if _missing("pallas_sm90", "masked"):
    pytest.skip(f"{KERNEL_MODULES['pallas_sm90'].__name__} has no masked_dot kernel yet")
  from jax_fp8.pallas import hopper_tiling
  asked, default_config = [], hopper_tiling.default_config

  def spy(*args, **kwargs):
    asked.append(kwargs.get("expected_m"))
    return default_config(*args, **kwargs)
  monkeypatch.setattr(hopper_tiling, "default_config", spy)
  fn = _call("masked", "pallas_sm90", BF16, expected_m=256)
  lowered = jax.jit(fn).trace(*_avals("masked", 8, 2048, 4096, 7168)).lower(
      lowering_platforms=("cuda",))
  assert asked == [256] and "mosaic_gpu" in lowered.as_text()


# ---- GPU: the benchmark shapes ---------------------------------------------------------------

# FP8 tensor cores add a 128-deep block with about 14 significant bits: float32
# outputs on the GPU are bounded by 2.5e-4 (as for the dense kernels).
GPU_TOL = {BF16: testing.TOLERANCE[BF16], F32: 2.5e-4}
DEEPSEEK_EXPERT_NK = ((4096, 7168), (7168, 2048))   # gate/up, down


def _gpu_operands(seed, lead, m, n, k, g):
  """Random operands made on the device (fast there; host numpy would be slow at
  the benchmark shapes)."""
  keys = jax.random.split(jax.random.key(seed), 4)
  kb, nb = -(-k // 128), -(-n // 128)
  a = (jax.random.normal(keys[0], (*lead, m, k)) * 64).astype(FP8)
  b = (jax.random.normal(keys[1], (g, n, k)) * 64).astype(FP8)
  sa = jnp.exp2(jax.random.uniform(keys[2], (*lead, m, kb), minval=-12.0, maxval=-4.0))
  sb = jnp.exp2(jax.random.uniform(keys[3], (g, nb, kb), minval=-12.0, maxval=-4.0))
  return a, sa, b, sb


def _host_operands(seed, lead, m, n, k, g):
  """The same operands from numpy (fast on the CPU: no jax.random compilations)."""
  rng = np.random.default_rng(seed)
  kb, nb = -(-k // 128), -(-n // 128)
  return (jnp.asarray(testing.random_fp8(rng, (*lead, m, k))),
          jnp.asarray(testing.random_scales(rng, (*lead, m, kb))),
          jnp.asarray(testing.random_fp8(rng, (g, n, k))),
          jnp.asarray(testing.random_scales(rng, (g, nb, kb))))


def _f64_rows(a, sa, b, sb):
  """The contract in float64 on the device: rows a [R, K] times b [N, K]^T."""
  n, k = b.shape
  a64 = a.astype(jnp.float64) * jnp.repeat(sa.astype(jnp.float64), 128, axis=1)[:, :k]
  sbf = jnp.repeat(jnp.repeat(sb.astype(jnp.float64), 128, 0), 128, 1)[:n, :k]
  return jnp.dot(a64, (b.astype(jnp.float64) * sbf).T, precision="highest")


def _gpu_check(out, ref_rows, out_dtype, what):
  """out against float64 references of some of its rows, [(index, float64 rows)]:
  the relative Frobenius error within the GPU bound, and every other row exactly 0."""
  with jax.enable_x64(True):
    o = out.astype(jnp.float64)
    assert bool(jnp.all(jnp.isfinite(o))), f"{what}: non-finite output"
    diff, norm = 0.0, 0.0
    covered = jnp.zeros(o.shape[:-1], bool)
    for index, ref in ref_rows:
      diff += float(jnp.sum((o[index] - ref) ** 2))
      norm += float(jnp.sum(ref ** 2))
      covered = covered.at[index].set(True)
    outside = jnp.any(~covered[..., None] & (o != 0))
    assert not bool(outside), f"{what}: rows outside the groups are not 0"
  err = float(np.sqrt(diff / norm))
  assert err <= GPU_TOL[out_dtype], f"{what}: relative error {err:.3e}"


def _gpu_ragged(backend, sizes, n, k, out_dtype, seed=0, m=None, operands=_gpu_operands):
  sizes = np.asarray(sizes, np.int32)
  m = int(sizes.sum()) if m is None else m
  a, sa, b, sb = operands(seed, (), m, n, k, len(sizes))
  end = int(sizes.sum())
  a = a.at[end:].set(jnp.nan)  # rows past the sum: must come back 0
  out = jax.jit(_call("ragged", backend, out_dtype))(a, sa, b, sb, jnp.asarray(sizes))
  assert out.shape == (m, n) and np.dtype(out.dtype) == out_dtype
  refs, start = [], 0
  with jax.enable_x64(True):
    for g, size in enumerate(sizes):
      if size:
        rows = slice(start, start + int(size))
        refs.append((rows, _f64_rows(a[rows], sa[rows], b[g], sb[g])))
      start += int(size)
  _gpu_check(out, refs, out_dtype, f"ragged {sizes.tolist()} x {n}x{k}")
  return out


def _unaligned_sizes(seed, groups, total):
  sizes = testing.random_group_sizes(seed, total, groups)
  assert sizes.sum() == total and np.any(sizes % 128)
  return sizes


@pytest.mark.parametrize("backend", _params("ragged", gpu=True))
@pytest.mark.parametrize("n,k", DEEPSEEK_EXPERT_NK)
@pytest.mark.parametrize("groups", (4, 8))
@pytest.mark.parametrize("layout", ("aligned", "unaligned"))
def test_gpu_ragged_benchmark_shapes(backend, groups, n, k, layout):
  total = 32768
  sizes = ([total // groups] * groups if layout == "aligned"
           else _unaligned_sizes(groups + n, groups, total))
  _gpu_ragged(backend, sizes, n, k, BF16, seed=groups + n)


@pytest.mark.parametrize("backend", _params("ragged", gpu=True))
@pytest.mark.parametrize("sizes,n,k,out_dtype", [
    ([0, 1, 127, 129, 3000, 0, 5], 4096, 7168, F32),
    ([8000, 0, 192], 7168, 2048, BF16),
    ([1], 7000, 1000, F32),                          # odd N and K, one row
])
def test_gpu_ragged_odd_groups(backend, sizes, n, k, out_dtype):
  # 200 rows past the sum (NaN in a) must come back exactly 0.
  _gpu_ragged(backend, sizes, n, k, out_dtype, m=sum(sizes) + 200)


@pytest.mark.parametrize("backend", _params("ragged", gpu=True))
@pytest.mark.parametrize("m,sizes,n,k,out_dtype", [
    # up to 128 rows at small N the rules took 64 x 32 tiles with 16-column stores,
    # whose row-exact TMA stores faulted ("misaligned address")
    (128, [37, 0, 1, 60], 512, 1024, BF16),
    (128, [37, 0, 1, 60], 96, 7168, F32),
    (100, [3, 64, 33], 2112, 7168, BF16),
])
def test_gpu_ragged_few_rows(backend, m, sizes, n, k, out_dtype):
  _gpu_ragged(backend, sizes, n, k, out_dtype, m=m)


@pytest.mark.parametrize("backend", _params("ragged", gpu=True))
def test_gpu_ragged_deterministic(backend):
  sizes = _unaligned_sizes(1, 8, 8192)
  first = np.asarray(_gpu_ragged(backend, sizes, 4096, 7168, BF16, seed=3).astype(jnp.float32))
  for _ in range(2):
    again = _gpu_ragged(backend, sizes, 4096, 7168, BF16, seed=3)
    np.testing.assert_array_equal(np.asarray(again.astype(jnp.float32)), first)


# (groups, expected rows per group, N, K): the benchmark's masked rows.
MASKED_BENCHMARK = [
    (1, 1024, 4096, 7168), (2, 512, 4096, 7168), (4, 256, 7168, 2048),
    (32, 64, 4096, 7168), (32, 64, 7168, 2048),
]


def _gpu_masked(backend, groups, rows, n, k, out_dtype, operands=_gpu_operands, m=None,
                expected_m=None):
  rng = np.random.default_rng(groups * rows)
  m = m or 2 * rows                                        # the layout's capacity
  masked_m = rng.integers(int(0.7 * rows), int(1.3 * rows) + 1, size=groups).astype(np.int32)
  if groups > 2:
    masked_m[:3] = (0, m, 1)                               # empty, full, one row
  a, sa, b, sb = operands(groups + n, (groups,), m, n, k, groups)
  for g, rows_g in enumerate(masked_m):
    a = a.at[g, rows_g:].set(jnp.nan)                      # never read
  hints = {} if expected_m is None else {"expected_m": expected_m}
  out = jax.jit(_call("masked", backend, out_dtype, **hints))(a, sa, b, sb,
                                                              jnp.asarray(masked_m))
  assert out.shape == (groups, m, n) and np.dtype(out.dtype) == out_dtype
  with jax.enable_x64(True):
    refs = [((g, slice(0, int(r))), _f64_rows(a[g, :r], sa[g, :r], b[g], sb[g]))
            for g, r in enumerate(masked_m) if r]
  _gpu_check(out, refs, out_dtype, f"masked {masked_m.tolist()} x {n}x{k}")


@pytest.mark.parametrize("backend", _params("masked", gpu=True))
@pytest.mark.parametrize("groups,rows,n,k", MASKED_BENCHMARK)
@pytest.mark.parametrize("out_dtype", (BF16, F32))
def test_gpu_masked_benchmark_shapes(backend, groups, rows, n, k, out_dtype):
  _gpu_masked(backend, groups, rows, n, k, out_dtype)


# (groups, expected rows, capacity, N, K) told to the masked op (expected_m), which
# changes each one's Hopper tiling from 192 x 128 (tests/test_tiling.py) to tiles
# walked live-first: 128 x 160, 128 x 160, 128 x 192, and the decode tiles (128 x 256)
# for the last two; groups past 2 also hold 0, capacity and 1 rows, far from what
# was expected.
MASKED_HINTED = [
    (2, 512, 768, 4096, 7168), (8, 256, 2048, 4096, 7168), (4, 256, 2048, 7168, 2048),
    (8, 64, 2048, 4096, 7168), (16, 32, 2048, 7168, 2048),
]


@pytest.mark.parametrize("backend", _params("masked", gpu=True))
@pytest.mark.parametrize("groups,rows,m,n,k", MASKED_HINTED)
def test_gpu_masked_expected_m(backend, groups, rows, m, n, k):
  _gpu_masked(backend, groups, rows, n, k, BF16, m=m, expected_m=rows)


def test_gpu_checks_run_on_the_reference_backend():
  """The GPU tests' own checks, on the CPU with the reference backend (small shapes),
  so that they are known to pass a right answer and to fail wrong ones."""
  out = _gpu_ragged("reference", [0, 1, 37], 136, 300, F32, m=50, operands=_host_operands)
  _gpu_masked("reference", 3, 16, 136, 300, BF16, operands=_host_operands)
  a, sa, b, sb = _host_operands(0, (), 40, 136, 300, 2)
  with jax.enable_x64(True):
    refs = [(slice(0, 30), _f64_rows(a[:30], sa[:30], b[1], sb[1]))]
  good = jax_fp8.blockwise_fp8_ragged_dot(a, sa, b, sb, jnp.asarray([0, 30], jnp.int32),
                                          out_dtype=F32)
  _gpu_check(good, refs, F32, "right")
  for bad in (good.at[35, 0].set(1.0), good.at[3].multiply(1.01), good.at[0, 0].set(jnp.nan)):
    with pytest.raises(AssertionError):
      _gpu_check(bad, refs, F32, "wrong")
  assert out.shape == (50, 136)


@pytest.mark.parametrize("op", ["ragged", "masked"])
@requires_gpu(major=9)
def test_gpu_auto_picks_the_hopper_kernel(op):
  if _missing("pallas_sm90", op):
    pytest.skip(f"{KERNEL_MODULES['pallas_sm90'].__name__} has no {OPS[op]} kernel yet")
  name, _ = backends.select("cuda", "auto", OPS[op], m=4096, n=4096, k=7168, groups=8,
                            out_dtype=BF16, has_c=False)
  assert name == "pallas_sm90"
