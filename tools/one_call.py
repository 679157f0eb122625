"""Calls one backend of jax_fp8.blockwise_fp8_dot a few times at one shape (for profilers:
tools/ncu_sass.sh profiles the last call).

    python3 tools/one_call.py 4096x2112x7168 [--backend=pallas_sm90] [--calls=4]
                              [--out_dtype=bfloat16] [--variant="a_scale_window=4,stages=4"]

--variant: HopperConfig fields replaced in the shape's default config (the form of
tools/compare_configs.py), which then runs through the Hopper kernel directly.
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("shape", help="MxNxK")
  p.add_argument("--backend", default="pallas_sm90")
  p.add_argument("--calls", type=int, default=4)
  p.add_argument("--out_dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--variant", default="", help="HopperConfig fields, e.g. stages=4,cluster_m=2")
  args = p.parse_args()
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  sys.path.insert(0, os.path.dirname(__file__))
  import jax
  import jax.numpy as jnp
  import jax_fp8
  from jax_fp8.pallas import autotune

  m, n, k = (int(x) for x in args.shape.lower().split("x"))
  a, a_scale, b, b_scale, _ = autotune.random_operands(0, m, n, k)
  out_dtype = jnp.dtype(args.out_dtype)
  if args.variant:
    import dataclasses
    from compare_configs import parse_variant
    from jax_fp8.pallas import hopper, hopper_tiling
    cfg = dataclasses.replace(hopper_tiling.default_config(m, n, k, out_dtype=out_dtype),
                              **parse_variant(args.variant))
    f = jax.jit(lambda *x: hopper.blockwise_fp8_dot(*x, None, beta=1.0, out_dtype=out_dtype,
                                                    config=cfg))
  else:
    f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, out_dtype=out_dtype,
                                                     backend=args.backend))
  for _ in range(args.calls):
    out = f(a, a_scale, b, b_scale)
  out.block_until_ready()
  print(f"one_call: {args.shape} {args.variant or args.backend} x{args.calls}: "
        f"out {out.shape} {out.dtype}, "
        f"finite: {bool(jnp.isfinite(out.astype(jnp.float32)).all())}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
