"""The FFI backend (jax_fp8.ffi): the CUDA source builds cleanly for sm_89 and sm_90a (CPU),
the build/registration plumbing, and on a GPU the kernel against the float64 reference."""
import ctypes
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import gpu_compute_capability, requires_gpu

import jax_fp8
import jax_fp8.ffi as jffi
from jax_fp8 import testing

F32, BF16 = jnp.float32, jnp.bfloat16


# ---- Building (CPU: nvcc only) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
  try:
    jffi.find_nvcc()
  except jffi.NvccNotFoundError as e:
    pytest.skip(str(e))
  return tmp_path_factory.mktemp("ffi_build")


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_source_builds_without_warnings_or_spills(build_dir, arch):
  lib = jffi.build(arch, out_dir=build_dir)
  log = jffi.build_log(lib)
  warnings = [line for line in log.splitlines()
              if "warning" in line.lower() and ("blockwise_fp8" in line or "ptxas" in line)]
  assert not warnings, "compiler warnings:\n" + "\n".join(warnings)
  spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
  gemms = re.findall(r"Compiling entry function '(\S*blockwise_fp8_gemm\S*)'", log)
  assert len(gemms) == 4, f"expected 4 GEMM instantiations (2 out dtypes x 2 loaders): {gemms}"
  hopper = re.findall(r"Compiling entry function '(\S*hopper_fp8_gemm\S*)'", log)
  # The TMA + WGMMA kernel (2 out dtypes) exists only in the sm_90a build.
  assert len(hopper) == (2 if arch == "sm_90a" else 0), f"WGMMA kernels: {hopper}"
  assert spills and all(s == ("0", "0") for s in spills), f"register spills: {spills}\n{log}"
  assert "bytes stack frame" in log and not re.search(r"[1-9]\d* bytes stack frame", log)
  assert hasattr(ctypes.CDLL(lib), jffi.SYMBOL)  # the handler is exported unmangled


def test_build_is_cached(build_dir):
  first = jffi.build("sm_90a", out_dir=build_dir)
  mtime = os.stat(first).st_mtime_ns
  assert jffi.build("sm_90a", out_dir=build_dir) == first
  assert os.stat(first).st_mtime_ns == mtime  # not rebuilt


def test_build_error_carries_nvcc_output(build_dir, tmp_path, monkeypatch):
  bad = tmp_path / "broken.cu"
  bad.write_text("this is not C++;\n")
  monkeypatch.setattr(jffi, "SOURCE", bad)
  with pytest.raises(jffi.BuildError, match="(?s)nvcc failed.*error"):
    jffi.build("sm_90a", out_dir=tmp_path / "out")


def _hide_nvcc(monkeypatch, tmp_path):
  monkeypatch.setenv("PATH", str(tmp_path))
  monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
  monkeypatch.delenv("CUDA_PATH", raising=False)
  monkeypatch.setattr(jffi, "DEFAULT_CUDA_HOMES", ())
  monkeypatch.setattr(jffi, "_wheel_nvcc_candidates", lambda: [])


def test_missing_nvcc_says_how_to_get_one(monkeypatch, tmp_path):
  _hide_nvcc(monkeypatch, tmp_path)
  with pytest.raises(jffi.NvccNotFoundError, match="pip install nvidia-cuda-nvcc-cu12"):
    jffi.build("sm_90a", out_dir=tmp_path)


def test_unsupported_reason_when_nvcc_is_missing(monkeypatch, tmp_path):
  _hide_nvcc(monkeypatch, tmp_path)
  monkeypatch.setattr(jffi, "_device_arch", lambda: "sm_90a")
  jffi._load.cache_clear()
  try:
    reason = jffi.unsupported_reason("blockwise_fp8_dot", 128, 128, 128, out_dtype=BF16, has_c=False)
  finally:
    jffi._load.cache_clear()
  assert reason is not None and "nvcc" in reason and "CUDA_HOME" in reason


def test_unsupported_reason_checks_out_dtype_and_size():
  assert "out_dtype" in jffi.unsupported_reason("blockwise_fp8_dot", 8, 8, 8, out_dtype=jnp.float16, has_c=False)
  assert "2**30" in jffi.unsupported_reason("blockwise_fp8_dot", 2**30, 8, 8, out_dtype=F32, has_c=False)


@pytest.mark.parametrize("cc,arch", [("8.9", "sm_89"), ("9.0", "sm_90a"), ((10, 0), "sm_100a"),
                                     ("12.0", "sm_120a")])
def test_arch_for_compute_capability(cc, arch):
  assert jffi.arch_for_compute_capability(cc) == arch


def test_arch_below_fp8_tensor_cores_is_refused():
  with pytest.raises(ValueError, match="8.9"):
    jffi.arch_for_compute_capability("8.0")
  with pytest.raises(ValueError, match="arch must look like"):
    jffi.build("compute_90", out_dir="/nonexistent")


def test_split_k_only_for_grids_smaller_than_the_gpu():
  assert jffi.num_splits(4096, 7168, 2048, 132) == 1
  splits = jffi.num_splits(64, 2112, 7168, 132)  # 17 tiles, 56 K blocks
  assert 1 < splits and 17 * splits <= 132
  assert jffi.num_splits(64, 128, 256, 132) == 1  # two K blocks: not worth a split


def test_lowers_for_cuda_without_a_gpu():
  f = lambda a, sa, b, sb, c: jffi.ffi_call(a, sa, b, sb, c, beta=0.5, out_dtype=np.dtype(BF16),
                                            splits=3)
  args = [jax.ShapeDtypeStruct(s, d) for s, d in [
      ((129, 1000), jnp.float8_e4m3fn), ((129, 8), F32), ((200, 1000), jnp.float8_e4m3fn),
      ((2, 8), F32), ((129, 200), BF16)]]
  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert f"@{jffi.TARGET_NAME}" in text
  for attr in ("beta = 5.000000e-01 : f32", "has_c = 1 : i32", "splits = 3 : i32"):
    assert attr in text
  assert "tensor<77400xf32>" in text  # the split-K workspace: 3 * 129 * 200


@pytest.mark.skipif(jffi._device_arch() is not None, reason="checks the no-GPU answer")
def test_explicit_ffi_backend_on_cpu_says_why():
  ops = testing.random_operands(0, 8, 8, 8)
  with pytest.raises(jax_fp8.BackendUnavailableError, match="ffi"):
    jax_fp8.blockwise_fp8_dot(*ops.args()[:4], backend="ffi")


# ---- On the GPU ---------------------------------------------------------------------------------

DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
               (7168, 2048)]
DEEPSEEK = [(m, n, k) for m in (64, 128, 4096) for n, k in DEEPSEEK_NK]
# Every odd M, N and K value at least twice, unaligned everywhere, tiny to large.
ODD = [(1, 8, 16), (3, 2112, 1000), (129, 7000, 7168), (4097, 8, 7168), (1, 7000, 1000),
       (3, 8, 7168), (129, 2112, 16), (4097, 2112, 1000), (129, 8, 1000), (4097, 7000, 16),
       (1, 2112, 7168), (3, 7000, 16)]


# FP8 WGMMA adds a 128-deep K block with about 14 significant bits before the f32 promotion
# (cuBLAS alike), so f32 outputs of the Hopper kernel carry ~1.3e-4 relative error: the bound
# tests/test_pallas_sm90.py uses for its WGMMA kernel. The mma.sync kernel keeps 1e-5.
WGMMA_F32_TOL = 2.5e-4


def _runs_wgmma(k):
  """Whether the FFI handler takes its Hopper WGMMA kernel for this K (jax buffers are
  always 16-byte aligned)."""
  return (gpu_compute_capability() == (9, 0) and k % 16 == 0
          and os.environ.get("JAX_FP8_FFI_DISABLE_WGMMA", "0") in ("", "0"))


def _tol(out_dtype, k):
  if np.dtype(out_dtype) == np.dtype(F32) and _runs_wgmma(k):
    return WGMMA_F32_TOL
  return None  # testing.TOLERANCE


def _variant(i):
  """(out_dtype, with_c, beta) cycling over the four combinations."""
  return [(BF16, False, 1.0), (F32, True, -0.5), (F32, False, 1.0), (BF16, True, 2.0)][i % 4]


def _check(m, n, k, seed, out_dtype, with_c, beta):
  ops = testing.random_operands(seed, m, n, k, with_c=with_c, c_dtype=BF16)
  ref = testing.reference_f64(*ops.args()[:4])
  if with_c:  # c of the product's size, so that both terms matter
    ops.c = (ops.c.astype(F32) * np.float32(np.std(ref) + 1e-30)).astype(BF16)
    ref = ref + beta * np.asarray(ops.c.astype(F32), np.float64)
  kwargs = dict(beta=beta) if with_c else {}
  with jffi.poisoned_outputs():
    f = jax.jit(lambda a, sa, b, sb, c: jax_fp8.blockwise_fp8_dot(
        a, sa, b, sb, c, out_dtype=out_dtype, backend="ffi", **kwargs))
    out = f(*ops.args())
  testing.assert_close(out, ref, out_dtype, tol=_tol(out_dtype, k))
  return ops, f, out


@requires_gpu()
@pytest.mark.parametrize("i,shape", list(enumerate(DEEPSEEK)), ids=lambda x: str(x))
def test_deepseek_v3_shapes(i, shape):
  _check(*shape, i, *_variant(i))


@requires_gpu()
@pytest.mark.parametrize("i,shape", list(enumerate(ODD)), ids=lambda x: str(x))
def test_odd_shapes(i, shape):
  _check(*shape, 100 + i, *_variant(i + 1))


@requires_gpu()
@pytest.mark.parametrize("m,n,k", [(4096, 2112, 7168), (64, 2112, 7168), (129, 200, 1000)])
def test_inside_jit_between_xla_ops(m, n, k):
  """XLA ops feed the custom call and consume its output on the same stream."""
  ops = testing.random_operands(7, m, n, k, with_c=True)

  def f(a, sa, b, sb, c):
    sa2 = sa * 2.0                      # produced by XLA right before the call
    c2 = jnp.tanh(c)
    out = jax_fp8.blockwise_fp8_dot(a, sa2, b, sb, c2, beta=0.5, out_dtype=F32, backend="ffi")
    return out * 0.25 + 1.0, jnp.sum(out)  # consumed by XLA right after

  with jffi.poisoned_outputs():
    out, total = jax.jit(f)(*ops.args())
  ref = testing.reference_f64(ops.a, ops.a_scale * 2.0, ops.b, ops.b_scale,
                              jnp.tanh(ops.c), beta=0.5)
  testing.assert_close(out, ref * 0.25 + 1.0, F32, tol=_tol(F32, k))
  np.testing.assert_allclose(float(total), ref.sum(), rtol=1e-3,
                             atol=1e-5 * np.abs(ref).sum())


@requires_gpu()
@pytest.mark.parametrize("k,all_splits", [(1300, (1, 3, 11)), (1280, (1, 3, 10))])
def test_split_k_equals_one_pass(k, all_splits):
  """K = 1300 runs the mma.sync kernel everywhere; K = 1280 the WGMMA kernel on Hopper."""
  # ffi_call does not build or register the kernel: this test may run first in its process.
  _, reason = jffi._load()
  assert reason is None, reason
  ops = testing.random_operands(9, 70, 300, k, with_c=True)
  ref = testing.reference_f64(*ops.args(), beta=-1.0)
  outs = []
  with jffi.poisoned_outputs():
    for splits in all_splits:
      f = jax.jit(lambda a, sa, b, sb, c, s=splits: jffi.ffi_call(
          a, sa, b, sb, c, beta=-1.0, out_dtype=np.dtype(F32), splits=s))
      outs.append(f(*ops.args()))
      testing.assert_close(outs[-1], ref, F32, tol=_tol(F32, k))


@requires_gpu()
@pytest.mark.parametrize("disable_wgmma", [False, True])
@pytest.mark.parametrize("shape", [(4096, 2112, 7168), (300, 7000, 1040)], ids=str)
def test_both_kernels_and_determinism(monkeypatch, disable_wgmma, shape):
  """On Hopper the WGMMA kernel runs unless JAX_FP8_FFI_DISABLE_WGMMA=1 (then mma.sync): both
  must pass, and give bitwise the same output run to run."""
  if disable_wgmma:
    monkeypatch.setenv("JAX_FP8_FFI_DISABLE_WGMMA", "1")
  m, n, k = shape
  ops, f, out = _check(m, n, k, 11, BF16, True, 0.5)
  with jffi.poisoned_outputs():
    again = f(*ops.args())
  assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(again).view(np.uint16))


@requires_gpu()
def test_bad_operand_is_an_error_not_a_crash():
  jffi._load()
  ops = testing.random_operands(1, 16, 16, 32, with_c=True)
  call = jax.ffi.ffi_call(
      jffi.TARGET_NAME,
      (jax.ShapeDtypeStruct((16, 16), F32), jax.ShapeDtypeStruct((1,), F32)),
      vmap_method="sequential")
  with pytest.raises(Exception, match="c must be float32"):
    jax.block_until_ready(call(ops.a, ops.a_scale, ops.b, ops.b_scale, ops.c.astype(BF16),
                               beta=np.float32(1), has_c=np.int32(1), splits=np.int32(1),
                               group_m=np.int32(8), poison=np.int32(0)))
