#!/usr/bin/env python3
"""Benchmark of FP8 training: one layer's forward + backward, and its wgrad GEMM.

Cases (--cases): deepseek_v3 (default on a GPU): tokens 4096 and 16384 at
7168 -> 18432 and 18432 -> 7168, each as
  step  value_and_grad of sum((x @ kernel) * g) with respect to x and kernel:
        jax_fp8.dense (quantisation included) against `x @ kernel` in bf16
  wgrad the weight-gradient GEMM alone, per-row 1x128 scales on both operands
        ("1D1D"), float32 out
or small (the CPU smoke test; default there).

Contenders (--backends, comma list):
  jax_fp8      step: jax_fp8.dense; wgrad: blockwise_fp8_dot(..., b_scale_block=(1, 128))
               (unavailable, with the reason, while jax_fp8 lacks them)
  jax_fp8_acc  wgrad with c (beta=1), accumulating into a float32 gradient
  pallas_direct  wgrad: this GPU's Pallas kernel with per-row b scales as
               jax_fp8.backends.select returns it (before the public op has them)
  bf16         step: bf16 x @ kernel and its jax.grad; wgrad: a bf16 dot, float32 out
  deepgemm     wgrad: DeepGEMM's 1D1D fp8_gemm_nt where `import deep_gemm` works
  all          every one (default on a GPU, + pallas_direct).

A step's time is the sum of the kernel times of one step (CUPTI); timing,
rotation past the L2, the order of torch peers and the exit status are those of
blockwise_dot.py. --check (on by default) compares gradients with the exact
float64 ones (FP8 rounding, ~4e-2, is expected; the bound only catches garbage)
and wgrad outputs with the float64 1D1D contract.

Examples:
  python benchmarks/training.py                                    # CPU: small cases
  python benchmarks/training.py --json_out=training.json --plot_out=training.png   # GPU
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness/, workloads/

import harness  # noqa: E402,F401  (puts the repository root on sys.path)
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from harness import cli  # noqa: E402
from harness import env as envs  # noqa: E402
from workloads import training  # noqa: E402

FLAGS = flags.FLAGS
PRESETS = ("deepseek_v3", "small")


def define_flags():
  flags.DEFINE_string("cases", "auto", "deepseek_v3, small, or auto (deepseek_v3 on a GPU, "
                      "small on the CPU)")
  flags.DEFINE_string("kinds", "step,wgrad", "comma list of step, wgrad")
  cli.define_common_flags(check_default=True, check_max_gflop=1e7)


def parse_cases(spec: str, kinds: str, on_gpu: bool) -> list:
  presets = []
  for item in (s.lower() for s in cli.split_list(spec)):
    item = ("deepseek_v3" if on_gpu else "small") if item == "auto" else item
    if item not in PRESETS:
      raise cli.UsageError(f"--cases: {item!r} is not one of {', '.join(PRESETS)}, auto")
    presets.append(item)
  wanted = cli.split_list(kinds)
  for kind in wanted:
    if kind not in ("step", "wgrad"):
      raise cli.UsageError(f"--kinds: {kind!r} is not step or wgrad")
  cases = [c for c in training.cases(dict.fromkeys(presets)) if c.params.kind in wanted]
  if not cases:
    raise cli.UsageError("--cases / --kinds select nothing")
  return cases


def _main() -> int:
  env = envs.detect()
  cases = parse_cases(FLAGS.cases, FLAGS.kinds, env.on_gpu)
  names = cli.parse_backends(FLAGS.backends, training.REGISTRY, training.default_backends(env))
  if not env.on_gpu:
    print("no GPU found: CPU numbers (a smoke test of the set-up)", flush=True)
  cli.warn_if_no_plot()
  opts = cli.common_options(cases, names)
  return cli.run_workload(training.workload(opts), opts, env)


def main(argv):
  return cli.run_main(_main, argv)


if __name__ == "__main__":
  define_flags()
  app.run(main)
