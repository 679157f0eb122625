"""How calls are timed, and how their inputs are kept out of the L2.

- JAX on a GPU: the kernel time on the device as CUPTI records it, through
  jax.experimental.mosaic.gpu.profiler.measure: the sum of every kernel one call
  launches (padding, scale transposes, dequantisation, reductions all count).
- torch on a GPU (cuBLAS and DeepGEMM peers): the kernel durations of the torch
  profiler, the same sum per call. The Mosaic CUPTI subscriber cannot attach once
  the torch profiler has, so every torch timing runs after every JAX timing of a
  process (the runner orders them).
- CPU: the wall clock of single calls with block_until_ready (CPU numbers).

Every method: compiled, then `warmup` untimed calls, then the median of `iters`
calls. Call i reads input set i % R: with R sets larger than the L2 together
(`num_sets`), no call finds its operands in the L2 from the calls before.
"""
from __future__ import annotations

import collections
import math
import statistics
import time

import jax

from harness import torch_glue

# Outputs that one measure() call may keep alive (it holds every iteration's result).
MEASURE_OUT_BUDGET = 6 << 30

try:
  from jax._src import stages as _stages
  _WRAPPED = _stages.Wrapped
except (ImportError, AttributeError):  # pragma: no cover (a jax without it)
  _WRAPPED = None


def num_sets(set_bytes: int, rotate_mb: int, max_sets: int) -> int:
  """How many input sets cover `rotate_mb` MB (at least 2 when rotating)."""
  if rotate_mb <= 0:
    return 1
  need = math.ceil(rotate_mb * 2**20 / max(1, set_bytes))
  return max(2, min(max_sets, need))


def kernel_summary(timings) -> list[str]:
  """["name x count", ...] of one call's kernels (names cut at 100 characters)."""
  counts = collections.Counter(name for name, _ in timings)
  return [f"{name[:100]} x{c}" for name, c in counts.items()]


def tree_nbytes(tree) -> int:
  return sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree))


class _Rotating(*((_WRAPPED,) if _WRAPPED is not None else ())):
  """A compiled call that takes its operands from the next input set at each call.

  profiler.measure calls f(*args) once to warm up and then `iterations` times;
  as a jax.stages.Wrapped it is called as it is (not re-jitted), so every call,
  the warm-up included, reads a different set from the one before it.
  """

  def __init__(self, compiled, sets_args, start):
    self._compiled, self._sets, self._next = compiled, sets_args, start

  def __call__(self):
    args = self._sets[self._next % len(self._sets)]
    self._next += 1
    return self._compiled(*args)


def compile_call(fn, args, compiler_options=None):
  return jax.jit(fn).lower(*args).compile(compiler_options=compiler_options)


def time_jax_gpu(fn, sets_args, iters, warmup, out_bytes=None, compiler_options=None):
  """(ms per call, kernel names, output of set 0) through CUPTI, one call per set."""
  from jax.experimental.mosaic.gpu import profiler
  if _WRAPPED is None:
    raise RuntimeError("jax._src.stages.Wrapped is missing: cannot rotate input sets "
                       "under profiler.measure")
  r = len(sets_args)
  compiled = compile_call(fn, sets_args[0], compiler_options)
  out0 = jax.block_until_ready(compiled(*sets_args[0]))  # compile, and the output checked
  for i in range(warmup):
    jax.block_until_ready(compiled(*sets_args[(i + 1) % r]))
  rotating = _Rotating(compiled, sets_args, warmup + 1)
  # measure keeps every call's output alive until the end: bound that memory.
  out_bytes = tree_nbytes(out0) if out_bytes is None else out_bytes
  chunk = max(1, min(iters, MEASURE_OUT_BUDGET // max(1, out_bytes)))
  times, names, done = [], None, 0
  while done < iters:
    c = min(chunk, iters - done)
    _, t = profiler.measure(rotating, aggregate=False, iterations=c)()
    if t is None:
      raise RuntimeError("CUPTI recorded no kernel")
    per_call = [t] if c == 1 else t
    times += [sum(ms for _, ms in call) for call in per_call]
    names = names or kernel_summary(per_call[0])
    done += c
  return statistics.median(times), names, out0


def time_cpu(fn, sets_args, iters, warmup, compiler_options=None):
  """(ms per call, output of set 0): wall clock around one call + block_until_ready."""
  f = compile_call(fn, sets_args[0], compiler_options)
  out0 = jax.block_until_ready(f(*sets_args[0]))
  r = len(sets_args)
  for i in range(warmup):
    jax.block_until_ready(f(*sets_args[i % r]))
  times = []
  for i in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*sets_args[i % r]))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times), out0


def time_torch(fn, sets_args, iters, warmup):
  """(ms per call, kernel names, method, output of set 0) from torch profiler kernel times.

  Call i runs on input set i % R, as for JAX; the median of the per-call sums of
  kernel durations is reported. The first call (which may JIT-compile, as
  DeepGEMM's do) is not timed.
  """
  torch = torch_glue.cuda_torch()
  r = len(sets_args)
  # A copy: a contender may write into a buffer of its input set (DeepGEMM's d), which
  # the later calls on set 0 overwrite (or accumulate into).
  out0 = _snapshot(fn(*sets_args[0]))
  for i in range(max(1, warmup)):
    fn(*sets_args[(i + 1) % r])
  torch.cuda.synchronize()
  first = (max(1, warmup) + 1) % r  # the set after the last warm-up call
  calls = [sets_args[(first + i) % r] for i in range(iters)]
  try:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
      for args in calls:
        fn(*args)
      torch.cuda.synchronize()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.device_type() == DeviceType.CUDA]
    events.sort(key=lambda e: e.start_ns())
    if not events or len(events) % iters:
      raise RuntimeError(f"{len(events)} kernel events for {iters} calls")
    per_call = len(events) // iters
    times = [sum(e.duration_ns() for e in events[i * per_call:(i + 1) * per_call]) / 1e6
             for i in range(iters)]
    names = kernel_summary([(e.name(), 0.0) for e in events[:per_call]])
    return statistics.median(times), names, "torch_profiler", out0
  except Exception as e:  # noqa: BLE001 (profiler unusable: CUDA events, mean)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for args in calls:
      fn(*args)
    end.record()
    torch.cuda.synchronize()
    return (start.elapsed_time(end) / iters, [],
            f"cuda_events_mean (torch profiler failed: {short_error(e)})", out0)


def _snapshot(out):
  if isinstance(out, (tuple, list)):
    return type(out)(_snapshot(x) for x in out)
  return out.clone() if hasattr(out, "clone") else out


def short_error(e: BaseException, limit=200) -> str:
  """One line: the exception's type and message, cut at `limit` characters."""
  text = " ".join(f"{type(e).__name__}: {e}".split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def method_text(on_gpu: bool, iters: int, warmup: int, rotate_mb: int, max_sets: int) -> str:
  """The timing method in one paragraph (the table's header and the JSON's "method")."""
  rot = (f"call i reads input set i % R, R sets covering >= {rotate_mb} MB (at most "
         f"{max_sets}; 'input_sets' per row) so operands are not L2-resident"
         if rotate_mb > 0 else "one input set (L2 may hold the operands)")
  if on_gpu:
    return ("GPU kernel time: JAX contenders through CUPTI "
            "(jax.experimental.mosaic.gpu.profiler.measure, sum of all kernels of a call); "
            "torch from the torch profiler's kernel times, measured after all JAX timings; "
            f"compiled + {warmup} warm-up calls; median of {iters} calls; {rot}")
  return (f"CPU wall clock (time.perf_counter around one call + block_until_ready), "
          f"compiled + {warmup} warm-up calls, median of {iters} calls; {rot}. "
          "These are CPU numbers, not GPU numbers")
