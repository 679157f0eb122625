"""Times the Hopper kernel's default config of a shape against variants of it, in one
process, alternated round by round (tiling_picks.time_pair: kernel time through CUPTI,
operands rotated past the L2, every output checked against the contract). On the GPU machine.

    python3 tools/compare_configs.py --shapes=4096x2112x7168,4096x7168x2048 \\
        --variants="cluster_m=2; stages=4; tile_n=256,wg_split=n,wide_chunks=False"

--per_row_b times the weight gradient's recipe instead (one b scale per row of b,
float32 output unless --out_dtype says), as `tools/compare_configs.py --per_row_b
--shapes=7168x18432x4096 --variants="stages=5"`. --out_dtype=float32 and
--c_dtype=bfloat16|float32 time those outputs and residuals of the dense recipe;
--out_dtype=float8_e4m3fn the FP8 output quantised in the epilogue, from the FP8-output
default (pallas/hopper_tiling.fp8_output_config), checked dequantised.

A variant is a comma list of HopperConfig fields replaced in the shape's default
(pallas/hopper_tiling.default_config); variants are separated by ';'. A variant the config
check refuses, or whose SMEM does not fit, is reported and skipped. Prints TFLOP/s (median
over --rounds of the median of --iters calls) and each variant's ratio to the default
(> 1: faster).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys


def parse_variant(text: str) -> dict:
  """'cluster_m=2,wg_split=n,wide_chunks=False' -> {'cluster_m': 2, 'wg_split': 'n', ...}."""
  fields = {}
  for item in filter(None, (s.strip() for s in text.split(","))):
    name, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"variant item {item!r} is not field=value")
    value = value.strip()
    if value in ("True", "False"):
      fields[name.strip()] = value == "True"
    elif value.lstrip("-").isdigit():
      fields[name.strip()] = int(value)
    elif value == "None":
      fields[name.strip()] = None
    else:
      fields[name.strip()] = value
  return fields


def variant_configs(base, variants: list[dict], label: str, out_dtype=None,
                    c_dtype=None) -> dict:
  """{"default": base, "field=value,...": variant, ...}: the variants the config
  check accepts and whose SMEM fits (for out_dtype, bf16 if None, and c_dtype); the
  others are reported."""
  import jax.numpy as jnp
  from jax_fp8.pallas.common import SMEM_BYTES
  configs = {"default": base}
  for fields in variants:
    name = ",".join(f"{key}={value}" for key, value in fields.items())
    try:
      cfg = dataclasses.replace(base, **fields)
      cfg.check()
      smem = cfg.smem_bytes(out_dtype or jnp.bfloat16, c_dtype)
      if smem > SMEM_BYTES:
        raise ValueError(f"needs {smem} B of SMEM > {SMEM_BYTES}")
    except (TypeError, ValueError) as e:
      print(f"{label} {name}: refused: {e}")
      continue
    configs[name] = cfg
  return configs


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shapes", required=True, help="comma list of MxNxK")
  p.add_argument("--variants", required=True, help="';'-separated variants (see above)")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--per_row_b", action="store_true",
                 help="per-row b scales (the weight gradient's recipe), float32 output "
                      "unless --out_dtype says")
  p.add_argument("--out_dtype", default=None,
                 choices=("bfloat16", "float32", "float8_e4m3fn"),
                 help="the output dtype (bfloat16; float32 with --per_row_b)")
  p.add_argument("--c_dtype", default=None, choices=("bfloat16", "float32"),
                 help="a residual c of this dtype (beta = 1)")
  args = p.parse_args(argv)
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  sys.path.insert(0, os.path.dirname(__file__))
  import jax.numpy as jnp
  from jax_fp8.pallas import hopper_tiling
  from jax_fp8.pallas.common import FP8_OUT
  from tiling_picks import time_pair

  variants = [parse_variant(v) for v in args.variants.split(";") if v.strip()]
  for shape in args.shapes.split(","):
    m, n, k = (int(x) for x in shape.lower().split("x"))
    out_dtype = args.out_dtype or ("float32" if args.per_row_b else "bfloat16")
    kw = {"out_dtype": jnp.dtype(out_dtype), **({"b_scale_rows": 1} if args.per_row_b else {})}
    if args.c_dtype:
      kw["c_dtype"] = jnp.dtype(args.c_dtype)
    if kw["out_dtype"] == FP8_OUT:
      base = hopper_tiling.fp8_output_config(m, n, k, **{k_: v for k_, v in kw.items()
                                                         if k_ != "out_dtype"})
    else:
      base = hopper_tiling.default_config(m, n, k, **kw)
    configs = variant_configs(base, variants, shape, kw["out_dtype"], kw.get("c_dtype"))
    times = time_pair(m, n, k, kw, list(configs.values()), rounds=args.rounds,
                      iters=args.iters)
    flop = 2 * m * n * k
    base_ms = statistics.median(times[0])
    print(f"{shape}: default {base}")
    for name, ts in zip(configs, times):
      ms = statistics.median(ts)
      print(f"  {name:40s} {flop / ms / 1e9:8.1f} TFLOP/s  x{base_ms / ms:.3f}  "
            f"(rounds: {' '.join(f'{t:.4f}' for t in ts)} ms)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
