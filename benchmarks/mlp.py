#!/usr/bin/env python3
"""Benchmark of a DeepSeek-V3 dense MLP forward: bf16 against FP8, end to end.

    y = (silu(x Wg) * (x Wu)) Wd,   x [T, 7168], 7168 -> 2 x 18432 -> 7168

Cases (--cases): deepseek_v3 (tokens 64, 128, 1024, 4096, 16384; default on a GPU),
small (the CPU smoke test; default there), or a comma list of tokens (e.g. 4096).

Contenders (--backends, comma list):
  bf16             the MLP in bf16 (XLA's GEMMs)
  jax_fp8          per GEMM: quantize_1x128 + blockwise_fp8_dot (weights quantised
                   beforehand, activations inside the call)
  jax_fp8_glu      gate/up fused in jax_fp8.blockwise_fp8_glu (bf16 out), then
                   quantize + dot (issue 22 item 3; unavailable until it exists)
  jax_fp8_glu_fp8  the same with the FP8 output epilogue: no bf16 round trip
                   (issue 22 items 2-3; unavailable until it exists)
  all              every one (the default).

Timing, rotation past the L2 and the exit status are those of blockwise_dot.py.
--check (on by default) compares y with the exact float64 MLP of the bf16
inputs: FP8 rounding (~4e-2) is expected, the bound only catches garbage.

Examples:
  python benchmarks/mlp.py                                          # CPU: small cases
  python benchmarks/mlp.py --json_out=mlp.json --plot_out=mlp.png   # GPU
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
from workloads import mlp  # noqa: E402

FLAGS = flags.FLAGS
PRESETS = ("deepseek_v3", "small")


def define_flags():
  flags.DEFINE_string("cases", "auto", "deepseek_v3, small, a comma list of token counts "
                      "(at 7168 -> 2 x 18432 -> 7168), or auto (deepseek_v3 on a GPU, small "
                      "on the CPU)")
  cli.define_common_flags(check_default=True, check_max_gflop=1e7)


def parse_cases(spec: str, on_gpu: bool) -> list:
  cases = []
  for item in (s.lower() for s in cli.split_list(spec)):
    item = ("deepseek_v3" if on_gpu else "small") if item == "auto" else item
    if item in PRESETS:
      cases += mlp.cases([item])
    else:
      (tokens,) = cli.parse_dims(item, 1, "cases", f"a preset ({', '.join(PRESETS)}) or a "
                                 "positive token count")
      cases.append(mlp.case(tokens, mlp.HIDDEN, mlp.FFN))
  if not cases:
    raise cli.UsageError("--cases is empty")
  return list({c.label: c for c in cases}.values())


def _main() -> int:
  env = envs.detect()
  cases = parse_cases(FLAGS.cases, env.on_gpu)
  names = cli.parse_backends(FLAGS.backends, mlp.REGISTRY, mlp.default_backends(env))
  if not env.on_gpu:
    print("no GPU found: CPU numbers (a smoke test of the set-up)", flush=True)
  cli.warn_if_no_plot()
  opts = cli.common_options(cases, names)
  return cli.run_workload(mlp.workload(opts), opts, env)


def main(argv):
  return cli.run_main(_main, argv)


if __name__ == "__main__":
  define_flags()
  app.run(main)
