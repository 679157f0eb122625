#!/usr/bin/env python3
"""A benchmark of two checkouts, alternated, for a no-regression check.

Runs benchmarks/blockwise_dot.py (or another --script: grouped.py, training.py,
mlp.py) of an old and a new source tree in turn, each
in a fresh process with the same flags (old, new, old, new, ... for --rounds
rounds), so that drift of the machine (clocks, temperature) shows as spread
instead of as a difference; then merges their JSONs into one table: per shape,
each tree's median kernel time over its rounds, the speed ratio new/old (old ms /
new ms: above 1 the new code is faster), and each tree's spread over its rounds
((max - min) / median).

Each process imports the jax_fp8 of its own tree (PYTHONPATH and the working
directory are the tree), and gets an autotune cache of its own, empty at the
start (JAX_FP8_AUTOTUNE_CACHE), so neither reuses the other's tuned configs.
The old tree needs only the script with the same flags (for blockwise_dot.py any
checkout since the 18-shape preset and --json_out, e.g. `git archive main` unpacked
into scratch/old, which git ignores).

  python benchmarks/alternate.py --old_tree=scratch/old --rounds=2 \\
      --bench_args="--shapes=deepseek_v3 --backends=pallas --iters=20" \\
      --json_out=compare.json

The grouped GEMMs run other paths of the kernels (their schedulers): compare them too,

  python benchmarks/alternate.py --old_tree=scratch/old --script=grouped.py \\
      --bench_args="--cases=deepseek_v3 --backends=pallas --iters=20"

Exit status: 1 if a run failed (no results, or its checks failed), or if a shape
is slower than --fail_below (new/old) when that is set; 2 if interrupted; else 0.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
HERE = os.path.dirname(os.path.abspath(__file__))


def define_flags():
  flags.DEFINE_string("old_tree", None, "root of the old checkout (holds jax_fp8/ and "
                      "benchmarks/<script>)")
  flags.DEFINE_string("new_tree", os.path.dirname(HERE), "root of the new checkout (default: "
                      "this one)")
  flags.DEFINE_integer("rounds", 2, "rounds of (old, new)")
  flags.DEFINE_string("script", "blockwise_dot.py", "the benchmark under benchmarks/ of both "
                      "trees: any whose --json_out rows carry shape, backend and ms "
                      "(blockwise_dot.py, grouped.py, training.py, mlp.py)")
  flags.DEFINE_string("bench_args", "--shapes=deepseek_v3 --backends=pallas --iters=20",
                      "flags of the script, the same for both trees")
  flags.DEFINE_string("json_out", None, "write the merged results (and every run's) as JSON")
  flags.DEFINE_float("time_budget_s", 0.0, "start no new run after this many seconds, and "
                     "stop a run at it (0: no limit)")
  flags.DEFINE_float("fail_below", 0.0, "exit 1 if a shape's new/old speed ratio is below this "
                     "(e.g. 0.98; 0: report only)")
  flags.DEFINE_bool("shared_autotune_cache", False, "let both trees use the environment's "
                    "autotune cache instead of an empty one each")


def _commit(tree: str) -> str | None:
  try:
    out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() or None if out.returncode == 0 else None


def run_tree(label, tree, script, bench_args, json_path, work_dir, timeout, shared_cache):
  """One fresh process of `tree`'s benchmarks/<script>; returns the run's record."""
  env = dict(os.environ)
  env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  if not shared_cache:
    env["JAX_FP8_AUTOTUNE_CACHE"] = os.path.join(work_dir, f"autotune-{label}.json")
  cmd = [sys.executable, os.path.join(tree, "benchmarks", script), *bench_args,
         f"--json_out={json_path}"]
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=timeout)
    rc, output = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    rc = "timeout"
    output = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
              else e.stdout or "")
  record = {"tree": label, "rc": rc, "wall_s": round(time.perf_counter() - t0, 1),
            "command": shlex.join(cmd)}
  try:
    with open(json_path) as f:
      record["result"] = json.load(f)
  except (OSError, ValueError):
    record["result"] = None
  if rc != 0 or record["result"] is None:
    record["log_tail"] = output[-3000:]
  return record


def merge(runs) -> list[dict]:
  """Per (shape, backend): each tree's times over its rounds, the ratio and spreads."""
  table = {}
  for run in runs:
    for row in (run["result"] or {}).get("results", []):
      if row.get("ms") is None:
        continue
      key = (row["shape"], row.get("resolved") or row["backend"])
      entry = table.setdefault(key, {"shape": row["shape"], "backend": key[1], "flops": None,
                                     "old_ms": [], "new_ms": []})
      entry[f"{run['tree']}_ms"].append(row["ms"])
      if row.get("tflops"):
        entry["flops"] = row["tflops"] * 1e12 * row["ms"] * 1e-3
  out = []
  for entry in table.values():
    for tree in ("old", "new"):
      times = entry[f"{tree}_ms"]
      med = statistics.median(times) if times else None
      entry[f"{tree}_median_ms"] = med
      entry[f"{tree}_spread"] = (max(times) - min(times)) / med if med else None
      entry[f"{tree}_tflops"] = (entry["flops"] / (med * 1e-3) / 1e12
                                 if med and entry["flops"] else None)
    old, new = entry["old_median_ms"], entry["new_median_ms"]
    entry["new_over_old"] = old / new if old and new else None
    out.append(entry)
  return out


def _fmt(x, spec, none="-"):
  return none if x is None else format(x, spec)


def _rate(x):
  return "-" if x is None else (f"{x:.1f}" if x >= 10 else f"{x:.4f}")


def format_summary(entries, fail_below) -> str:
  head = ["shape", "backend", "old ms (rounds)", "new ms (rounds)", "old TFLOP/s",
          "new TFLOP/s", "new/old", "spread old", "spread new", ""]
  body = []
  for e in entries:
    ratio = e["new_over_old"]
    verdict = ""
    if ratio is not None and fail_below and ratio < fail_below:
      verdict = f"SLOWER (< {fail_below:g})"
    body.append([e["shape"], e["backend"], " ".join(f"{t:.4f}" for t in e["old_ms"]),
                 " ".join(f"{t:.4f}" for t in e["new_ms"]), _rate(e["old_tflops"]),
                 _rate(e["new_tflops"]), _fmt(ratio, ".3f"),
                 _fmt(e["old_spread"] and 100 * e["old_spread"], ".1f") + "%",
                 _fmt(e["new_spread"] and 100 * e["new_spread"], ".1f") + "%", verdict])
  widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
  line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
  ratios = [e["new_over_old"] for e in entries if e["new_over_old"]]
  geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
  lines = [line(head), line(["-" * w for w in widths])] + [line(r) for r in body]
  lines.append(f"geometric mean new/old: {_fmt(geo, '.3f')} over {len(ratios)} shapes; "
               + (f"min {min(ratios):.3f}" if ratios else "nothing timed in both trees"))
  return "\n".join(lines)


class _Terminated(BaseException):
  pass


def _main() -> int:
  if not FLAGS.old_tree:
    print("alternate.py: error: --old_tree is required (the checkout to compare with)",
          file=sys.stderr)
    return 1
  trees = {"old": os.path.abspath(FLAGS.old_tree), "new": os.path.abspath(FLAGS.new_tree)}
  for label, tree in trees.items():
    if not os.path.isfile(os.path.join(tree, "benchmarks", FLAGS.script)):
      print(f"alternate.py: error: --{label}_tree={tree} has no benchmarks/{FLAGS.script}",
            file=sys.stderr)
      return 1
  bench_args = shlex.split(FLAGS.bench_args)
  if any(a.startswith("--json_out") for a in bench_args):
    print("alternate.py: error: --bench_args may not set --json_out", file=sys.stderr)
    return 1
  t_start = time.perf_counter()
  runs, notes = [], []
  print(f"old: {trees['old']} ({_commit(trees['old']) or 'no git'}); "
        f"new: {trees['new']} ({_commit(trees['new']) or 'no git'})", flush=True)
  print(f"{FLAGS.script} {shlex.join(bench_args)}; {FLAGS.rounds} rounds of (old, new)",
        flush=True)

  def on_sigterm(signum, frame):
    raise _Terminated()
  signal.signal(signal.SIGTERM, on_sigterm)
  with tempfile.TemporaryDirectory(prefix="alternate-") as work_dir:
    try:
      for r in range(1, FLAGS.rounds + 1):
        for label in ("old", "new"):
          left = FLAGS.time_budget_s - (time.perf_counter() - t_start)
          if FLAGS.time_budget_s > 0 and left < 5:
            notes.append(f"--time_budget_s={FLAGS.time_budget_s:g} reached before {label} "
                         f"round {r}")
            raise StopIteration
          path = os.path.join(work_dir, f"{label}-{r}.json")
          run = run_tree(label, trees[label], FLAGS.script, bench_args, path, work_dir,
                         left if FLAGS.time_budget_s > 0 else None, FLAGS.shared_autotune_cache)
          run["round"] = r
          runs.append(run)
          timed = sum(1 for x in (run["result"] or {}).get("results", []) if x.get("ms"))
          print(f"# {label} round {r}: exit {run['rc']} after {run['wall_s']} s, "
                f"{timed} rows timed", flush=True)
          if "log_tail" in run:
            print(run["log_tail"], flush=True)
    except StopIteration:
      print(f"# {notes[-1]}", flush=True)
    except (_Terminated, KeyboardInterrupt) as e:
      notes.append(f"interrupted ({type(e).__name__}): the results are partial")
      print(f"# {notes[-1]}", flush=True)
  entries = merge(runs)
  print("")
  print("new/old = old ms / new ms (above 1: the new code is faster); spread = (max - min) / "
        f"median over a tree's rounds; times as {FLAGS.script} measures them (GPU kernel time "
        "on a GPU)")
  print(format_summary(entries, FLAGS.fail_below))
  for note in notes:
    print(f"NOTE: {note}")
  failed_runs = [f"{x['tree']} round {x['round']} (exit {x['rc']})" for x in runs
                 if x["rc"] != 0 or x["result"] is None]
  if failed_runs:
    print(f"RUNS FAILED: {', '.join(failed_runs)}")
  slower = [e for e in entries if FLAGS.fail_below and e["new_over_old"] is not None
            and e["new_over_old"] < FLAGS.fail_below]
  if FLAGS.json_out:
    data = {"old_tree": trees["old"], "new_tree": trees["new"],
            "old_commit": _commit(trees["old"]), "new_commit": _commit(trees["new"]),
            "script": FLAGS.script, "bench_args": bench_args, "rounds": FLAGS.rounds,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(time.perf_counter() - t_start, 1), "notes": notes,
            "summary": entries, "runs": runs}
    with open(FLAGS.json_out, "w") as f:
      json.dump(data, f, indent=1)
    print(f"wrote {FLAGS.json_out}")
  if any("interrupted" in n for n in notes):
    return 2
  return 1 if failed_runs or slower else 0


def main(argv):
  if len(argv) > 1:
    print(f"alternate.py: error: unexpected arguments: {argv[1:]}", file=sys.stderr)
    return 1
  return _main()


if __name__ == "__main__":
  define_flags()
  app.run(main)
