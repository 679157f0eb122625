"""The dense op: jax_fp8.blockwise_fp8_dot's backends against cuBLAS, DeepGEMM, XLA and bf16.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[n // 128, kb]

One case per shape M x N x K; one input set is (a, a_scale, b, b_scale) with
jax_fp8.testing's distribution (scales over several binades), drawn on the device.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_fp8
from jax_fp8 import backends
from jax_fp8 import testing
from harness import checks
from harness import report
from harness import runner
from harness import torch_glue
from harness.registry import Contender, Registry, Skipped, Unavailable
from workloads import common
from workloads import deepgemm

F32, BF16 = np.dtype(jnp.float32), np.dtype(jnp.bfloat16)

DEEPSEEK_V3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                  (7168, 2048))
PRESETS = {
    # Grouped by weight (N, K), M = 64, 128, 4096 (decode to prefill) within each.
    "deepseek_v3": tuple((m, n, k) for n, k in DEEPSEEK_V3_NK for m in (64, 128, 4096)),
    # Small enough for the CPU; 100x200x300 has unaligned M, N and a partial K block.
    "small": ((64, 128, 256), (100, 200, 300), (128, 256, 512), (256, 512, 1024)),
    # Between decode and prefill, where the Hopper rules take narrow one-wave tiles
    # (hopper_cost.MID_M_FORMS): whole row tiles and a partial last one, at the
    # DeepSeek-V3 weights with K >= 4096.
    "mid_m": tuple((m, n, k) for n, k in DEEPSEEK_V3_NK if k >= 4096
                   for m in (256, 300, 384, 512, 1000)),
}

# Per-tensor scales of the xla_fp8_tensorwise peer with --tensorwise_scales=runtime
# (powers of two: exact in bf16).
TENSOR_SCALE_A, TENSOR_SCALE_B = 2.0**-8, 2.0**-7
# FP8 WGMMA on Hopper adds a 128-deep block in a ~14-bit accumulator: f32 outputs
# carry ~1.3e-4 relative error on the GPU (tests/test_pallas_sm90.py, GPU_TOL).
GPU_TOLERANCE = {BF16: testing.TOLERANCE[BF16], F32: 2.5e-4}
# (xla_gpu_autotune_level=0 is no way out: untuned Triton GEMMs ran at ~20 TFLOP/s.)
CUBLAS_ONLY = {"xla_gpu_enable_triton_gemm": False}


@dataclasses.dataclass
class Options(runner.Options):
  out_dtype: np.dtype = BF16
  tensorwise_scales: str = "one"
  interpret_max_mnk: int = 128 * 256 * 512


def tensor_scales(opts: Options) -> tuple[float, float]:
  return (TENSOR_SCALE_A, TENSOR_SCALE_B) if opts.tensorwise_scales == "runtime" else (1.0, 1.0)


def tolerance(env, out_dtype) -> float:
  return (GPU_TOLERANCE if env.on_gpu else testing.TOLERANCE)[np.dtype(out_dtype)]


# ---- cases and operands ------------------------------------------------------------

@dataclasses.dataclass
class InputSet:
  a: jax.Array        # [M, K] e4m3
  a_scale: jax.Array  # [M, ceil(K/128)] f32
  b: jax.Array        # [N, K] e4m3
  b_scale: jax.Array  # [ceil(N/128), ceil(K/128)] f32


def set_bytes(m, n, k, out_dtype) -> int:
  kb, nb = common.blocks(k), common.blocks(n)
  return m * k + n * k + 4 * (m * kb + nb * kb) + m * n * np.dtype(out_dtype).itemsize


def case(m, n, k, out_dtype) -> runner.Case:
  return runner.Case(label=f"{m}x{n}x{k}", dims={"m": m, "n": n, "k": k},
                     flops=2.0 * m * n * k, set_bytes=set_bytes(m, n, k, out_dtype),
                     contract="blockwise", params=(m, n, k))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _make_set(key, m, n, k):
  ka, kb_, ksa, ksb = jax.random.split(key, 4)
  nkb, nnb = common.blocks(k), common.blocks(n)
  return (common.random_fp8(ka, (m, k)), common.random_scales(ksa, (m, nkb)),
          common.random_fp8(kb_, (n, k)), common.random_scales(ksb, (nnb, nkb)))


def make_sets(case_: runner.Case, count: int, seed: int) -> list[InputSet]:
  m, n, k = case_.params
  # The operands of every earlier version of this benchmark (alternate.py compares trees).
  base = jax.random.fold_in(jax.random.key(seed), (m * 1_000_003 + n * 1009 + k) % (2**31))
  return [InputSet(*_make_set(jax.random.fold_in(base, i), m, n, k)) for i in range(count)]


def _dot_nt(x, y, out_dtype):
  """x [M, K] . y [N, K]^T with float32 accumulation."""
  acc = lax.dot_general(x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  return acc.astype(out_dtype)


def _fp8_args(s: InputSet):
  return s.a, s.a_scale, s.b, s.b_scale


# ---- contenders ---------------------------------------------------------------------

REGISTRY = Registry()


def _jax_fp8(name, case_, opts: Options, env) -> Contender:
  m, n, k = case_.params
  od = opts.out_dtype
  backend = common.pallas_backend(env) if name == "pallas" else name
  resolved = backend
  if backend == "auto":
    try:
      resolved, _ = backends.select(env.platform, "auto", m=m, n=n, k=k, out_dtype=od,
                                    has_c=False)
    except Exception as e:  # noqa: BLE001
      raise Unavailable(f"auto selection failed: {e}") from e
  interpret = backend in backends.PALLAS and opts.interpret and not env.on_gpu
  common.needs_gpu_or_interpret(backend, env, opts.interpret)
  if interpret and m * n * k > opts.interpret_max_mnk:
    raise Skipped(f"M*N*K = {m * n * k} > --interpret_max_mnk={opts.interpret_max_mnk} "
                  "(GPU interpret mode is slow)")
  fn = lambda a, sa, b, sb: jax_fp8.blockwise_fp8_dot(  # noqa: E731
      a, sa, b, sb, out_dtype=od, backend=backend)
  # The reference's float32 HIGHEST dot: XLA's autotuning of Triton GEMMs for it costs
  # ~10 s of compilation per shape on the H100 and picks cuBLAS anyway; go to cuBLAS.
  options = CUBLAS_ONLY if env.on_gpu and resolved == "reference" else None
  return Contender(fn, _fp8_args, contract="blockwise", bound=tolerance(env, od),
                   resolved=resolved, interpret=interpret, compiler_options=options)


for _name in backends.BACKENDS:
  REGISTRY.add(_name, f"jax_fp8 backend {_name!r}", role="backend")(
      functools.partial(_jax_fp8, _name))
REGISTRY.add("pallas", 'the Pallas kernel "auto" picks: pallas_sm90 on Hopper, pallas_sm100 '
             "on Blackwell", role="backend", in_all=False)(functools.partial(_jax_fp8, "pallas"))
REGISTRY.add("auto", 'whatever backend="auto" selects', role="backend", in_all=False)(
    functools.partial(_jax_fp8, "auto"))


@REGISTRY.add("cublas_blockwise", "torch._scaled_mm with 1x128 / 128x128 f32 scales (cuBLAS "
              "blockwise FP8), needs torch + CUDA", runtime="torch")
def _cublas(case_, opts: Options, env) -> Contender:
  if not env.on_gpu:
    raise Unavailable("needs an NVIDIA GPU (torch._scaled_mm, cuBLAS blockwise FP8)")
  torch = torch_glue.cuda_torch()
  if not hasattr(torch, "_scaled_mm"):
    raise Unavailable(f"torch {torch.__version__} has no torch._scaled_mm")
  tdtype = {BF16: torch.bfloat16, F32: torch.float32}[np.dtype(opts.out_dtype)]

  def prepare(s: InputSet):
    a, w = torch_glue.to_torch(s.a), torch_glue.to_torch(s.b)
    # cuBLAS takes the 1x128 scales M-major ([M, K/128] with stride (1, M)) and the
    # 128x128 scales as a contiguous [N/128, K/128], passed transposed.
    sa = torch_glue.to_torch(s.a_scale).t().contiguous().t()
    sb = torch_glue.to_torch(s.b_scale).contiguous()
    return a, w, sa, sb

  def fn(a, w, sa, sb):
    return torch._scaled_mm(a, w.t(), sa, sb.t(), out_dtype=tdtype)

  return Contender(fn, prepare, contract="blockwise", bound=tolerance(env, opts.out_dtype))


@REGISTRY.add("deepgemm", "DeepGEMM's fp8_gemm_nt (1D2D, f32 scales) where `import deep_gemm` "
              "works (built on the GPU machine, not a dependency)", runtime="torch")
def _deepgemm(case_, opts: Options, env) -> Contender:
  fn, prepare = deepgemm.dense(env, np.dtype(opts.out_dtype).name)
  return Contender(fn, prepare, contract="blockwise", bound=tolerance(env, opts.out_dtype))


@REGISTRY.add("xla_fp8_tensorwise", "XLA FP8 dot with one scale per tensor, on cuBLASLt (the FP8 "
              "ceiling; a different contract, checked against its own reference)")
def _tensorwise(case_, opts: Options, env) -> Contender:
  od = opts.out_dtype
  # cuBLASLt only (XLA's Triton GEMMs off): this peer is the cuBLASLt FP8 ceiling,
  # and XLA then autotunes cuBLASLt algorithms only, which compiles much faster.
  options = CUBLAS_ONLY if env.on_gpu else None
  bound = tolerance(env, od)
  if opts.tensorwise_scales == "one":
    # Per-tensor scales ride in cuBLASLt's alpha for free; with scale 1 XLA emits the
    # bare FP8 GEMM with the output dtype written directly: one kernel.
    fn = lambda a, b: lax.dot_general(a, b, (((1,), (1,)), ((), ())),  # noqa: E731
                                      preferred_element_type=od)
    return Contender(fn, lambda s: (s.a, s.b), contract="tensorwise", bound=bound,
                     compiler_options=options)

  # Runtime scales: XLA's GEMM rewriter turns (convert(fp8) * s) . (convert(fp8) * s)
  # into one cuBLASLt FP8 matmul (it adds two tiny kernels casting the scalars).
  def fn(a, b, sa, sb):
    return lax.dot_general(a.astype(od) * sa, b.astype(od) * sb, (((1,), (1,)), ((), ())),
                           preferred_element_type=od)
  scales = tensor_scales(opts)
  return Contender(fn, lambda s: (s.a, s.b, *[jnp.asarray(v, od) for v in scales]),
                   contract="tensorwise", bound=bound, compiler_options=options)


@REGISTRY.add("bf16", "XLA bf16 dot of the dequantised operands")
def _bf16(case_, opts: Options, env) -> Contender:
  deq = jax.jit(lambda a, sa, b, sb: (jax_fp8.dequantize_1x128(a, sa, jnp.bfloat16),
                                      jax_fp8.dequantize_128x128(b, sb, jnp.bfloat16)))
  # bf16-rounded operands: no bound, the error is reported.
  return Contender(lambda x, y: _dot_nt(x, y, opts.out_dtype), lambda s: deq(*_fp8_args(s)),
                   contract="blockwise")


@REGISTRY.add("dequant_bf16", "jax_fp8.dequantize_* to bf16, then a bf16 dot (dequantisation "
              "is part of the timed call)")
def _dequant_bf16(case_, opts: Options, env) -> Contender:
  def fn(a, sa, b, sb):
    x = jax_fp8.dequantize_1x128(a, sa, jnp.bfloat16)
    y = jax_fp8.dequantize_128x128(b, sb, jnp.bfloat16)
    return _dot_nt(x, y, opts.out_dtype)
  return Contender(fn, _fp8_args, contract="blockwise")


def default_backends(env, interpret: bool) -> list[str]:
  """All on a GPU; the reference on the CPU (+ the Pallas kernels with --interpret)."""
  if env.on_gpu:
    return list(REGISTRY.all())
  return ["reference", *(backends.PALLAS if interpret else ())]


# ---- references -----------------------------------------------------------------------

def _reference(opts: Options):
  def compute(contract, host, case_):
    a, sa, b, sb = host
    if contract == "tensorwise":
      ta, tb = tensor_scales(opts)
      sa, sb = np.full_like(sa, ta), np.full_like(sb, tb)
    return testing.reference_f64(a, sa, b, sb)
  return checks.HostReferences(compute, lambda s: [np.asarray(x) for x in _fp8_args(s)])


def intro(opts: Options, env) -> list[str]:
  od = np.dtype(opts.out_dtype).name
  lines = [f"measured: one call of jax_fp8.blockwise_fp8_dot(a, a_scale, b, b_scale) per shape "
           f"M x N x K (a [M, K] and b [N, K] in FP8 with float32 block scales, {od} output), "
           "and of each peer on the same data; ms = median time of one call, "
           "TFLOP/s = 2*M*N*K / time"]
  if not env.on_gpu and not opts.interpret:
    lines.append("(--interpret also runs the Pallas kernels on the CPU in GPU interpret mode: "
                 "correctness only)")
  return lines


def workload(opts: Options) -> runner.Workload:
  return runner.Workload(
      name="blockwise_dot", registry=REGISTRY, make_sets=make_sets,
      references=lambda: _reference(opts), title="blockwise FP8 matmul",
      layout=report.Layout(),
      metadata=lambda o: {"out_dtype": np.dtype(o.out_dtype).name,
                          "tensorwise_scales": o.tensorwise_scales},
      intro=intro)
