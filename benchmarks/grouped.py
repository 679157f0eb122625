#!/usr/bin/env python3
"""Benchmark of the MoE grouped GEMMs: jax_fp8's ragged and masked ops against peers.

    contiguous (ragged): rows of a laid out group after group; out[r] = a[r] . b[g(r)]^T
    masked:              out[g, r] = a[g, r] . b[g]^T for r < masked_m[g], else 0
(blockwise-scaled: 1x128 activation scales, 128x128 weight scales per group)

Cases (--cases, comma list): deepseek_v3 (both below; default on a GPU),
contiguous (4 x ~8192 and 8 x ~4096 rows, 32768 in all, at N x K = 4096 x 7168
and 7168 x 2048, group sizes aligned to 128 and not), masked (1 x ~1024,
2 x ~512, 4 x ~256, 32 x ~64), small (the CPU smoke test; default there), or
one case as contiguous:GxROWSxNxK[:unaligned] or masked:GxROWSxNxK.

Contenders (--backends, comma list):
  jax_fp8     reference, pallas_sm90, pallas_sm100, pallas (this GPU's), auto:
              jax_fp8.blockwise_fp8_ragged_dot / blockwise_fp8_masked_dot
              (unavailable, with the reason, while jax_fp8 lacks them);
              pallas_direct: this GPU's Pallas kernel as jax_fp8.backends.select
              returns it (the backend's 2-D ragged_dot / masked_dot), the kernels
              before the public ops exist
  peers       ragged_dot_bf16       jax.lax.ragged_dot in bf16 on the dequantised data
              ragged_dot_mgpu_bf16  JAX's Pallas Mosaic GPU ragged_dot kernel in bf16
                                    (block_m x block_n x block_k x steps x grid_block_n
                                    from --mgpu_config)
              dense_per_group       one jax_fp8.blockwise_fp8_dot per group
              bf16_batched          masked layout: a batched bf16 dot over the capacity
              deepgemm              DeepGEMM's m_grouped_fp8_gemm_nt_contiguous /
                                    _masked where `import deep_gemm` works
  all         every one; default on a GPU (+ auto, pallas_direct). On the CPU: reference,
              ragged_dot_bf16, dense_per_group, bf16_batched.

TFLOP/s counts real rows only; GB/s the bytes the FP8 problem must move (the
same count for every contender). Timing, rotation past the L2, the order of
torch peers and the exit status are those of blockwise_dot.py (see its help).
--check (on by default here) compares each output with a float64 reference
computed on the device before the case is timed.

Examples:
  python benchmarks/grouped.py                                     # CPU: small cases
  python benchmarks/grouped.py --cases=contiguous --json_out=grouped.json \\
      --plot_out=grouped.png                                        # GPU
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
from workloads import grouped  # noqa: E402

FLAGS = flags.FLAGS
PRESETS = ("deepseek_v3", "contiguous", "masked", "small")


def define_flags():
  flags.DEFINE_string("cases", "auto", f"comma list of {', '.join(PRESETS)}, "
                      "contiguous:GxROWSxNxK[:unaligned], masked:GxROWSxNxK, or auto "
                      "(deepseek_v3 on a GPU, small on the CPU)")
  flags.DEFINE_string("mgpu_config", "128x128x64x4x4", "ragged_dot_mgpu_bf16's block_m x "
                      "block_n x block_k x max_concurrent_steps x grid_block_n")
  cli.define_common_flags(check_default=True, check_max_gflop=1e7)


def parse_cases(spec: str, on_gpu: bool, seed: int) -> list:
  cases = []
  for item in (s.lower() for s in cli.split_list(spec)):
    if item == "auto":
      item = "deepseek_v3" if on_gpu else "small"
    if item in PRESETS:
      cases += grouped.cases([item], seed)
      continue
    layout, _, rest = item.partition(":")
    dims, _, variant = rest.partition(":")
    what = "a preset or contiguous:GxROWSxNxK[:unaligned] / masked:GxROWSxNxK"
    if layout not in ("contiguous", "masked") or variant not in ("", "unaligned") or (
        layout == "masked" and variant):
      raise cli.UsageError(f"--cases: {item!r} is not {what} (presets: {', '.join(PRESETS)})")
    g, rows, n, k = cli.parse_dims(dims, 4, "cases", what)
    cases.append(grouped.contiguous_case(g, rows, n, k, variant != "unaligned", seed)
                 if layout == "contiguous" else grouped.masked_case(g, rows, n, k, seed))
  if not cases:
    raise cli.UsageError("--cases is empty")
  return list({c.label: c for c in cases}.values())


def _main() -> int:
  env = envs.detect()
  cases = parse_cases(FLAGS.cases, env.on_gpu, FLAGS.seed)
  names = cli.parse_backends(FLAGS.backends, grouped.REGISTRY, grouped.default_backends(env))
  mgpu_config = cli.parse_dims(FLAGS.mgpu_config, 5, "mgpu_config",
                               "BMxBNxBKxSTEPSxGRID_BLOCK_N (five positive integers)")
  if not env.on_gpu:
    print("no GPU found: CPU numbers, reference backends (a smoke test of the set-up)",
          flush=True)
  cli.warn_if_no_plot()
  opts = cli.common_options(cases, names, options_class=grouped.Options,
                            mgpu_config=mgpu_config)
  return cli.run_workload(grouped.workload(opts), opts, env)


def main(argv):
  return cli.run_main(_main, argv)


if __name__ == "__main__":
  define_flags()
  app.run(main)
