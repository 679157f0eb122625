"""Autotuning for the Pallas kernels: the fastest config per (kernel, device, shape).

A shape heuristic (each kernel's `default_config`) is right for most shapes;
autotuning times a kernel's candidate configs on the actual device and keeps
the fastest, cached in memory and in a JSON file so a process tunes a shape
once per device, ever:

    from jax_fp8.pallas import hopper
    hopper.autotune(4096, 7168, 2048)          # times the candidates, caches the best
    jax_fp8.blockwise_fp8_dot(...)             # now lowers with the cached config

With JAX_FP8_AUTOTUNE=1 in the environment, a cache miss at lowering time
tunes that shape on the spot (fresh random operands, outside any trace).
The cache file is $JAX_FP8_AUTOTUNE_CACHE, else
$XDG_CACHE_HOME/jax_fp8/autotune.json (~/.cache/jax_fp8/autotune.json).

Timing: on a GPU, kernel time through CUPTI
(`jax.experimental.mosaic.gpu.profiler.measure`), warm, median of `iters`
calls, each (the warm-up included) reading the next of several copies of the
operands, so that none finds its operands in the L2 (a bandwidth-bound decode
shape measured 30% fast with one set); elsewhere (GPU interpret mode on the
CPU, how CI exercises this) the wall clock, which only proves that the
machinery works.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import statistics
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_fp8.pallas import device as jdevice

_lock = threading.Lock()
_memory: dict[str, dict[str, Any]] = {}   # key -> cache entry, for the cache file in use
_memory_path: pathlib.Path | None = None
_warned: set[tuple[str, str]] = set()     # (file, key) of bad entries already reported


def enabled() -> bool:
  """Whether a cache miss at lowering time should tune (JAX_FP8_AUTOTUNE=1)."""
  return os.environ.get("JAX_FP8_AUTOTUNE", "").strip().lower() not in ("", "0", "false", "no")


def cache_path() -> pathlib.Path:
  explicit = os.environ.get("JAX_FP8_AUTOTUNE_CACHE")
  if explicit:
    return pathlib.Path(explicit)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "jax_fp8" / "autotune.json"


def make_key(kernel: str, m: int, n: int, k: int, *, out_dtype, c_dtype=None,
             device: str | None = None) -> str:
  c = "none" if c_dtype is None else np.dtype(c_dtype).name
  return (f"{kernel}|{device or jdevice.device_name()}|{m}x{n}x{k}|"
          f"out={np.dtype(out_dtype).name}|c={c}")


def _warn_once(path, key: str, why: str) -> None:
  if (str(path), key) not in _warned:
    _warned.add((str(path), key))
    what = "autotune cache" if not key else f"autotune cache entry {key!r} in"
    warnings.warn(f"jax_fp8: ignoring {what} {path}: {why} (it is rewritten when a shape is "
                  "next tuned)", stacklevel=3)


def _entries() -> dict[str, dict[str, Any]]:
  """The cache of the current cache file, read once per file (call under _lock).

  A cache that cannot be read or is not a JSON object of entries, and entries
  without a "config" object, are ignored with a warning naming the file: a bad
  cache never breaks a call, and the next tuning rewrites it.
  """
  global _memory_path
  path = cache_path()
  if path != _memory_path:
    _memory.clear()
    _memory_path = path
    try:
      data = json.loads(path.read_text())
    except FileNotFoundError:
      return _memory
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
      _warn_once(path, "", f"unreadable ({e})")
      return _memory
    if not isinstance(data, dict):
      _warn_once(path, "", f"expected a JSON object of entries, got {type(data).__name__}")
      return _memory
    for key, entry in data.items():
      if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
        _memory[key] = entry
      else:
        _warn_once(path, key, 'not an object with a "config" object')
  return _memory


def lookup(key: str, config_type: type | None = None):
  """The cached best config for key, or None.

  Without config_type: the config's fields as a dict. With a dataclass
  config_type: an instance, if the entry names exactly its fields and the
  instance passes its `check()` (if it has one); an entry that does not (a
  cache from another version of the code) is ignored with a warning.
  """
  with _lock:
    entry = _entries().get(key)
  if entry is None:
    return None
  fields = dict(entry["config"])
  if config_type is None:
    return fields
  try:
    want = {f.name for f in dataclasses.fields(config_type) if f.init}
    if set(fields) != want:
      unknown, missing = sorted(set(fields) - want), sorted(want - set(fields))
      raise ValueError(f"fields do not match {config_type.__name__} (unknown: {unknown}, "
                       f"missing: {missing})")
    config = config_type(**fields)
    if hasattr(config, "check"):
      config.check()
  except (TypeError, ValueError) as e:
    _warn_once(cache_path(), key, f"stale or invalid config: {e}")
    return None
  return config


def _store(key: str, entry: dict[str, Any]) -> None:
  with _lock:
    entries = _entries()
    entries[key] = entry
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      json.dump(entries, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def clear_memory() -> None:
  """Forgets what was read from the cache file (tests; a changed file is re-read)."""
  global _memory_path
  with _lock:
    _memory.clear()
    _warned.clear()
    _memory_path = None


# The operand copies the timed calls rotate through cover this many bytes (the
# H100's L2 holds 50 MB), at most MAX_OPERAND_SETS of them.
ROTATE_BYTES = 128 << 20
MAX_OPERAND_SETS = 8


def operand_sets(args: Sequence[Any], rotate_bytes: int = ROTATE_BYTES,
                 max_sets: int = MAX_OPERAND_SETS) -> list[tuple]:
  """args and device copies of it (new buffers), as many as cover rotate_bytes."""
  nbytes = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(args))
  count = max(1, min(max_sets, -(-rotate_bytes // max(1, nbytes))))
  return [tuple(args)] + [tuple(jax.tree.map(jnp.copy, tuple(args))) for _ in range(count - 1)]


class _Rotating(jax.stages.Wrapped):
  """A compiled call that reads the next operand set at each call: profiler.measure
  calls a Wrapped as it is (a plain callable would be re-jitted)."""

  def __init__(self, compiled, sets):
    self._compiled, self._sets, self._next = compiled, sets, 0

  def __call__(self):
    args = self._sets[self._next % len(self._sets)]
    self._next += 1
    return self._compiled(*args)


def kernel_time_ms(fn: Callable, args: Sequence[Any], *, iters: int = 10,
                   check: Callable[[Any], None] | None = None) -> float:
  """Median time of fn(*args): CUPTI kernel time on a GPU, else the wall clock.

  check(output) runs on the first output and raises if it is wrong: a config
  that computes garbage fast must never win.
  """
  compiled = jax.jit(fn).lower(*args).compile()
  out = jax.block_until_ready(compiled(*args))  # also the warm-up
  if check is not None:
    check(out)
  # Interpret mode runs the kernel on the CPU even where a GPU exists: CUPTI
  # would see no kernel of ours, and the timings are not the GPU's.
  if jdevice.gpus() and not jdevice.interpret_mode_active():
    from jax.experimental.mosaic.gpu import profiler
    _, times = profiler.measure(_Rotating(compiled, operand_sets(args)), iterations=iters)()
    if times is None:
      raise RuntimeError("CUPTI recorded no kernel")
    times = [times] if isinstance(times, float) else list(times)
    return statistics.median(times)
  times = []
  for _ in range(min(iters, 2)):  # interpret mode: slow, and the time means little
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times)


def random_operands(seed: int, m: int, n: int, k: int, *, c_dtype=None,
                    b_scale_rows: int = 128) -> tuple:
  """(a, a_scale, b, b_scale, c) to time and check candidates on: random e4m3
  values over most of the format's range (never zeros, which would hide
  unwritten outputs and run unrealistically fast) and scales over several binades.
  b_scale_rows=1: one b scale per row of b ([n, kb])."""
  rng = np.random.default_rng(seed)
  kb, nb = -(-k // 128), -(-n // b_scale_rows)

  def fp8(*shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 64).astype(
        jnp.float8_e4m3fn)

  def scales(*shape):
    return jnp.asarray(np.exp2(rng.uniform(-12.0, -4.0, size=shape)).astype(np.float32))

  c = None
  if c_dtype is not None:
    c = jnp.asarray(rng.standard_normal((m, n)).astype(np.float32)).astype(c_dtype)
  return fp8(m, k), scales(m, kb), fp8(n, k), scales(nb, kb), c


def output_check(args, *, beta: float, tol: float,
                 b_scale_rows: int = 128) -> Callable[[Any], None]:
  """check(out) for kernel_time_ms: raises unless out is within `tol` (relative
  Frobenius norm; NaN fails) of the contract evaluated in float32 on the device."""
  a, a_scale, b, b_scale, c = args
  n, k = b.shape
  expand = lambda s, axis, times=128: jnp.repeat(s, times, axis=axis)

  @jax.jit
  def reference(a, a_scale, b, b_scale, c):
    a32 = a.astype(jnp.float32) * expand(a_scale, 1)[:, :k]
    b32 = b.astype(jnp.float32) * expand(expand(b_scale, 0, b_scale_rows), 1)[:n, :k]
    out = jnp.dot(a32, b32.T, precision=jax.lax.Precision.HIGHEST)
    return out if c is None else out + beta * c.astype(jnp.float32)

  ref = np.asarray(reference(*args), np.float64)
  norm = np.linalg.norm(ref) or 1.0

  def check(out):
    err = float(np.linalg.norm(np.asarray(out, np.float64) - ref) / norm)
    if not err <= tol:  # NaN fails too
      raise ValueError(f"relative error {err:.3e} > {tol:.1e}")
  return check


def tune(key: str, candidates: Iterable[Any], time_config: Callable[[Any], float]) -> Any:
  """Times every candidate config with time_config(cfg) -> ms; caches and returns the best.

  A candidate that fails (does not compile, say, for lack of registers or
  SMEM) is recorded as failed and skipped; if all fail, the first error is raised.
  """
  candidates = list(candidates)
  if not candidates:
    raise ValueError(f"no candidate configs to tune {key}")
  results, first_error = [], None
  for cfg in candidates:
    try:
      results.append((float(time_config(cfg)), cfg))
    except Exception as e:  # noqa: BLE001 (a candidate may fail in any way)
      first_error = first_error or e
      _reset_interpreter_after_error()
  if not results:
    raise RuntimeError(f"every candidate config failed for {key}") from first_error
  ms, best = min(results, key=lambda r: r[0])
  _store(key, {
      "config": dataclasses.asdict(best),
      "ms": ms,
      "candidates": [{"config": dataclasses.asdict(c), "ms": t} for t, c in results],
      "failed": len(candidates) - len(results),
      "date": time.strftime("%Y-%m-%d"),
  })
  return best


def _reset_interpreter_after_error() -> None:
  # A kernel that raised inside GPU interpret mode leaves the interpreter's
  # shared state behind; the next kernel needs it reset.
  try:
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    interpret_pallas_call.reset_gpu_interpret_mode_state()
  except (ImportError, AttributeError):
    pass
