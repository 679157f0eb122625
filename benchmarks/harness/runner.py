"""The run: every case, every contender, timed, checked, and reported as it goes.

Per case: its input sets are made, the float64 references of the contracts in
play are submitted (host thread or device, see checks.py), every JAX contender is
timed (peers first, so ratios print as rows come), then checked; the JSON is
rewritten after every case, so a run cut short leaves its partial results.
torch contenders (cuBLAS, DeepGEMM) are timed after every JAX timing (see
timing.py) on the same input sets, made again from the same seed.
"""
from __future__ import annotations

import dataclasses
import datetime
import signal
import sys
import time
from typing import Callable

import jax

import jax_fp8
import jax_fp8.testing
from harness import checks
from harness import report
from harness import timing
from harness.env import Env, package_version
from harness.registry import Contender, Registry, Skipped, Unavailable

Row = report.Row


@dataclasses.dataclass(frozen=True)
class Case:
  """One problem a workload times (one row group of the table)."""
  label: str                    # the table's first column, e.g. "64x2112x7168"
  dims: dict                    # its dimensions, the first keys of each JSON row
  flops: float                  # per call: TFLOP/s = flops / time
  set_bytes: int                # one input set and its output: how many sets pass the L2
  bytes: float | None = None    # the fewest bytes a call moves (GB/s); None: no GB/s
  contract: str = "default"     # the contract its contenders are checked against
  params: object = None         # workload-specific (e.g. the group sizes)


@dataclasses.dataclass
class Options:
  """What to run and how; each script fills it from its flags."""
  cases: tuple
  backends: tuple
  iters: int = 20
  warmup: int = 2
  rotate_mb: int = 256
  max_sets: int = 8
  check: bool = False
  check_max_gflop: float = 1000.0
  interpret: bool = False
  json_out: str | None = None
  plot_out: str | None = None
  seed: int = 0
  time_budget_s: float = 0.0


@dataclasses.dataclass
class Workload:
  """A benchmark: its contenders and how to make and check its inputs."""
  name: str
  registry: Registry
  make_sets: Callable           # (case, count, seed) -> list of input sets
  references: Callable          # () -> checks.HostReferences | checks.DeviceReferences
  title: str                    # the plot's title, before the device
  layout: report.Layout = report.Layout()
  ratio_peers: tuple | None = None    # peers with a vs_<peer> column (None: every peer)
  metadata: Callable = lambda opts: {}  # opts -> JSON fields after "method"
  intro: Callable = lambda opts, env: []  # opts, env -> lines that say what is measured


class Terminated(BaseException):
  """SIGTERM (e.g. `timeout`): stop timing, still write what was measured."""


def install_sigterm():
  def on_sigterm(signum, frame):
    raise Terminated()
  signal.signal(signal.SIGTERM, on_sigterm)


def _ordered(workload: Workload, names) -> tuple[list, list]:
  """(JAX contenders, peers first; torch contenders) among `names`."""
  reg = workload.registry
  jax_names = [n for n in names if reg[n].runtime == "jax" and reg[n].role == "peer"]
  jax_names += [n for n in names if reg[n].runtime == "jax" and reg[n].role != "peer"]
  return jax_names, [n for n in names if reg[n].runtime == "torch"]


def _unavailable(row, e):
  if isinstance(e, Skipped):
    row.status, row.reason = "skipped", str(e)
  elif isinstance(e, Unavailable):
    row.status, row.reason = "unavailable", str(e)
  else:
    row.status, row.reason = "unavailable", timing.short_error(e)


_UNAVAILABLE = (Unavailable, jax_fp8.BackendUnavailableError, NotImplementedError, ImportError)


def _rates(row, case, ms):
  row.ms = ms
  row.tflops = case.flops / (ms * 1e-3) / 1e12
  if case.bytes is not None:
    row.gbs = case.bytes / (ms * 1e-3) / 1e9


def _time_jax(row: Row, case: Case, c: Contender, sets, opts: Options, env: Env):
  """Times one JAX contender at one case; returns the output of input set 0 or None."""
  args = [c.prepare(s) for s in sets]
  if c.interpret:
    out0 = jax_fp8.testing.run_in_gpu_interpret_mode(c.fn, *args[0], detect_races=True)
    row.status = "interpret"
  elif env.on_gpu:
    ms, row.kernels, out0 = timing.time_jax_gpu(c.fn, args, opts.iters, opts.warmup,
                                                compiler_options=c.compiler_options)
    row.timing = "cupti"
    _rates(row, case, ms)
  else:
    ms, out0 = timing.time_cpu(c.fn, args, opts.iters, opts.warmup, c.compiler_options)
    row.timing = "cpu_wall_clock"
    _rates(row, case, ms)
  return out0


def _check(row: Row, c: Contender, out, ref):
  if c.result is not None:
    out = c.result(out)
  row.rel_err = checks.rel_error(out, ref)
  row.bound = c.bound
  row.check = checks.verdict(row.rel_err, c.bound)


def run(workload: Workload, opts: Options, env: Env, log=print) -> dict:
  reg = workload.registry
  peers = [p for p in (workload.ratio_peers or reg.peers()) if p in opts.backends]
  jax_names, torch_names = _ordered(workload, opts.backends)
  refs = workload.references() if opts.check else None
  kept = {}  # case label -> host reference, for the torch rows
  rows: list[Row] = []
  notes: list[str] = []
  t_start = time.perf_counter()
  layout = dataclasses.replace(workload.layout, rel_err=opts.check)
  method = timing.method_text(env.on_gpu, opts.iters, opts.warmup, opts.rotate_mb,
                              opts.max_sets)
  contracts = {c.label: c.contract for c in opts.cases}
  table = lambda rs, **kw: report.format_table(rs, peers, layout, contracts, **kw)  # noqa: E731

  for line in workload.intro(opts, env):
    log(line)
  log(f"device: {env.description()}")
  log(f"jax {jax.__version__}"
      + "".join(f"; {k} {v}" for k, v in workload.metadata(opts).items())
      + f"; backends {','.join(opts.backends)}")
  log(f"method: {method}")
  if not opts.check:
    log("outputs not checked: --check compares each with a float64 reference "
        "(adds a rel_err column)")
  log("")
  log(table([]))

  def emit(row):
    report.compute_ratios([r for r in rows if r.case == row.case], peers)
    log(table([row], with_header=False))

  def checkable(case):
    return opts.check and case.flops / 1e9 <= opts.check_max_gflop

  def not_checked(row, case):
    if opts.check and row.status in ("ok", "interpret") and row.check is None:
      row.check = (f"not checked: {case.flops / 1e9:.0f} GFLOP > "
                   f"--check_max_gflop={opts.check_max_gflop:g}")

  def failed_rows():
    return [r for r in rows if r.is_kernel and r.check and r.check.startswith("FAIL")]

  def result(final):
    return {
        "device": env.description(),
        "platform": "gpu" if env.on_gpu else "cpu",
        "jax_version": jax.__version__,
        "torch_version": package_version("torch") if torch_names else None,
        "method": method,
        **workload.metadata(opts),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "complete": final and not notes,
        "notes": notes,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "failed": len(failed_rows()),
        "results": [report.row_json(r) for r in rows],
    }

  def write_json(final=False):
    if opts.json_out:
      report.write_json(opts.json_out, result(final))

  def over_budget():
    return opts.time_budget_s > 0 and time.perf_counter() - t_start > opts.time_budget_s

  try:
    for i, case in enumerate(opts.cases):
      if over_budget():
        left = ", ".join(c.label for c in opts.cases[i:])
        notes.append(f"--time_budget_s={opts.time_budget_s:g} reached: not run: {left}")
        log(f"# {notes[-1]}")
        break
      t_case = time.perf_counter()
      n_sets = timing.num_sets(case.set_bytes, opts.rotate_mb, opts.max_sets)
      sets = workload.make_sets(case, n_sets, opts.seed)
      case_rows, ready = [], {}
      for name in [n for n in jax_names if reg.applies(n, case)]:
        row = Row(case.label, dict(case.dims), name, input_sets=n_sets,
                  contract=case.contract, is_kernel=reg[name].role == "backend")
        rows.append(row)
        case_rows.append(row)
        try:
          c = reg[name].factory(case, opts, env)
          if c.contract == "default":
            c.contract = case.contract
          row.resolved, row.contract, row.extra = c.resolved, c.contract, dict(c.extra)
          ready[name] = c
        except _UNAVAILABLE as e:
          _unavailable(row, e)
      case_torch = [n for n in torch_names if reg.applies(n, case)]
      t_ref = time.perf_counter()
      if checkable(case):
        needed = {c.contract for c in ready.values()} | ({case.contract} if case_torch
                                                         else set())
        refs.submit(case, sets[0], sorted(needed))
      t_ref = time.perf_counter() - t_ref
      outs = {}
      for row in case_rows:
        if row.backend not in ready:
          continue
        t_row = time.perf_counter()
        try:
          outs[row.backend] = _time_jax(row, case, ready[row.backend], sets, opts, env)
        except _UNAVAILABLE as e:
          _unavailable(row, e)
        except Exception as e:  # noqa: BLE001 (a failing contender is reported, not fatal)
          row.status, row.reason = "error", timing.short_error(e)
        row.wall_s = round(time.perf_counter() - t_row, 2)
      del sets
      # Checks once the case's timings are done (a host reference ran meanwhile).
      t_wait = time.perf_counter()
      if checkable(case):
        refs.wait(case.label)
      t_ref += time.perf_counter() - t_wait
      for row in case_rows:
        out0 = outs.pop(row.backend, None)
        if out0 is not None and checkable(case):
          try:
            _check(row, ready[row.backend], out0, refs.device(case.label, row.contract))
          except Exception as e:  # noqa: BLE001
            row.check = f"check failed to run: {timing.short_error(e)}"
        not_checked(row, case)
        emit(row)
      del outs
      for name in case_torch:
        rows.append(Row(case.label, dict(case.dims), name, status="pending", input_sets=n_sets,
                        contract=case.contract, is_kernel=reg[name].role == "backend"))
      if case_torch and checkable(case):
        kept[case.label] = refs.host(case.label, case.contract)
      if refs is not None:
        refs.drop(case.label)
      ref_note = (f", of which {t_ref:.1f} s for the float64 reference" if checkable(case)
                  else "")
      log(f"# {case.label}: {time.perf_counter() - t_case:.1f} s{ref_note}; "
          f"{n_sets} input sets")
      write_json()

    # torch after every JAX CUPTI timing (see timing.py).
    cases = {c.label: c for c in opts.cases}
    for row in [r for r in rows if r.status == "pending"]:
      if over_budget():
        notes.append(f"--time_budget_s={opts.time_budget_s:g} reached: torch contenders not "
                     f"run from {row.backend} at {row.case} on")
        log(f"# {notes[-1]}")
        break
      _torch_row(workload, row, cases[row.case], kept.get(row.case), opts, env)
      not_checked(row, cases[row.case])
      emit(row)
  except (Terminated, KeyboardInterrupt) as e:
    notes.append(f"interrupted ({type(e).__name__}): the results are partial")
    log(f"# {notes[-1]}")
  finally:
    if refs is not None:
      refs.close()
  for row in rows:
    if row.status == "pending" or (row.status == "ok" and row.ms is None):
      row.status, row.reason = "skipped", "not run (interrupted or over the time budget)"
  log(f"# total {time.perf_counter() - t_start:.1f} s")

  report.compute_ratios(rows, peers)
  log("")
  what = "GPU kernel time" if env.on_gpu else "CPU wall clock: CPU numbers"
  ratio_words = "; vs_<peer> = peer ms / ms, > 1 is faster than the peer" if peers else ""
  log(f"summary ({what}{ratio_words}):")
  log(table(rows))
  for note in notes:
    log(f"NOTE: {note}")
  out = result(True)
  if out["failed"]:
    log("CHECK FAILED: " + ", ".join(f"{r.backend} {r.case}" for r in failed_rows()))
  if opts.json_out:
    write_json(final=True)
    log(f"wrote {opts.json_out}")
  if opts.plot_out:
    try:
      title = f"{workload.title}, {out['device']}" + ("" if env.on_gpu else " (CPU numbers)")
      report.plot(rows, opts.plot_out, title, log)
    except Exception as e:  # noqa: BLE001 (the plot is optional)
      log(f"WARNING: plot failed: {timing.short_error(e)}")
  return out


def _torch_row(workload: Workload, row: Row, case: Case, ref_host, opts: Options, env: Env):
  t_row = time.perf_counter()
  try:
    c = workload.registry[row.backend].factory(case, opts, env)
    if c.contract == "default":
      c.contract = case.contract
    row.resolved, row.contract, row.extra = c.resolved, c.contract, dict(c.extra)
    sets = workload.make_sets(case, row.input_sets, opts.seed)  # the JAX rows' operands
    args = [c.prepare(s) for s in sets]
    del sets
    ms, row.kernels, row.timing, out0 = timing.time_torch(c.fn, args, opts.iters, opts.warmup)
    del args
    row.status = "ok"
    _rates(row, case, ms)
    if ref_host is not None and c.contract == case.contract:
      from harness import torch_glue
      out = c.result(out0) if c.result is not None else out0
      out = jax.tree.map(torch_glue.to_jax, out)
      row.rel_err = checks.rel_error(out, checks.to_device_f64(ref_host))
      row.bound = c.bound
      row.check = checks.verdict(row.rel_err, c.bound)
  except Unavailable as e:
    _unavailable(row, e)
  except Exception as e:  # noqa: BLE001
    row.status, row.reason = "error", timing.short_error(e)
  row.wall_s = round(time.perf_counter() - t_row, 2)


def exit_status(result: dict) -> int:
  """1 if a jax_fp8 contender failed its check, 2 if interrupted, else 0."""
  if result["failed"]:
    return 1
  interrupted = any("interrupted" in n for n in result["notes"])
  return 2 if interrupted and not result["complete"] else 0

