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
GROUPED = os.path.join(ROOT, "benchmarks", "grouped.py")


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


# ---- first contact (issue 19): what a newcomer sees ----------------------------------

def _run_rc(script, *args, env_extra=None, timeout=120):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["JAX_PLATFORMS"] = "cpu"
  env.update(env_extra or {})
  return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, timeout=timeout,
                        capture_output=True, text=True)


def test_default_run_says_what_it_measured():
  text = _run(BENCH, "--shapes=64x128x256", "--iters=2", "--rotate_mb=0")
  assert "measured: one call of jax_fp8.blockwise_fp8_dot" in text
  assert "outputs not checked: --check compares each with a float64 reference" in text
  heads = [line for line in text.splitlines() if line.startswith("shape MxNxK")]
  assert heads and all("rel_err" not in h for h in heads)  # no column of "-"
  assert "float64 reference;" not in text and "waiting for" not in text
  assert "vs_<peer>" not in text and "vs_" not in text  # no peers, no ratio columns
  assert "summary (CPU wall clock: CPU numbers):" in text


def test_checked_run_has_rel_err_and_reference_time():
  text = _run(BENCH, "--shapes=64x128x256", "--backends=reference,bf16", "--iters=2",
              "--rotate_mb=0", "--check")
  assert "outputs not checked" not in text
  assert "for the float64 reference" in text
  head = [line for line in text.splitlines() if line.startswith("shape MxNxK")][-1]
  assert "vs_bf16" in head and head.rstrip().endswith("rel_err")
  assert "vs_<peer> = peer ms / ms" in text


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path):
  # A matplotlib that does not import, whether or not the real one is installed.
  fake = tmp_path / "fake" / "matplotlib"
  fake.mkdir(parents=True)
  (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
  png = tmp_path / "r.png"
  proc = _run_rc(BENCH, "--shapes=64x128x256", "--iters=2", "--rotate_mb=0",
                 f"--plot_out={png}", env_extra={"PYTHONPATH": str(tmp_path / "fake")})
  assert proc.returncode == 0, proc.stderr[-2000:]  # the table is the product; the plot is extra
  warnings = [line for line in proc.stdout.splitlines() if line.startswith("WARNING")]
  assert len(warnings) == 2  # before the run (no surprise at its end) and after it
  assert all("pip install '.[plot]'" in w and str(png) in w for w in warnings)
  assert "64x128x256" in proc.stdout and not png.exists()


def _short_usage_error(proc, *needles):
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) <= 3, proc.stderr  # one line and a pointer to --help, not the help
  assert "Examples:" not in proc.stderr and "Contenders" not in proc.stderr
  for needle in needles:
    assert needle in proc.stderr


def test_pallas_backend_on_cpu_points_to_interpret():
  for name in ("pallas_sm90", "pallas"):
    proc = _run_rc(BENCH, f"--backends={name}", "--shapes=64x128x256")
    _short_usage_error(proc, f"--backends={name}", "--interpret")


def test_shape_presets():
  bench_dir = os.path.join(ROOT, "benchmarks")
  if bench_dir not in sys.path:
    sys.path.insert(0, bench_dir)
  from blockwise_dot import parse_shapes
  assert len(parse_shapes("deepseek_v3", on_gpu=False)) == 18
  mid = parse_shapes("mid_m", on_gpu=False)
  # 256-1000 rows at the DeepSeek-V3 weights of K >= 4096, some with a partial row tile.
  assert len(mid) == 15 and {m for m, _, _ in mid} == {256, 300, 384, 512, 1000}
  assert all(k >= 4096 for _, _, k in mid)
  assert parse_shapes("mid_m,256x2112x7168", on_gpu=True) == mid  # duplicates dropped


def test_bad_shapes_is_a_short_error():
  _short_usage_error(_run_rc(BENCH, "--shapes=foo"), "--shapes: 'foo'", "deepseek_v3")
  _short_usage_error(_run_rc(BENCH, "--shapes=small", "stray"), "unexpected arguments")
  _short_usage_error(_run_rc(GROUPED, "--cases=masked:2x16"), "--cases")


# ---- the workloads on the harness (CPU smoke tests, reference backends) ------------------

TRAINING = os.path.join(ROOT, "benchmarks", "training.py")
MLP = os.path.join(ROOT, "benchmarks", "mlp.py")
ALTERNATE = os.path.join(ROOT, "benchmarks", "alternate.py")
FAST = ("--iters=2", "--warmup=1", "--rotate_mb=0")


def _rows(path):
  data = json.loads(path.read_text())
  assert data["platform"] == "cpu" and data["complete"] and data["failed"] == 0
  return {(r["shape"], r["backend"]): r for r in data["results"]}


def _ok(row, bound=None):
  assert row["status"] == "ok" and row["ms"] > 0 and row["tflops"] > 0, row
  assert row["check"] == "ok", row
  assert bound is None or row["rel_err"] <= bound, row


def _api_or_unavailable(row, name):
  """A jax_fp8 contender runs where jax_fp8 has the function, else says it lacks it."""
  import jax_fp8
  if hasattr(jax_fp8, name):
    _ok(row)
  else:
    assert row["status"] == "unavailable" and name in row["reason"], row


def test_grouped_benchmark(tmp_path):
  out = tmp_path / "g.json"
  text = _run(GROUPED, "--cases=contiguous:3x40x256x256:unaligned,masked:2x16x128x256", *FAST,
              f"--json_out={out}")
  assert "no GPU found" in text and "GB/s" in text
  rows = _rows(out)
  contig, masked = "contig 3x40 256x256 unaligned", "masked 2x16 128x256"
  for key in ((contig, "ragged_dot_bf16"), (contig, "dense_per_group"),
              (masked, "bf16_batched"), (masked, "dense_per_group")):
    _ok(rows[key], bound=1e-2)
  assert sum(rows[(contig, "dense_per_group")]["group_sizes"]) == 120
  assert rows[(contig, "dense_per_group")]["gbs"] > 0
  assert rows[(masked, "bf16_batched")]["contract"] == "masked"
  _api_or_unavailable(rows[(contig, "reference")], "blockwise_fp8_ragged_dot")
  _api_or_unavailable(rows[(masked, "reference")], "blockwise_fp8_masked_dot")


def test_training_benchmark(tmp_path):
  out = tmp_path / "t.json"
  _run(TRAINING, *FAST, f"--json_out={out}")
  rows = _rows(out)
  _ok(rows[("step 256x256->384", "bf16")], bound=1e-2)
  _ok(rows[("wgrad 256x384x256", "bf16")], bound=1e-2)
  _api_or_unavailable(rows[("step 256x256->384", "jax_fp8")], "dense")


def test_mlp_benchmark(tmp_path):
  out = tmp_path / "m.json"
  _run(MLP, *FAST, f"--json_out={out}")
  rows = _rows(out)
  for case in ("mlp 64x256-384", "mlp 200x256-384"):
    _ok(rows[(case, "bf16")], bound=1e-2)
    _ok(rows[(case, "jax_fp8")], bound=0.15)  # FP8 rounding: ~6e-2 for two GEMMs
    assert rows[(case, "jax_fp8")]["ratios"]["bf16"] > 0
    _api_or_unavailable(rows[(case, "jax_fp8_glu")], "blockwise_fp8_glu")


def test_alternate_runs_two_trees_and_merges(tmp_path):
  out = tmp_path / "c.json"
  proc = _run_rc(ALTERNATE, f"--old_tree={ROOT}", "--rounds=1", f"--json_out={out}",
                 "--bench_args=--shapes=64x128x256 --backends=reference --iters=2 "
                 "--rotate_mb=0", timeout=240)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "new/old = old ms / new ms" in proc.stdout
  data = json.loads(out.read_text())
  assert [(r["tree"], r["round"], r["rc"]) for r in data["runs"]] == [("old", 1, 0),
                                                                      ("new", 1, 0)]
  (entry,) = data["summary"]
  assert entry["shape"] == "64x128x256" and entry["backend"] == "reference"
  assert len(entry["old_ms"]) == len(entry["new_ms"]) == 1 and entry["new_over_old"] > 0


def test_alternate_runs_another_script(tmp_path):
  out = tmp_path / "g.json"
  proc = _run_rc(ALTERNATE, f"--old_tree={ROOT}", "--rounds=1", "--script=grouped.py",
                 f"--json_out={out}", "--bench_args=--cases=masked:2x16x128x256 "
                 "--backends=bf16_batched --iters=2 --rotate_mb=0", timeout=240)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "times as grouped.py measures them" in proc.stdout
  data = json.loads(out.read_text())
  assert data["script"] == "grouped.py"
  (entry,) = data["summary"]
  assert entry["shape"] == "masked 2x16 128x256" and entry["backend"] == "bf16_batched"
  assert entry["new_over_old"] > 0


# ---- contenders of APIs other branches are writing: called as agreed (common.md) ---------
# Stand-ins with the agreed signatures, in jnp, patched into jax_fp8 in this process; the
# workloads then run in-process and each contender's output is checked against the float64
# reference of its contract: a contender that passes arguments in the wrong order or
# layout fails here, before the real function exists.

def _in_process(workload_name, case_fn, backends):
  bench_dir = os.path.join(ROOT, "benchmarks")
  if bench_dir not in sys.path:
    sys.path.insert(0, bench_dir)
  import importlib
  from harness import env as envs
  from harness import runner
  module = importlib.import_module(f"workloads.{workload_name}")
  options_class = getattr(module, "Options", runner.Options)
  opts = options_class(cases=tuple(case_fn(module)), backends=tuple(backends), iters=1,
                       warmup=0, rotate_mb=0, check=True)
  result = runner.run(module.workload(opts), opts, envs.detect(), log=lambda line: None)
  assert result["failed"] == 0
  return {(r["shape"], r["backend"]): r for r in result["results"]}


def _dequantised(a, sa, b, sb):
  import jax
  import jax.numpy as jnp
  import jax_fp8
  deq_b = jax_fp8.dequantize_128x128
  for _ in range(b.ndim - 2):
    deq_b = jax.vmap(deq_b)
  return jax_fp8.dequantize_1x128(a, sa, jnp.float32), deq_b(b, sb)


def test_grouped_contenders_call_the_agreed_api(monkeypatch):
  import jax.numpy as jnp
  import jax_fp8

  def ragged(a, a_scale, b, b_scale, group_sizes, *, out_dtype=jnp.bfloat16, backend="auto"):
    x, w = _dequantised(a, a_scale, b, b_scale)
    ends = jnp.cumsum(jnp.maximum(group_sizes, 0))
    starts = ends - jnp.maximum(group_sizes, 0)
    rows = jnp.arange(x.shape[0])[:, None]
    out = sum(jnp.where((rows >= starts[g]) & (rows < ends[g]), x @ w[g].T, 0)
              for g in range(w.shape[0]))
    return out.astype(out_dtype)

  hints = []

  def masked(a, a_scale, b, b_scale, masked_m, *, out_dtype=jnp.bfloat16, backend="auto",
             expected_m=None):
    hints.append(expected_m)
    x, w = _dequantised(a, a_scale, b, b_scale)
    rows = jnp.arange(x.shape[1])[None, :, None]
    out = jnp.einsum("gmk,gnk->gmn", x, w)
    return jnp.where(rows < masked_m[:, None, None], out, 0).astype(out_dtype)

  monkeypatch.setattr(jax_fp8, "blockwise_fp8_ragged_dot", ragged, raising=False)
  monkeypatch.setattr(jax_fp8, "blockwise_fp8_masked_dot", masked, raising=False)
  rows = _in_process("grouped", lambda g: [g.contiguous_case(3, 50, 256, 256, False, 0),
                                           g.masked_case(2, 20, 128, 256, 0)],
                     ["reference", "auto", "dense_per_group"])
  for (case, name), row in rows.items():
    _ok(row, bound=4e-3)
  assert {name for _, name in rows} == {"reference", "auto", "dense_per_group"}
  assert hints and set(hints) == {20}  # told the nominal rows, as DeepGEMM is


def test_training_contenders_call_the_agreed_api(monkeypatch):
  import jax.numpy as jnp
  import jax_fp8

  def dense(x, kernel, *, out_dtype=None):
    return (x @ kernel).astype(out_dtype or x.dtype)

  def dot(a, a_scale, b, b_scale, c=None, *, beta=1.0, out_dtype=jnp.bfloat16,
          backend="auto", b_scale_block=(128, 128)):
    assert tuple(b_scale_block) == (1, 128) and out_dtype == jnp.float32
    x, w = jax_fp8.dequantize_1x128(a, a_scale), jax_fp8.dequantize_1x128(b, b_scale)
    out = x @ w.T
    return (out if c is None else out + beta * c).astype(out_dtype)

  monkeypatch.setattr(jax_fp8, "dense", dense, raising=False)
  monkeypatch.setattr(jax_fp8, "blockwise_fp8_dot", dot)
  rows = _in_process("training", lambda t: [t.step_case(128, 128, 256),
                                            t.wgrad_case(256, 128, 256)],
                     ["jax_fp8", "jax_fp8_acc", "bf16"])
  _ok(rows[("step 128x128->256", "jax_fp8")], bound=1e-2)
  _ok(rows[("wgrad 128x256x256", "jax_fp8")], bound=1e-5)
  _ok(rows[("wgrad 128x256x256", "jax_fp8_acc")], bound=1e-5)


def test_mlp_fused_contenders_call_the_agreed_api(monkeypatch):
  import jax
  import jax.numpy as jnp
  import jax_fp8

  def glu(a, a_scale, b, b_scale, *, activation="silu", out_dtype=jnp.bfloat16):
    assert activation == "silu"
    x, w = _dequantised(a, a_scale, b, b_scale)
    h = x @ w.T
    f = h.shape[1] // 2
    act = jax.nn.silu(h[:, :f]) * h[:, f:]  # gate rows first (workloads.mlp.GLU_ORDER)
    if out_dtype == jnp.float8_e4m3fn:
      return jax_fp8.quantize_1x128(act)
    return act.astype(out_dtype)

  monkeypatch.setattr(jax_fp8, "blockwise_fp8_glu", glu, raising=False)
  rows = _in_process("mlp", lambda m: [m.case(64, 256, 384)],
                     ["jax_fp8", "jax_fp8_glu", "jax_fp8_glu_fp8"])
  for row in rows.values():
    _ok(row, bound=0.15)
