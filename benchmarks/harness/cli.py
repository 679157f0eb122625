"""Flags the benchmark scripts share, and usage errors in one short line.

absl's app.UsageError prints the whole module docstring before the error; a
mistyped flag value deserves one line saying what is wrong and what is allowed.
"""
from __future__ import annotations

import logging
import os
import sys

from absl import flags

from harness import report
from harness import runner

FLAGS = flags.FLAGS


class UsageError(Exception):
  """A bad flag value: printed as one line (no help text), exit status 1."""


def define_common_flags(*, check_default: bool = False, interpret: bool = False,
                        check_max_gflop: float = 1000.0):
  """--backends, --iters, ... (--shapes / --cases are each script's own)."""
  flags.DEFINE_string("backends", "default", "comma list of contenders (see the module "
                      "help), all, or default")
  flags.DEFINE_integer("iters", 20, "timed iterations (the median is reported)")
  flags.DEFINE_integer("warmup", 2, "untimed warm-up iterations after compilation")
  flags.DEFINE_integer("rotate_mb", 256, "rotate input sets covering at least this many MB "
                       "(operands + output), so data does not sit in L2; 0: one set")
  flags.DEFINE_integer("max_sets", 8, "at most this many input sets")
  flags.DEFINE_bool("check", check_default, "compare each result with the float64 reference")
  flags.DEFINE_float("check_max_gflop", check_max_gflop, "--check skips cases above this "
                     "many GFLOP (the float64 reference's cost)")
  if interpret:
    flags.DEFINE_bool("interpret", False, "run the Pallas backends in GPU interpret mode on "
                      "the CPU (correctness only, no timing; implies --check) at shapes up to "
                      "--interpret_max_mnk")
  flags.DEFINE_string("json_out", None, "write the results as JSON here")
  flags.DEFINE_string("plot_out", None, "write a PNG of TFLOP/s per case and contender "
                      "(needs matplotlib: pip install '.[plot]')")
  flags.DEFINE_integer("seed", 0, "seed of the random operands")
  flags.DEFINE_float("time_budget_s", 0.0, "start no new case after this many seconds "
                     "(0: no limit); the rest is listed as not run")


def common_options(cases, backends, options_class=runner.Options, **overrides):
  """options_class (runner.Options or a workload's subclass) from the common flags."""
  fields = dict(
      cases=tuple(cases), backends=tuple(backends), iters=max(1, FLAGS.iters),
      warmup=max(0, FLAGS.warmup), rotate_mb=FLAGS.rotate_mb, max_sets=max(1, FLAGS.max_sets),
      check=FLAGS.check, check_max_gflop=FLAGS.check_max_gflop, json_out=FLAGS.json_out,
      plot_out=FLAGS.plot_out, seed=FLAGS.seed, time_budget_s=FLAGS.time_budget_s)
  fields.update(overrides)
  return options_class(**fields)


def split_list(spec: str) -> list[str]:
  return [s.strip() for s in spec.split(",") if s.strip()]


def parse_backends(spec: str, registry, default: list[str]) -> tuple:
  """Comma list of contender names, `all` and `default`, de-duplicated in order."""
  names = []
  for item in split_list(spec):
    if item == "default":
      names.extend(default)
    elif item == "all":
      names.extend(registry.all())
    elif item in registry:
      names.append(item)
    else:
      raise UsageError(f"--backends: unknown {item!r}; choose from "
                       f"{', '.join(registry.names())}, all, default")
  if not names:
    raise UsageError("--backends is empty")
  return tuple(dict.fromkeys(names))


def parse_dims(item: str, count: int, flag: str, what: str) -> tuple:
  """'64x128x256' -> (64, 128, 256), positive integers."""
  try:
    dims = tuple(int(p) for p in item.lower().split("x"))
  except ValueError:
    dims = ()
  if len(dims) != count:
    raise UsageError(f"--{flag}: {item!r} is not {what}")
  if min(dims) < 1:
    raise UsageError(f"--{flag}: {item!r} has a dimension < 1")
  return dims


def quiet_jax_logs():
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" noise


def warn_if_no_plot(log=print):
  """Said before a run, so that a long run does not end without the plot asked for."""
  if FLAGS.plot_out and report.matplotlib_missing():
    log(f"WARNING: --plot_out={FLAGS.plot_out} will not be written: {report.PLOT_HINT}")


def run_main(body, argv) -> int:
  """Calls body() -> exit status; a UsageError becomes one line on stderr and status 1."""
  quiet_jax_logs()
  try:
    if len(argv) > 1:
      raise UsageError(f"unexpected arguments: {argv[1:]}")
    return body()
  except UsageError as e:
    prog = os.path.basename(sys.argv[0]) if sys.argv else "benchmark"
    print(f"{prog}: error: {e}\n(--help lists every flag)", file=sys.stderr)
    return 1


def log(line: str):
  print(line, flush=True)


def run_workload(workload, opts, env) -> int:
  """Runs a benchmark's workload (a SIGTERM stops it with what was measured
  printed and written); returns the process exit status."""
  runner.install_sigterm()
  return runner.exit_status(runner.run(workload, opts, env, log=log))
