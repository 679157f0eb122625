"""The Blackwell (tcgen05/TMEM) kernel, run on the CPU in GPU interpret mode.

Every case runs with race detection (testing.gpu_interpret_mode asserts no
race) and the interpreter's barrier check (every thread that waits on a
barrier observed every phase that completed), against the float64 reference,
on NaN-poisoned outputs' worth of checks (assert_close fails on NaN). Pipeline
depths are varied, including 1 (every ring wraps on every step) and depths
that do not divide the number of K steps, with several tiles per CTA so that
the persistent loop carries the rings' phases across tiles.
"""
import contextlib
import dataclasses
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import jax_fp8
from jax_fp8 import testing
from jax_fp8.pallas import blackwell as bw
from jax_fp8.pallas import sm100
from jax_fp8.pallas import pipeline
from conftest import requires_gpu

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float32)


def _run(ops, cfg, *, beta=1.0, out_dtype=BF16):
  def f(a, a_scale, b, b_scale, c):
    return bw.blockwise_fp8_dot(a, a_scale, b, b_scale, c, beta=beta, out_dtype=out_dtype,
                                config=cfg)
  # Uninitialised memory (outputs included) reads as NaN: an unwritten tile fails.
  out = testing.run_in_gpu_interpret_mode(f, *ops.args(), uninitialized_memory="nan")
  assert out.shape == (ops.a.shape[0], ops.b.shape[0])
  ref = testing.reference_f64(*ops.args(), beta=beta)
  return testing.assert_close(out, ref, out_dtype)


# (m, n, k, with_c, c_dtype, out_dtype, beta, config)
CASES = {
    "aligned": (128, 128, 256, False, None, BF16, 1.0,
                bw.BlackwellConfig(input_stages=2, tmem_stages=2)),
    # 2 x 3 tiles over 2 CTAs; partial M and N tiles; rings of depth 1.
    "unaligned_c_f32_depth1": (200, 300, 256, True, jnp.float32, F32, 0.5,
                               bw.BlackwellConfig(input_stages=1, tmem_stages=1, c_stages=1,
                                                  num_ctas=2)),
    # Partial last K block (K % 128 = 72, K % 16 = 8: padded by the wrapper).
    "partial_k_c_bf16": (136, 128, 328, True, jnp.bfloat16, BF16, -0.75,
                         bw.BlackwellConfig(input_stages=3, tmem_stages=3, num_ctas=1)),
    # tile_n = 256: two 128-column halves with their own b_scale; TMEM full (2 x 256).
    "tile_n256_halves": (128, 384, 256, True, jnp.float32, BF16, 1.0,
                         bw.BlackwellConfig(tile_n=256, input_stages=2, tmem_stages=2,
                                            num_ctas=1)),
    # Narrow tiles, one epilogue piece per tile (single output SMEM slot), M < tile_m.
    "tile_n64_small_m": (72, 200, 384, False, None, F32, 1.0,
                         bw.BlackwellConfig(tile_n=64, epi_tile_n=64, input_stages=4,
                                            tmem_stages=4, num_ctas=2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_cases(name):
  m, n, k, with_c, c_dtype, out_dtype, beta, cfg = CASES[name]
  ops = testing.random_operands(list(CASES).index(name), m, n, k, with_c=with_c,
                                c_dtype=c_dtype or jnp.float32)
  _run(ops, cfg, beta=beta, out_dtype=out_dtype)


@pytest.mark.parametrize("input_stages,tmem_stages", [(1, 2), (2, 1), (3, 4)])
def test_pipeline_depths(input_stages, tmem_stages):
  # 3 K blocks per tile, 2 tiles per CTA: 6 steps through each ring.
  ops = testing.random_operands(7, 256, 128, 384, with_c=True)
  cfg = bw.BlackwellConfig(input_stages=input_stages, tmem_stages=tmem_stages, num_ctas=1)
  _run(ops, cfg, beta=2.0, out_dtype=F32)


def test_public_entry_point_default_config():
  ops = testing.random_operands(11, 2, 72, 256, batch=(3,), with_c=True)
  with testing.gpu_interpret_mode(uninitialized_memory="nan"):
    out = jax.jit(lambda *xs: jax_fp8.blockwise_fp8_dot(
        *xs, beta=0.25, out_dtype=jnp.bfloat16, backend="pallas_sm100"))(*ops.args())
    out = jax.block_until_ready(out)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.25), BF16)


def test_race_detector_sees_a_missing_wait(monkeypatch):
  """Proof that these tests can fail: an epilogue that reads the A-scales
  without waiting for their stage to land is reported as a race."""
  @contextlib.contextmanager
  def no_input_wait(self, step):
    tst, ist = self.mma.tmem_pipe.stage(step), self.inputs.stage(step)
    self.mma.tmem_pipe.wait_producer(tst)
    yield pipeline.EpilogueKStage(self.mma.stage_ref(tst.index), tst, ist)
    plgpu.wait_load_tmem()
    self.mma.tmem_pipe.release(tst)
    self.inputs.release(ist)

  monkeypatch.setattr(pipeline.EpilogueKContext, "per_k_stage", no_input_wait)
  ops = testing.random_operands(3, 128, 128, 256)
  with pytest.raises(AssertionError, match="race"):
    _run(ops, bw.BlackwellConfig(input_stages=1, tmem_stages=1, num_ctas=1))


@pytest.mark.xfail(
    tuple(int(v) for v in jax.__version__.split(".")[:2]) >= (0, 12), strict=True,
    reason="jax >= 0.12's interpreter checks a barrier's phases when a warpgroup allocates "
           "another barrier, so a drain missing at kernel exit goes unreported")
def test_missing_drain_is_reported(monkeypatch):
  """A producer that leaves without observing the last releases fails the
  interpreter's barrier-phase check."""
  monkeypatch.setattr(pipeline.ProducerConsumerPipeline, "wait_last_releases",
                      lambda self, total_steps: None)
  ops = testing.random_operands(4, 128, 128, 256)
  with pytest.raises(Exception, match="observed barrier up to phase"):
    _run(ops, bw.BlackwellConfig(input_stages=1, tmem_stages=1, num_ctas=1))


def test_unsupported_reason():
  assert bw.unsupported_reason("blockwise_fp8_dot", 100, 200, 300, out_dtype=BF16, has_c=True) is None
  assert bw.unsupported_reason("blockwise_fp8_dot", 1, 1, 1, out_dtype=F32, has_c=False) is None
  assert "out_dtype" in bw.unsupported_reason("blockwise_fp8_dot", 128, 128, 128, out_dtype=np.dtype(np.float16),
                                              has_c=False)
  assert "empty" in bw.unsupported_reason("blockwise_fp8_dot", 0, 128, 128, out_dtype=BF16, has_c=False)


@pytest.mark.parametrize("field,value,match", [
    ("tile_m", 64, "tile_m"), ("tile_n", 96, "tile_n"), ("epi_tile_n", 48, "epi_tile_n"),
    ("tmem_stages", 3, "tmem_stages"), ("input_stages", 0, "input_stages"),
    ("num_ctas", 0, "num_ctas")])
def test_config_check_names_the_field(field, value, match):
  cfg = dataclasses.replace(bw.BlackwellConfig(tile_n=256), **{field: value})
  with pytest.raises(ValueError, match=match):
    cfg.check()


def test_default_config_fits_smem():
  for out_dtype in (BF16, F32):
    for c_dtype in (None, F32):
      cfg = sm100.default_config(4096, 7168, 2048, out_dtype=out_dtype, c_dtype=c_dtype)
      cfg.check()
      assert cfg.smem_bytes(out_dtype, c_dtype) <= bw.SMEM_BYTES


def test_config_over_smem_is_refused():
  ops = testing.random_operands(6, 128, 128, 128, with_c=True)
  cfg = bw.BlackwellConfig(tile_n=256, input_stages=5)
  with pytest.raises(ValueError, match="shared memory"):
    bw.blockwise_fp8_dot(*ops.args(), beta=1.0, out_dtype=BF16, config=cfg)


def test_lowers_for_cuda_without_gpu():
  """Tracing, layout inference and Mosaic GPU lowering (no compilation)."""
  s = jax.ShapeDtypeStruct
  args = (s((256, 512), jnp.float8_e4m3fn), s((256, 4), jnp.float32),
          s((256, 512), jnp.float8_e4m3fn), s((2, 4), jnp.float32), s((256, 256), jnp.float32))
  f = lambda a, sa, b, sb, c: sm100.blockwise_fp8_dot(a, sa, b, sb, c, beta=1.0, out_dtype=BF16)
  text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "tcgen05" in text


@requires_gpu(major=10)
def test_on_blackwell_gpu():
  ops = testing.random_operands(5, 1000, 1500, 2000, with_c=True)
  out = jax_fp8.blockwise_fp8_dot(*ops.args(), beta=0.5, out_dtype=jnp.bfloat16,
                                  backend="pallas_sm100")
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), BF16)


@requires_gpu(major=9)
@pytest.mark.parametrize("flags", [[], ["--with_c", "--out_dtype=float32"]])
def test_cross_compiles_for_sm100a(flags):
  """Compile-only (there is no Blackwell GPU here): on a Hopper machine,
  tools/xcompile_sm100.py compiles the kernel for sm_100a and checks its PTX."""
  tool = pathlib.Path(__file__).resolve().parent.parent / "tools" / "xcompile_sm100.py"
  run = subprocess.run([sys.executable, str(tool), *flags], capture_output=True, text=True,
                       timeout=600)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
  report = json.loads(run.stdout.strip().splitlines()[-1])
  assert report["target_sm_100a"] and report["tcgen05_mma_f8f6f4"] > 0, report
