"""CPU smoke tests of the benchmark scripts (benchmarks/*.py), run as `make run` does.

Each test starts the script in a fresh Python (absl flags, jax start-up and the
"no GPU found" path included) on small shapes; they take a few seconds each.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "blockwise_dot.py")
QUANT = os.path.join(ROOT, "benchmarks", "quantize.py")


def _run(script, *args, timeout=120):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # conftest's 8 virtual devices are not wanted here
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, timeout=timeout,
                        capture_output=True, text=True)
  assert proc.returncode == 0, (
      f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc.stdout


def _has_module(path):
  return os.path.isfile(os.path.join(ROOT, *path.split("/")))


def test_small_preset_reference_writes_json(tmp_path):
  out = tmp_path / "r.json"
  text = _run(BENCH, "--shapes=small", "--backends=reference,bf16,cublas_blockwise",
              "--iters=3", "--check", f"--json_out={out}")
  assert "no GPU found: CPU numbers, reference backend" in text
  assert "summary (CPU wall clock: CPU numbers" in text
  data = json.loads(out.read_text())
  assert {"device", "jax_version", "torch_version", "method", "results"} <= set(data)
  assert data["platform"] == "cpu" and data["complete"] and data["failed"] == 0
  rows = {(r["shape"], r["backend"]): r for r in data["results"]}
  assert len(rows) == 4 * 3  # 4 small shapes x 3 contenders
  for shape in ("64x128x256", "100x200x300", "128x256x512", "256x512x1024"):
    ref = rows[(shape, "reference")]
    assert ref["status"] == "ok" and ref["ms"] > 0 and ref["tflops"] > 0
    assert ref["check"] == "ok" and 0 < ref["rel_err"] <= 4e-3
    assert rows[(shape, "bf16")]["ratios"]["bf16"] == 1.0
    assert rows[(shape, "reference")]["ratios"]["bf16"] > 0
    # No GPU: the cuBLAS peer is reported, not fatal.
    assert rows[(shape, "cublas_blockwise")]["status"] == "unavailable"


def test_default_backends_and_unavailable_kernels(tmp_path):
  out = tmp_path / "r.json"
  text = _run(BENCH, "--shapes=64x128x256,1x1x1", "--backends=default,ffi", "--iters=2",
              f"--json_out={out}")
  data = json.loads(out.read_text())
  names = {(r["shape"], r["backend"]): r for r in data["results"]}
  assert {b for _, b in names} == {"reference", "ffi"}
  assert names[("64x128x256", "ffi")]["status"] == "unavailable"
  assert "unavailable: " in text


def test_bad_flags_are_usage_errors():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  for bad in ("--shapes=12x34", "--backends=cudnn"):
    proc = subprocess.run([sys.executable, BENCH, bad], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert bad.split("=")[1] in proc.stderr


def test_quantize_benchmark(tmp_path):
  out = tmp_path / "q.json"
  text = _run(QUANT, "--shapes=256x384", "--iters=2", f"--json_out={out}")
  assert "no GPU found: CPU numbers" in text
  data = json.loads(out.read_text())
  ops = {r["op"]: r for r in data["results"]}
  xla = {"copy", "quantize_1x128", "quantize_1x128_with_transpose", "quantize_128x128"}
  pallas = {"pallas_quantize_1x128", "pallas_quantize_1x128_with_transpose",
            "pallas_quantize_128x128", "pallas_quantize_128x128_with_transpose"}
  assert set(ops) == xla | pallas
  assert all(ops[o]["gbs"] > 0 for o in xla)
  assert all("need a GPU" in ops[o]["error"] for o in pallas)  # no GPU: reported, not fatal
  assert ops["copy"]["of_copy"] == 1.0
  assert ops["quantize_1x128"]["bytes"] == 256 * 384 * (2 + 1) + 256 * 3 * 4
  assert ops["pallas_quantize_1x128_with_transpose"]["bytes"] == (
      256 * 384 * (2 + 2) + (256 * 3 + 384 * 2) * 4)
  text = _run(QUANT, "--shapes=128x256", "--iters=1", "--ops=quantize_128x128")
  assert "quantize_128x128" in text and "quantize_1x128 " not in text


@pytest.mark.skipif(not (_has_module("pallas/hopper.py") or _has_module("pallas/blackwell.py")),
                    reason="no Pallas kernel module yet")
def test_interpret_runs_and_checks_the_pallas_kernels(tmp_path):
  out = tmp_path / "r.json"
  _run(BENCH, "--shapes=64x128x256,100x200x300", "--interpret", f"--json_out={out}",
       timeout=300)
  data = json.loads(out.read_text())
  pallas = [r for r in data["results"] if r["backend"].startswith("pallas")]
  assert pallas
  for r in pallas:
    if r["status"] == "unavailable":  # e.g. a module that does not import
      continue
    assert r["status"] == "interpret" and r["ms"] is None
    assert r["check"] == "ok" and r["rel_err"] <= 4e-3
  assert data["failed"] == 0
