#!/usr/bin/env python3
"""Benchmark of blockwise-scaled FP8 matmul: jax_fp8's backends against peers.

    out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[n // 128, kb]

Contenders (--backends, comma list):
  jax_fp8 backends  pallas (the Pallas kernel "auto" picks: pallas_sm90 on
                    Hopper, pallas_sm100 on Blackwell), pallas_sm90, pallas_sm100,
                    ffi, reference, auto (whatever "auto" selects)
  peers             cublas_blockwise    torch._scaled_mm with 1x128 / 128x128 f32
                                        scales (cuBLAS blockwise FP8), needs torch+CUDA
                    deepgemm            DeepGEMM's fp8_gemm_nt (the same recipe, f32
                                        scales), where `import deep_gemm` works (built
                                        on the GPU machine; not a dependency)
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
before; reported: the median over --iters calls. torch (cuBLAS, DeepGEMM) is
timed the same way from the kernel times of the torch profiler, after every JAX
timing (the Mosaic CUPTI subscriber cannot attach once the torch profiler has).
CPU: wall clock of single calls with block_until_ready, median over --iters,
same rotation of input sets.

--check compares the output of input set 0 with the float64 reference
(jax_fp8.testing.reference_f64, numpy on the host, computed in a background
thread while the GPU is timed); shapes above --check_max_gflop are not checked.
Exit status 1 if a jax_fp8 backend fails its bound (or a flag is wrong), 2 if
interrupted (SIGTERM, ^C: what was measured is still printed and written), else
0. --json_out is rewritten after every shape, so a run cut short leaves its
partial results. The machinery is in benchmarks/harness/, the contenders in
benchmarks/workloads/dense.py.

Examples:
  python benchmarks/blockwise_dot.py --shapes=small                  # CPU, reference
  python benchmarks/blockwise_dot.py --shapes=small --interpret      # + Pallas kernels in
                                                                     #   GPU interpret mode
  python benchmarks/blockwise_dot.py --shapes=deepseek_v3 --backends=all --check \\
      --json_out=results.json --plot_out=results.png                 # GPU
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness/, workloads/

import harness  # noqa: E402,F401  (puts the repository root on sys.path)
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from harness import cli  # noqa: E402
from harness import env as envs  # noqa: E402
from jax_fp8 import backends  # noqa: E402
from workloads import dense  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("shapes", "auto", "deepseek_v3 (18 shapes), mid_m (15 shapes of "
                      "256-1000 rows), small, a comma list of MxNxK, or auto (deepseek_v3 "
                      "on a GPU, small on the CPU)")
  flags.DEFINE_enum("out_dtype", "bfloat16", ["bfloat16", "float32"], "output dtype")
  flags.DEFINE_integer("interpret_max_mnk", 128 * 256 * 512, "largest M*N*K for --interpret")
  flags.DEFINE_enum("tensorwise_scales", "one", ["one", "runtime"], "xla_fp8_tensorwise: "
                    "one = the bare FP8 GEMM (per-tensor scales cost nothing in cuBLASLt's "
                    "alpha), runtime = multiply by runtime scalar scales (XLA then adds two "
                    "tiny scalar-cast kernels and may pick another GEMM)")
  cli.define_common_flags(check_default=False, interpret=True)


def parse_shapes(spec: str, on_gpu: bool) -> tuple:
  """Comma list of presets and MxNxK; auto = deepseek_v3 on a GPU, small on the CPU."""
  shapes = []
  for item in (s.lower() for s in cli.split_list(spec)):
    if item == "auto":
      item = "deepseek_v3" if on_gpu else "small"
    if item in dense.PRESETS:
      shapes.extend(dense.PRESETS[item])
    else:
      shapes.append(cli.parse_dims(item, 3, "shapes", f"a preset ({', '.join(dense.PRESETS)}) "
                                   "or MxNxK with three positive integers"))
  if not shapes:
    raise cli.UsageError("--shapes is empty")
  return tuple(dict.fromkeys(shapes))


def _check_pallas_on_cpu(names, env, interpret):
  """Explicitly asked for a Pallas kernel on a machine without a GPU: say how it runs."""
  asked = [n for n in cli.split_list(FLAGS.backends) if n in ("pallas", *backends.PALLAS)]
  if asked and not env.on_gpu and not interpret:
    raise cli.UsageError(f"--backends={','.join(asked)}: no GPU here; add --interpret to run "
                         "the Pallas kernels on the CPU in GPU interpret mode (correctness "
                         "only, no timing)")


def _main() -> int:
  env = envs.detect()
  shapes = parse_shapes(FLAGS.shapes, env.on_gpu)
  names = cli.parse_backends(FLAGS.backends, dense.REGISTRY,
                             dense.default_backends(env, FLAGS.interpret))
  _check_pallas_on_cpu(names, env, FLAGS.interpret)
  out_dtype = np.dtype(FLAGS.out_dtype)
  if not env.on_gpu:
    print("no GPU found: CPU numbers, reference backend"
          + (" (+ Pallas kernels in GPU interpret mode)" if FLAGS.interpret else
             " (a smoke test of the set-up, not GPU performance; on an NVIDIA GPU the same "
             "command times the Pallas kernels against cuBLAS, XLA FP8 and bf16)"), flush=True)
  cli.warn_if_no_plot()
  opts = cli.common_options(
      [dense.case(m, n, k, out_dtype) for m, n, k in shapes], names,
      options_class=dense.Options, check=FLAGS.check or FLAGS.interpret,
      interpret=FLAGS.interpret, out_dtype=out_dtype, tensorwise_scales=FLAGS.tensorwise_scales,
      interpret_max_mnk=FLAGS.interpret_max_mnk)
  return cli.run_workload(dense.workload(opts), opts, env)


def main(argv):
  return cli.run_main(_main, argv)


if __name__ == "__main__":
  define_flags()
  app.run(main)
