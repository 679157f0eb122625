#!/usr/bin/env python3
"""Benchmark of blockwise-scaled FP8 matmul: jax_fp8's backends against peers.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[n // 128, kb]

Contenders (--backends, comma list):
  jax_fp8 backends  pallas (the Pallas kernel "auto" picks: pallas_sm90 on
                    Hopper, pallas_sm100 on Blackwell), pallas_sm90, pallas_sm100,
                    ffi, reference, auto (whatever "auto" selects)
  peers             cublas_blockwise    torch._scaled_mm with 1x128 / 128x128 f32
                                        scales (cuBLAS blockwise FP8), needs torch+CUDA
                    xla_fp8_tensorwise  XLA FP8 dot with one scale per tensor, on
                                        cuBLASLt (the FP8 ceiling; a different
                                        contract, checked against its own reference)
                    bf16                XLA bf16 dot of the dequantised operands
                    dequant_bf16        jax_fp8.dequantize_* to bf16, then a bf16 dot
                                        (dequantisation is part of the timed call)
  all               every jax_fp8 backend and every peer; default on a GPU.
Without a GPU the default is the reference backend, timed by the CPU wall clock.

Timing (GPU): kernel time on the device, as CUPTI records it through
jax.experimental.mosaic.gpu.profiler.measure (the sum of every kernel one call
launches, so padding, scale-transpose or dequantisation kernels count). Warm:
compiled and run --warmup times first. Call i reads input set i % R, R sets
(at most --max_sets) chosen to cover --rotate_mb together, several times the
50 MB L2 of an H100, so no call finds its operands in L2 from the calls
before; reported: the median over --iters calls. torch (cuBLAS) is timed the
same way from the kernel times of the torch profiler, after every JAX timing
(the Mosaic CUPTI subscriber cannot attach once the torch profiler has).
CPU: wall clock of single calls with block_until_ready, median over --iters,
same rotation of input sets.

--check compares the output of input set 0 with the float64 reference
(jax_fp8.testing.reference_f64, numpy on the host, computed in a background
thread while the GPU is timed); shapes above --check_max_gflop are not checked.
Exit status 1 if a jax_fp8 backend fails its bound, 2 if interrupted (SIGTERM,
^C: what was measured is still printed and written), else 0. --json_out is
rewritten after every shape, so a run cut short leaves its partial results.

Examples:
  python benchmarks/blockwise_dot.py --shapes=small                  # CPU, reference
  python benchmarks/blockwise_dot.py --shapes=small --interpret      # + Pallas kernels in
                                                                     #   GPU interpret mode
  python benchmarks/blockwise_dot.py --shapes=deepseek_v3 --backends=all --check \\
      --json_out=results.json --plot_out=results.png                 # GPU
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime
import functools
import importlib
import json
import logging
import math
import os
import platform
import signal
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Run from a source checkout without installing: the repository root holds jax_fp8/.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.append(_ROOT)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jax_fp8  # noqa: E402
from jax_fp8 import backends as jbackends  # noqa: E402
from jax_fp8 import quantize as jquant  # noqa: E402
from jax_fp8 import testing  # noqa: E402
from jax_fp8.pallas import device as jdevice  # noqa: E402

FP8 = jnp.float8_e4m3fn
F32, BF16 = np.dtype(jnp.float32), np.dtype(jnp.bfloat16)

DEEPSEEK_V3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                  (7168, 2048))
PRESETS = {
    # Grouped by weight (N, K), M = 64, 128, 4096 (decode to prefill) within each.
    "deepseek_v3": tuple((m, n, k) for n, k in DEEPSEEK_V3_NK for m in (64, 128, 4096)),
    # Small enough for the CPU; 100x200x300 has unaligned M, N and a partial K block.
    "small": ((64, 128, 256), (100, 200, 300), (128, 256, 512), (256, 512, 1024)),
}

KERNELS = ("pallas_sm90", "pallas_sm100", "ffi", "reference")
PALLAS = ("pallas_sm90", "pallas_sm100")
JAX_PEERS = ("xla_fp8_tensorwise", "bf16", "dequant_bf16")
TORCH_PEERS = ("cublas_blockwise",)
PEERS = TORCH_PEERS + JAX_PEERS
ALL = KERNELS + PEERS
KNOWN = ALL + ("pallas", "auto")

# Per-tensor scales of the xla_fp8_tensorwise peer with --tensorwise_scales=runtime
# (powers of two: exact in bf16).
TENSOR_SCALE_A, TENSOR_SCALE_B = 2.0**-8, 2.0**-7


def tensor_scales(opts) -> tuple[float, float]:
  return (TENSOR_SCALE_A, TENSOR_SCALE_B) if opts.tensorwise_scales == "runtime" else (1.0, 1.0)
# FP8 WGMMA on Hopper adds a 128-deep block in a ~14-bit accumulator: f32 outputs
# carry ~1.3e-4 relative error on the GPU (tests/test_pallas_sm90.py, GPU_TOL).
GPU_TOLERANCE = {BF16: testing.TOLERANCE[BF16], F32: 2.5e-4}
# (xla_gpu_autotune_level=0 is no way out: untuned Triton GEMMs ran at ~20 TFLOP/s.)
CUBLAS_ONLY = {"xla_gpu_enable_triton_gemm": False}
# Outputs that one measure() call may keep alive (it holds every iteration's result).
_MEASURE_OUT_BUDGET = 6 << 30


class Unavailable(Exception):
  """This contender cannot run here (the reason is shown in the table)."""


class Skipped(Unavailable):
  """This contender could run, but not at this shape under these flags."""


# ---- flags ---------------------------------------------------------------------

FLAGS = flags.FLAGS


def define_flags():
  """Defined on demand, so that quantize.py and tests can import this module."""
  flags.DEFINE_string("shapes", "auto", "deepseek_v3 (18 shapes), small, a comma list of "
                      "MxNxK, or auto (deepseek_v3 on a GPU, small on the CPU)")
  flags.DEFINE_string("backends", "default", f"comma list of {', '.join(KNOWN)}, or all; "
                      "default: all on a GPU, reference on the CPU (+ the Pallas kernels "
                      "with --interpret)")
  flags.DEFINE_enum("out_dtype", "bfloat16", ["bfloat16", "float32"], "output dtype")
  flags.DEFINE_integer("iters", 20, "timed iterations (the median is reported)")
  flags.DEFINE_integer("warmup", 2, "untimed warm-up iterations after compilation")
  flags.DEFINE_integer("rotate_mb", 256, "rotate input sets covering at least this many MB "
                       "(operands + output), so data does not sit in L2; 0: one set")
  flags.DEFINE_integer("max_sets", 8, "at most this many input sets")
  flags.DEFINE_bool("check", False, "compare each result with the float64 reference")
  flags.DEFINE_float("check_max_gflop", 1000.0, "--check skips shapes with 2MNK above "
                     "this many GFLOP (the float64 reference runs on the host CPU)")
  flags.DEFINE_bool("interpret", False, "run the Pallas backends in GPU interpret mode on "
                    "the CPU (correctness only, no timing; implies --check) at shapes up to "
                    "--interpret_max_mnk")
  flags.DEFINE_integer("interpret_max_mnk", 128 * 256 * 512, "largest M*N*K for --interpret")
  flags.DEFINE_string("json_out", None, "write the results as JSON here")
  flags.DEFINE_string("plot_out", None, "write a PNG of TFLOP/s per shape and backend "
                      "(needs matplotlib)")
  flags.DEFINE_integer("seed", 0, "seed of the random operands")
  flags.DEFINE_enum("tensorwise_scales", "one", ["one", "runtime"], "xla_fp8_tensorwise: "
                    "one = the bare FP8 GEMM (per-tensor scales cost nothing in cuBLASLt's "
                    "alpha), runtime = multiply by runtime scalar scales (XLA then adds two "
                    "tiny scalar-cast kernels and may pick another GEMM)")
  flags.DEFINE_float("time_budget_s", 0.0, "start no new shape after this many seconds "
                     "(0: no limit); the rest is listed as not run")


@dataclasses.dataclass
class Options:
  shapes: tuple
  backends: tuple
  out_dtype: np.dtype = BF16
  iters: int = 20
  warmup: int = 2
  rotate_mb: int = 256
  max_sets: int = 8
  check: bool = False
  check_max_gflop: float = 1000.0
  interpret: bool = False
  interpret_max_mnk: int = 128 * 256 * 512
  json_out: str | None = None
  plot_out: str | None = None
  seed: int = 0
  time_budget_s: float = 0.0
  tensorwise_scales: str = "one"


def parse_shapes(spec: str, on_gpu: bool) -> tuple:
  """Comma list of presets and MxNxK; auto = deepseek_v3 on a GPU, small on the CPU."""
  shapes = []
  for item in (s.strip().lower() for s in spec.split(",") if s.strip()):
    if item == "auto":
      item = "deepseek_v3" if on_gpu else "small"
    if item in PRESETS:
      shapes.extend(PRESETS[item])
      continue
    try:
      m, n, k = (int(p) for p in item.split("x"))
    except ValueError:
      raise app.UsageError(f"--shapes: {item!r} is neither a preset ({', '.join(PRESETS)}) "
                           "nor MxNxK with three positive integers") from None
    if min(m, n, k) < 1:
      raise app.UsageError(f"--shapes: {item!r} has a dimension < 1")
    shapes.append((m, n, k))
  if not shapes:
    raise app.UsageError("--shapes is empty")
  return tuple(dict.fromkeys(shapes))


def parse_backends(spec: str, on_gpu: bool, interpret: bool) -> tuple:
  """Comma list of names, `all`, and `default` (all on a GPU, reference on the CPU)."""
  names = []
  for item in (s.strip() for s in spec.split(",") if s.strip()):
    if item == "default":
      names.extend(ALL if on_gpu else ["reference", *(PALLAS if interpret else ())])
    elif item == "all":
      names.extend(ALL)
    elif item in KNOWN:
      names.append(item)
    else:
      raise app.UsageError(f"--backends: unknown {item!r}; choose from {', '.join(KNOWN)}, "
                           "all, default")
  if not names:
    raise app.UsageError("--backends is empty")
  return tuple(dict.fromkeys(names))  # de-duplicated, in order


# ---- device and environment ------------------------------------------------------

def gpu_device():
  devices = jdevice.gpus()
  return devices[0] if devices else None


def device_description(dev) -> str:
  if dev is None:
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), no GPU"
  cc = getattr(dev, "compute_capability", "?")
  sms = getattr(dev, "core_count", "?")
  return f"{dev.device_kind} (compute capability {cc}, {sms} SMs)"


def torch_version() -> str | None:
  mod = sys.modules.get("torch")
  if mod is None:
    try:
      import importlib.metadata as md
      return md.version("torch")
    except Exception:  # noqa: BLE001 (any failure: not installed)
      return None
  return mod.__version__


def method_text(opts: Options, on_gpu: bool) -> str:
  rot = (f"call i reads input set i % R, R sets covering >= {opts.rotate_mb} MB (at most "
         f"{opts.max_sets}; 'input_sets' per row) so operands are not L2-resident"
         if opts.rotate_mb > 0 else "one input set (L2 may hold the operands)")
  if on_gpu:
    return ("GPU kernel time: JAX contenders through CUPTI "
            "(jax.experimental.mosaic.gpu.profiler.measure, sum of all kernels of a call); "
            "torch from the torch profiler's kernel times, measured after all JAX timings; "
            f"compiled + {opts.warmup} warm-up calls; median of {opts.iters} calls; {rot}")
  return (f"CPU wall clock (time.perf_counter around one call + block_until_ready), "
          f"compiled + {opts.warmup} warm-up calls, median of {opts.iters} calls; {rot}. "
          "These are CPU numbers, not GPU numbers")


# ---- operands ----------------------------------------------------------------------

@dataclasses.dataclass
class InputSet:
  a: jax.Array        # [M, K] e4m3
  a_scale: jax.Array  # [M, ceil(K/128)] f32
  b: jax.Array        # [N, K] e4m3
  b_scale: jax.Array  # [ceil(N/128), ceil(K/128)] f32


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _make_set(key, m, n, k):
  # The distribution of jax_fp8.testing.random_operands, generated on the device.
  ka, kb_, ksa, ksb = jax.random.split(key, 4)
  nkb, nnb = jquant.num_blocks(k), jquant.num_blocks(n)
  a = (jax.random.normal(ka, (m, k), jnp.float32) * 64).astype(FP8)
  b = (jax.random.normal(kb_, (n, k), jnp.float32) * 64).astype(FP8)
  sa = jnp.exp2(jax.random.uniform(ksa, (m, nkb), jnp.float32, -12.0, -4.0))
  sb = jnp.exp2(jax.random.uniform(ksb, (nnb, nkb), jnp.float32, -12.0, -4.0))
  return a, sa, b, sb


def make_sets(seed, m, n, k, count) -> list[InputSet]:
  base = jax.random.fold_in(jax.random.key(seed), (m * 1_000_003 + n * 1009 + k) % (2**31))
  return [InputSet(*_make_set(jax.random.fold_in(base, i), m, n, k)) for i in range(count)]


def set_bytes(m, n, k, out_dtype) -> int:
  kb, nb = jquant.num_blocks(k), jquant.num_blocks(n)
  return m * k + n * k + 4 * (m * kb + nb * kb) + m * n * np.dtype(out_dtype).itemsize


def num_sets(m, n, k, opts: Options) -> int:
  if opts.rotate_mb <= 0:
    return 1
  need = math.ceil(opts.rotate_mb * 2**20 / set_bytes(m, n, k, opts.out_dtype))
  return max(2, min(opts.max_sets, need))


def _dot_nt(x, y, out_dtype):
  """x [M, K] . y [N, K]^T with float32 accumulation."""
  acc = lax.dot_general(x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  return acc.astype(out_dtype)


# ---- contenders ----------------------------------------------------------------------

@dataclasses.dataclass
class Contender:
  """How one backend or peer runs: prepare(set) -> args; fn(*args) -> [M, N]."""
  name: str
  fn: object
  prepare: object
  contract: str = "blockwise"   # which float64 reference it is checked against
  is_kernel: bool = True        # a jax_fp8 backend (its check decides the exit status)
  resolved: str | None = None   # the jax_fp8 backend that runs (for pallas / auto)
  interpret_module: object = None
  compiler_options: dict | None = None


def _resolve_pallas(on_gpu: bool) -> str:
  cc = jdevice.target_compute_capability()  # (9, 0) without a GPU, as lowering assumes
  name = {9: "pallas_sm90", 10: "pallas_sm100"}.get(cc[0])
  if name is None:
    raise Unavailable(f"no Pallas kernel for compute capability {cc[0]}.{cc[1]} "
                      "(pallas_sm90 needs 9.x, pallas_sm100 10.x)")
  return name


def make_contender(name, m, n, k, opts: Options, on_gpu: bool) -> Contender:
  od = opts.out_dtype
  fp8_args = lambda s: (s.a, s.a_scale, s.b, s.b_scale)  # noqa: E731

  if name in KERNELS or name in ("pallas", "auto"):
    backend = _resolve_pallas(on_gpu) if name == "pallas" else name
    resolved = backend
    if backend == "auto":
      platform_ = "cuda" if on_gpu else "cpu"
      try:
        resolved, _ = jbackends.select(platform_, "auto", m=m, n=n, k=k, out_dtype=od,
                                       has_c=False)
      except Exception as e:  # noqa: BLE001
        raise Unavailable(f"auto selection failed: {e}") from e
    if backend in PALLAS and opts.interpret and not on_gpu:
      mod_name = jbackends.BACKENDS[backend].module
      try:
        module = importlib.import_module(mod_name)
      except ImportError as e:
        raise Unavailable(f"{mod_name} cannot be imported ({e})") from e
      if m * n * k > opts.interpret_max_mnk:
        raise Skipped(f"M*N*K = {m * n * k} > --interpret_max_mnk="
                          f"{opts.interpret_max_mnk} (GPU interpret mode is slow)")
      # The public primitive does not run in interpret mode yet (ordered io_callback
      # effects), so the kernel module's 2-D entry point is called directly.
      fn = lambda a, sa, b, sb: module.blockwise_fp8_dot(  # noqa: E731
          a, sa, b, sb, None, beta=1.0, out_dtype=od)
      return Contender(name, fn, fp8_args, resolved=backend, interpret_module=module)
    fn = lambda a, sa, b, sb: jax_fp8.blockwise_fp8_dot(  # noqa: E731
        a, sa, b, sb, out_dtype=od, backend=backend)
    # The reference's float32 HIGHEST dot: XLA's autotuning of Triton GEMMs for it costs
    # ~10 s of compilation per shape on the H100 and picks cuBLAS anyway; go to cuBLAS.
    options = CUBLAS_ONLY if on_gpu and resolved == "reference" else None
    return Contender(name, fn, fp8_args, resolved=resolved, compiler_options=options)

  if name == "xla_fp8_tensorwise":
    # cuBLASLt only (XLA's Triton GEMMs off): this peer is the cuBLASLt FP8 ceiling,
    # and XLA then autotunes cuBLASLt algorithms only, which compiles much faster.
    options = CUBLAS_ONLY if on_gpu else None
    if opts.tensorwise_scales == "one":
      # Per-tensor scales ride in cuBLASLt's alpha for free; with scale 1 XLA emits the
      # bare FP8 GEMM with the output dtype written directly: one kernel.
      fn = lambda a, b: lax.dot_general(a, b, (((1,), (1,)), ((), ())),  # noqa: E731
                                        preferred_element_type=od)
      return Contender(name, fn, lambda s: (s.a, s.b), contract="tensorwise",
                       is_kernel=False, compiler_options=options)
    # Runtime scales: XLA's GEMM rewriter turns (convert(fp8) * s) . (convert(fp8) * s)
    # into one cuBLASLt FP8 matmul (it adds two tiny kernels casting the scalars).
    def fn(a, b, sa, sb):
      return lax.dot_general(a.astype(od) * sa, b.astype(od) * sb, (((1,), (1,)), ((), ())),
                             preferred_element_type=od)
    scales = tensor_scales(opts)
    return Contender(name, fn, lambda s: (s.a, s.b, *[jnp.asarray(v, od) for v in scales]),
                     contract="tensorwise", is_kernel=False, compiler_options=options)

  if name == "bf16":
    deq = jax.jit(lambda a, sa, b, sb: (jax_fp8.dequantize_1x128(a, sa, jnp.bfloat16),
                                        jax_fp8.dequantize_128x128(b, sb, jnp.bfloat16)))
    return Contender(name, lambda x, y: _dot_nt(x, y, od), lambda s: deq(*fp8_args(s)),
                     is_kernel=False)

  if name == "dequant_bf16":
    def fn(a, sa, b, sb):
      x = jax_fp8.dequantize_1x128(a, sa, jnp.bfloat16)
      y = jax_fp8.dequantize_128x128(b, sb, jnp.bfloat16)
      return _dot_nt(x, y, od)
    return Contender(name, fn, fp8_args, is_kernel=False)

  if name == "cublas_blockwise":
    return make_cublas_contender(od, on_gpu)
  raise ValueError(name)


# ---- torch (cuBLAS blockwise FP8) -------------------------------------------------------

def _torch():
  try:
    import torch
  except Exception as e:  # noqa: BLE001 (ImportError or a broken install)
    raise Unavailable(f"torch is not importable ({type(e).__name__}: {e})") from e
  if not torch.cuda.is_available():
    raise Unavailable(f"torch {torch.__version__} sees no CUDA device")
  if not hasattr(torch, "_scaled_mm"):
    raise Unavailable(f"torch {torch.__version__} has no torch._scaled_mm")
  return torch


def _to_torch(x):
  torch = _torch()
  if np.dtype(x.dtype) == np.dtype(FP8):
    u8 = lax.bitcast_convert_type(x, jnp.uint8)
    try:
      t = torch.from_dlpack(u8)
    except Exception:  # noqa: BLE001 (no DLPack: through the host)
      t = torch.from_numpy(np.asarray(u8)).cuda()
    return t.view(torch.float8_e4m3fn).clone()
  try:
    return torch.from_dlpack(x).clone()
  except Exception:  # noqa: BLE001
    return torch.from_numpy(np.asarray(x)).cuda()


def make_cublas_contender(out_dtype, on_gpu) -> Contender:
  if not on_gpu:
    raise Unavailable("needs an NVIDIA GPU (torch._scaled_mm, cuBLAS blockwise FP8)")
  torch = _torch()
  tdtype = {BF16: torch.bfloat16, F32: torch.float32}[np.dtype(out_dtype)]

  def prepare(s: InputSet):
    a, w = _to_torch(s.a), _to_torch(s.b)
    # cuBLAS takes the 1x128 scales M-major ([M, K/128] with stride (1, M)) and the
    # 128x128 scales as a contiguous [N/128, K/128], passed transposed.
    sa = _to_torch(s.a_scale).t().contiguous().t()
    sb = _to_torch(s.b_scale).contiguous()
    return a, w, sa, sb

  def fn(a, w, sa, sb):
    return torch._scaled_mm(a, w.t(), sa, sb.t(), out_dtype=tdtype)

  return Contender("cublas_blockwise", fn, prepare, is_kernel=False)


def _time_torch(fn, sets_args, iters, warmup):
  """(ms per call, kernel names, method, output of set 0) from torch profiler kernel times.

  Call i runs on input set i % R, as for JAX; the median of the per-call sums of
  kernel durations is reported.
  """
  torch = _torch()
  r = len(sets_args)
  out0 = fn(*sets_args[0])
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
    names = _kernel_summary([(e.name(), 0.0) for e in events[:per_call]])
    return statistics.median(times), names, "torch_profiler", out0
  except Exception as e:  # noqa: BLE001 (profiler unusable: CUDA events, mean)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for args in calls:
      fn(*args)
    end.record()
    torch.cuda.synchronize()
    return (start.elapsed_time(end) / iters, [],
            f"cuda_events_mean (torch profiler failed: {_short(e)})", out0)


# ---- timing ---------------------------------------------------------------------------

def _kernel_summary(timings):
  counts = collections.Counter(name for name, _ in timings)
  return [f"{name[:100]} x{c}" for name, c in counts.items()]


try:
  from jax._src import stages as _stages
  _WRAPPED = _stages.Wrapped
except (ImportError, AttributeError):  # pragma: no cover (a jax without it)
  _WRAPPED = None


class _Rotating(*((_WRAPPED,) if _WRAPPED is not None else ())):
  """A compiled call that takes its operands from the next input set at each call.

  profiler.measure calls f(*args) once to warm up and then `iterations` times;
  as a jax.stages.Wrapped it is called as it is (not re-jitted), so every call,
  the warm-up included, reads a different set from the one before it: with the
  sets larger than the L2 together, no call finds its operands there.
  """

  def __init__(self, compiled, sets_args, start):
    self._compiled, self._sets, self._next = compiled, sets_args, start

  def __call__(self):
    args = self._sets[self._next % len(self._sets)]
    self._next += 1
    return self._compiled(*args)


def _compile(fn, args, compiler_options=None):
  return jax.jit(fn).lower(*args).compile(compiler_options=compiler_options)


def _time_jax_gpu(fn, sets_args, iters, warmup, out_bytes, compiler_options=None):
  """(ms per call, kernel names, output of set 0) through CUPTI, one call per set."""
  from jax.experimental.mosaic.gpu import profiler
  if _WRAPPED is None:
    raise Unavailable("jax._src.stages.Wrapped is missing: cannot rotate input sets "
                      "under profiler.measure")
  r = len(sets_args)
  compiled = _compile(fn, sets_args[0], compiler_options)
  out0 = jax.block_until_ready(compiled(*sets_args[0]))  # compile, and the output checked
  for i in range(warmup):
    jax.block_until_ready(compiled(*sets_args[(i + 1) % r]))
  rotating = _Rotating(compiled, sets_args, warmup + 1)
  # measure keeps every call's output alive until the end: bound that memory.
  chunk = max(1, min(iters, _MEASURE_OUT_BUDGET // max(1, out_bytes)))
  times, names, done = [], None, 0
  while done < iters:
    c = min(chunk, iters - done)
    _, t = profiler.measure(rotating, aggregate=False, iterations=c)()
    if t is None:
      raise RuntimeError("CUPTI recorded no kernel")
    per_call = [t] if c == 1 else t
    times += [sum(ms for _, ms in call) for call in per_call]
    names = names or _kernel_summary(per_call[0])
    done += c
  return statistics.median(times), names, out0


def _time_cpu(fn, sets_args, iters, warmup, compiler_options=None):
  f = _compile(fn, sets_args[0], compiler_options)
  out0 = jax.block_until_ready(f(*sets_args[0]))  # compile
  r = len(sets_args)
  for i in range(warmup):
    jax.block_until_ready(f(*sets_args[i % r]))
  times = []
  for i in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*sets_args[i % r]))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times), out0


# ---- results ----------------------------------------------------------------------------

@dataclasses.dataclass
class Row:
  m: int
  n: int
  k: int
  backend: str
  status: str = "ok"            # ok | interpret | unavailable | error | skipped | pending
  reason: str | None = None
  resolved: str | None = None
  ms: float | None = None
  tflops: float | None = None
  rel_err: float | None = None
  check: str | None = None      # ok | FAIL | not checked: why
  bound: float | None = None
  contract: str = "blockwise"
  is_kernel: bool = True
  timing: str | None = None
  input_sets: int | None = None
  kernels: list = dataclasses.field(default_factory=list)
  wall_s: float | None = None   # seconds this row took (compile, timing), for the log
  ratios: dict = dataclasses.field(default_factory=dict)  # peer -> peer_ms / ms


def _short(e: BaseException, limit=200) -> str:
  text = " ".join(f"{type(e).__name__}: {e}".split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def _row_cells(row: Row, peers: list) -> list:
  shape = f"{row.m}x{row.n}x{row.k}"
  name = row.backend if row.resolved in (None, row.backend) else f"{row.backend}={row.resolved}"
  if row.status in ("unavailable", "error", "skipped"):
    word = "skipped" if row.status == "skipped" else "unavailable"
    return [shape, name, f"{word}: {row.reason}"]
  if row.status == "pending":
    return [shape, name, "pending"]
  tf = None if row.tflops is None else (
      f"{row.tflops:.1f}" if row.tflops >= 10 else f"{row.tflops:.4f}")
  cells = [shape, name, _fmt(row.ms, ".4f"), tf or "-"]
  cells += [_fmt(row.ratios.get(p), ".2f") for p in peers]
  err = "-" if row.rel_err is None else f"{row.rel_err:.2e}"
  if row.check and row.check not in ("ok",):
    err += f" {row.check}"
  if row.contract != "blockwise":
    err += f" (vs {row.contract})"
  cells.append(err)
  if row.status == "interpret":
    cells.append("interpret mode: correctness only")
  return cells


def header(peers: list) -> list:
  return ["shape MxNxK", "backend", "ms", "TFLOP/s", *[f"vs_{p}" for p in peers], "rel_err"]


_MIN_WIDTHS = (16, 22, 9, 8)


def format_table(rows, peers) -> str:
  head = header(peers)
  body = [_row_cells(r, peers) for r in rows]
  widths = [max(len(h), _MIN_WIDTHS[i] if i < len(_MIN_WIDTHS) else 0) for i, h in enumerate(head)]
  for cells in body:
    if len(cells) < len(head):  # "unavailable: why" runs on past the columns
      continue
    for i, c in enumerate(cells[:len(head)]):
      widths[i] = max(widths[i], len(c))
  line = lambda cells: "  ".join(  # noqa: E731
      c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(cells)).rstrip()
  return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in body])


def compute_ratios(rows, peers):
  """ratio = peer ms / row ms: > 1 means faster than that peer."""
  by_shape = collections.defaultdict(dict)
  for r in rows:
    if r.ms is not None:
      by_shape[(r.m, r.n, r.k)][r.backend] = r.ms
  for r in rows:
    if r.ms is None:
      continue
    for p in peers:
      pm = by_shape[(r.m, r.n, r.k)].get(p)
      if pm is not None:
        r.ratios[p] = pm / r.ms


# ---- the run --------------------------------------------------------------------------

class _References:
  """float64 references of input set 0, computed on the host in a background thread."""

  def __init__(self):
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._cpu = jax.devices("cpu")[0]
    self._futures = {}

  def submit(self, key, s: InputSet, contracts, tensorwise_scales=(1.0, 1.0)):
    host = [np.asarray(x) for x in (s.a, s.a_scale, s.b, s.b_scale)]
    for contract in contracts:
      self._futures[(key, contract)] = self._pool.submit(self._compute, host, contract,
                                                         tensorwise_scales)

  def _compute(self, host, contract, tensorwise_scales):
    a, sa, b, sb = host
    if contract == "tensorwise":
      sa = np.full_like(sa, tensorwise_scales[0])
      sb = np.full_like(sb, tensorwise_scales[1])
    # On the host CPU device: no kernel may land on the GPU while CUPTI records.
    with jax.default_device(self._cpu):
      return testing.reference_f64(a, sa, b, sb)

  def get(self, key, contract):
    return self._futures[(key, contract)].result()

  def get_device(self, key, contract):
    """The reference as a float64 array on the default device (uploaded once)."""
    if (key, contract, "device") not in self._futures:
      with jax.enable_x64(True):
        self._futures[(key, contract, "device")] = jnp.asarray(self.get(key, contract))
    return self._futures[(key, contract, "device")]

  def drop(self, key):
    for k in [k for k in self._futures if k[0] == key]:
      del self._futures[k]

  def close(self):
    self._pool.shutdown(wait=False, cancel_futures=True)


@jax.jit
def _rel_error_f64(out, ref):
  """testing.rel_error on the device: ||out - ref||_F / ||ref||_F in float64, NaN if
  out has a non-finite value (call under jax.enable_x64)."""
  o = out.astype(jnp.float64)
  denom = jnp.linalg.norm(ref)
  err = jnp.linalg.norm(o - ref) / jnp.where(denom > 0, denom, 1.0)
  return jnp.where(jnp.all(jnp.isfinite(o)), err, jnp.nan)


def rel_error(out, ref_device) -> float:
  if tuple(out.shape) != tuple(ref_device.shape):
    raise AssertionError(f"shape {tuple(out.shape)} != reference shape {ref_device.shape}")
  with jax.enable_x64(True):
    return float(_rel_error_f64(out, ref_device))


def _check(row: Row, out, ref, on_gpu, opts):
  row.rel_err = rel_error(out, ref)
  bound = (GPU_TOLERANCE if on_gpu else testing.TOLERANCE)[np.dtype(opts.out_dtype)]
  if row.backend in ("bf16", "dequant_bf16"):
    row.check = "ok" if np.isfinite(row.rel_err) else "FAIL (NaN)"
    return  # bf16-rounded inputs: no bound, the error is reported
  row.bound = bound
  row.check = "ok" if row.rel_err <= bound else f"FAIL (> {bound:.1e})"


def _torch_to_jax(t):
  try:
    return jax.dlpack.from_dlpack(t.contiguous())
  except Exception:  # noqa: BLE001 (through the host)
    return jnp.asarray(t.float().cpu().numpy())


class Terminated(BaseException):
  """SIGTERM (e.g. `timeout`): stop timing, still write what was measured."""


def _timed_jax_row(row: Row, name, sets, opts: Options, on_gpu):
  """Runs one JAX contender at one shape; returns the output of input set 0 or None."""
  m, n, k = row.m, row.n, row.k
  t_row = time.perf_counter()
  out0 = None
  try:
    c = make_contender(name, m, n, k, opts, on_gpu)
    row.resolved, row.contract, row.is_kernel = c.resolved, c.contract, c.is_kernel
    args = [c.prepare(s) for s in sets]
    if c.interpret_module is not None:
      with testing.gpu_interpret_mode(detect_races=True):
        out0 = jax.block_until_ready(jax.jit(c.fn)(*args[0]))
      row.status = "interpret"
    elif on_gpu:
      out_bytes = m * n * np.dtype(opts.out_dtype).itemsize
      row.ms, row.kernels, out0 = _time_jax_gpu(c.fn, args, opts.iters, opts.warmup,
                                                out_bytes, c.compiler_options)
      row.timing = "cupti"
    else:
      row.ms, out0 = _time_cpu(c.fn, args, opts.iters, opts.warmup, c.compiler_options)
      row.timing = "cpu_wall_clock"
    if row.ms:
      row.tflops = 2.0 * m * n * k / (row.ms * 1e-3) / 1e12
  except Skipped as e:
    row.status, row.reason = "skipped", str(e)
  except (Unavailable, jax_fp8.BackendUnavailableError, NotImplementedError, ImportError) as e:
    row.status, row.reason = "unavailable", (str(e) if isinstance(e, Unavailable) else _short(e))
  except Exception as e:  # noqa: BLE001 (a failing backend is reported, not fatal)
    row.status, row.reason = "error", _short(e)
  row.wall_s = round(time.perf_counter() - t_row, 2)
  return out0


def _timed_torch_row(row: Row, opts: Options, on_gpu, ref_host):
  m, n, k = row.m, row.n, row.k
  t_row = time.perf_counter()
  try:
    c = make_contender(row.backend, m, n, k, opts, on_gpu)
    sets = make_sets(opts.seed, m, n, k, row.input_sets)  # the same operands as for JAX
    args = [c.prepare(s) for s in sets]
    del sets
    row.ms, row.kernels, row.timing, out0 = _time_torch(c.fn, args, opts.iters, opts.warmup)
    del args
    row.status = "ok"
    row.tflops = 2.0 * m * n * k / (row.ms * 1e-3) / 1e12
    if ref_host is not None:
      with jax.enable_x64(True):
        ref_dev = jnp.asarray(ref_host)
      _check(row, _torch_to_jax(out0), ref_dev, on_gpu, opts)
  except Unavailable as e:
    row.status, row.reason = "unavailable", str(e)
  except Exception as e:  # noqa: BLE001
    row.status, row.reason = "error", _short(e)
  row.wall_s = round(time.perf_counter() - t_row, 2)


def run(opts: Options, on_gpu: bool, log=print) -> dict:
  dev = gpu_device() if on_gpu else None
  r_peers = [p for p in PEERS if p in opts.backends]
  jax_names = [b for b in opts.backends if b in JAX_PEERS] + \
              [b for b in opts.backends if b not in PEERS]  # peers first: ratios as we go
  torch_names = [b for b in opts.backends if b in TORCH_PEERS]
  refs = _References() if opts.check else None
  refs_kept = {}
  rows: list[Row] = []
  notes: list[str] = []
  t_start = time.perf_counter()
  log(f"device: {device_description(dev)}")
  log(f"jax {jax.__version__}; out_dtype {np.dtype(opts.out_dtype).name}; "
      f"backends {','.join(opts.backends)}")
  log(f"method: {method_text(opts, on_gpu)}")
  log("")
  log(format_table([], r_peers))

  def emit(row):
    compute_ratios([r for r in rows if (r.m, r.n, r.k) == (row.m, row.n, row.k)], r_peers)
    log(format_table([row], r_peers).split("\n", 2)[2])

  def checkable(m, n, k):
    return opts.check and 2 * m * n * k / 1e9 <= opts.check_max_gflop

  def not_checked(row):
    if opts.check and row.status in ("ok", "interpret") and row.check is None:
      row.check = f"not checked: 2MNK > --check_max_gflop={opts.check_max_gflop:g}"

  def result(final):
    failed = [r for r in rows if r.is_kernel and r.check and r.check.startswith("FAIL")]
    return {
        "device": device_description(dev),
        "platform": "gpu" if on_gpu else "cpu",
        "jax_version": jax.__version__,
        "torch_version": torch_version() if torch_names else None,
        "method": method_text(opts, on_gpu),
        "out_dtype": np.dtype(opts.out_dtype).name,
        "tensorwise_scales": opts.tensorwise_scales,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "complete": final and not notes,
        "notes": notes,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "failed": len(failed),
        "results": [_row_json(r) for r in rows],
    }

  def write_json(final=False):
    if opts.json_out:
      tmp = opts.json_out + ".tmp"
      with open(tmp, "w") as f:
        json.dump(result(final), f, indent=1)
      os.replace(tmp, opts.json_out)

  def over_budget():
    return opts.time_budget_s > 0 and time.perf_counter() - t_start > opts.time_budget_s

  try:
    for i, (m, n, k) in enumerate(opts.shapes):
      if over_budget():
        left = ", ".join(f"{a}x{b}x{c}" for a, b, c in opts.shapes[i:])
        notes.append(f"--time_budget_s={opts.time_budget_s:g} reached: not run: {left}")
        log(f"# {notes[-1]}")
        break
      t_shape = time.perf_counter()
      key = (m, n, k)
      r = num_sets(m, n, k, opts)
      sets = make_sets(opts.seed, m, n, k, r)
      if checkable(m, n, k):
        contracts = {"tensorwise"} if "xla_fp8_tensorwise" in jax_names else set()
        refs.submit(key, sets[0], sorted(contracts | {"blockwise"}), tensor_scales(opts))
      shape_rows, outs = [], {}
      for name in jax_names:
        row = Row(m, n, k, name, input_sets=r)
        rows.append(row)
        shape_rows.append(row)
        outs[name] = _timed_jax_row(row, name, sets, opts, on_gpu)
      del sets
      # Checks once the shape's timings are done (the reference ran meanwhile).
      t_wait = time.perf_counter()
      if checkable(m, n, k):
        refs.get(key, "blockwise")
      t_wait = time.perf_counter() - t_wait
      for row in shape_rows:
        out0 = outs.pop(row.backend, None)
        if out0 is not None and checkable(m, n, k):
          try:
            _check(row, out0, refs.get_device(key, row.contract), on_gpu, opts)
          except Exception as e:  # noqa: BLE001
            row.check = f"check failed to run: {_short(e)}"
        not_checked(row)
        emit(row)
      del outs
      for name in torch_names:
        rows.append(Row(m, n, k, name, status="pending", input_sets=r, is_kernel=False))
      if torch_names and checkable(m, n, k):
        refs_kept[key] = refs.get(key, "blockwise")
      if refs is not None:
        refs.drop(key)
      log(f"# {m}x{n}x{k}: {time.perf_counter() - t_shape:.1f} s, of which {t_wait:.1f} s "
          f"waiting for the float64 reference; {r} input sets")
      write_json()

    # torch after every JAX CUPTI timing (see the module docstring).
    for row in [r for r in rows if r.status == "pending"]:
      _timed_torch_row(row, opts, on_gpu, refs_kept.get((row.m, row.n, row.k)))
      not_checked(row)
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

  compute_ratios(rows, r_peers)
  log("")
  log(f"summary ({'GPU kernel time' if on_gpu else 'CPU wall clock: CPU numbers'}; "
      f"vs_<peer> = peer ms / ms, > 1 is faster than the peer):")
  log(format_table(rows, r_peers))
  for note in notes:
    log(f"NOTE: {note}")
  out = result(True)
  if out["failed"]:
    failed = [r for r in rows if r.is_kernel and r.check and r.check.startswith("FAIL")]
    log(f"CHECK FAILED: {', '.join(f'{r.backend} {r.m}x{r.n}x{r.k}' for r in failed)}")
  if opts.json_out:
    write_json(final=True)
    log(f"wrote {opts.json_out}")
  if opts.plot_out:
    try:
      plot(rows, opts.plot_out, out["device"], on_gpu, log)
    except Exception as e:  # noqa: BLE001 (the plot is optional)
      log(f"plot failed: {_short(e)}")
  return out


def _row_json(r: Row) -> dict:
  d = dataclasses.asdict(r)
  d["shape"] = f"{r.m}x{r.n}x{r.k}"
  for key in ("rel_err", "ms", "tflops"):
    if d[key] is not None and not math.isfinite(d[key]):
      d[key] = None if key != "rel_err" else "nan"
  return d


def plot(rows, path, device, on_gpu, log=print):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    log(f"matplotlib is not installed: --plot_out={path} skipped")
    return
  timed = [r for r in rows if r.tflops]
  if not timed:
    log("nothing was timed: no plot")
    return
  shapes = list(dict.fromkeys(f"{r.m}x{r.n}x{r.k}" for r in timed))
  names = list(dict.fromkeys(r.backend for r in timed))
  val = {(f"{r.m}x{r.n}x{r.k}", r.backend): r.tflops for r in timed}
  width = 0.8 / len(names)
  fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(shapes) * max(1, len(names) / 3)), 5))
  for i, name in enumerate(names):
    xs = [j + i * width for j in range(len(shapes))]
    ax.bar(xs, [val.get((s, name), 0.0) for s in shapes], width, label=name)
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))])
  ax.set_xticklabels(shapes, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("TFLOP/s")
  ax.set_title(f"blockwise FP8 matmul, {device}" + ("" if on_gpu else " (CPU numbers)"),
               fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  log(f"wrote {path}")


def main(argv):
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU" noise
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  on_gpu = gpu_device() is not None
  if not on_gpu:
    print("no GPU found: CPU numbers, reference backend"
          + (" (+ Pallas kernels in GPU interpret mode)" if FLAGS.interpret else ""))
  opts = Options(
      shapes=parse_shapes(FLAGS.shapes, on_gpu),
      backends=parse_backends(FLAGS.backends, on_gpu, FLAGS.interpret),
      out_dtype=np.dtype(FLAGS.out_dtype), iters=max(1, FLAGS.iters),
      warmup=max(0, FLAGS.warmup), rotate_mb=FLAGS.rotate_mb, max_sets=max(1, FLAGS.max_sets),
      check=FLAGS.check or FLAGS.interpret, check_max_gflop=FLAGS.check_max_gflop,
      interpret=FLAGS.interpret,
      interpret_max_mnk=FLAGS.interpret_max_mnk, json_out=FLAGS.json_out,
      plot_out=FLAGS.plot_out, seed=FLAGS.seed, time_budget_s=FLAGS.time_budget_s,
      tensorwise_scales=FLAGS.tensorwise_scales)
  def on_sigterm(signum, frame):
    raise Terminated()
  signal.signal(signal.SIGTERM, on_sigterm)
  result = run(opts, on_gpu, log=lambda s: print(s, flush=True))
  if result["failed"]:
    return 1
  return 0 if result["complete"] or not any("interrupted" in n for n in result["notes"]) else 2


if __name__ == "__main__":
  define_flags()
  app.run(main)
