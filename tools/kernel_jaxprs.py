"""Writes the jaxpr of the Hopper kernel at a set of configs (dense defaults, staged
a-scales, ragged, masked, the FP8 GLU), so that a refactor meant to change no kernel
can be checked to trace the same kernels; no GPU needed.

    python3 tools/kernel_jaxprs.py --out=/tmp/before          # on the old code
    python3 tools/kernel_jaxprs.py --out=/tmp/after --compare=/tmp/before

A jaxpr carries no source locations (the lowered module does: its bytes change with
any moved line), and the same jaxpr lowers to the same kernel. Exit status 1 if a
case differs from --compare (or is missing there).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys


def cases():
  """name -> (function, argument shapes) of each kernel traced."""
  import jax
  import jax.numpy as jnp
  from jax_fp8.pallas import hopper, hopper_tiling
  f8, f32, i32, bf16 = jnp.float8_e4m3fn, jnp.float32, jnp.int32, jnp.bfloat16
  s = jax.ShapeDtypeStruct
  out = {}

  def dense(m, n, k, cfg):
    fn = lambda a, sa, b, sb: hopper.blockwise_fp8_dot(a, sa, b, sb, None, beta=1.0,  # noqa: E731
                                                       out_dtype=bf16, config=cfg)
    return fn, [s((m, k), f8), s((m, k // 128), f32), s((n, k), f8),
                s((-(-n // 128), k // 128), f32)]

  for m, n, k in [(4096, 2112, 7168), (4096, 7168, 2048), (128, 4096, 7168), (64, 2112, 7168),
                  (4096, 32768, 512)]:
    out[f"dense_{m}x{n}x{k}"] = dense(m, n, k, hopper_tiling.default_config(m, n, k))
  staged = dataclasses.replace(hopper_tiling.default_config(4096, 7168, 2048), a_scale_window=4,
                               tma_scales=False, step_top_overlap=False,
                               probe_in_flight=False, producer_warp=False)
  out["dense_4096x7168x2048_staged"] = dense(4096, 7168, 2048, staged)
  g, rows, n, k = 8, 4096, 4096, 7168
  rcfg = hopper_tiling.default_config(g * rows, n, k, groups=g, grouped=True, row_masks=True)
  out["ragged_8x4096x4096x7168"] = (
      lambda a, sa, b, sb, gs: hopper.ragged_dot(a, sa, b, sb, gs, out_dtype=bf16, config=rcfg),
      [s((g * rows, k), f8), s((g * rows, k // 128), f32), s((g, n, k), f8),
       s((g, n // 128, k // 128), f32), s((g,), i32)])
  mcfg = hopper_tiling.default_config(256, 7168, 2048, groups=4, grouped=True)
  out["masked_4x256x7168x2048"] = (
      lambda a, sa, b, sb, mm: hopper.masked_dot(a, sa, b, sb, mm, out_dtype=bf16, config=mcfg),
      [s((4, 256, 2048), f8), s((4, 256, 16), f32), s((4, 7168, 2048), f8), s((4, 56, 16), f32),
       s((4,), i32)])
  # The weight gradient: per-row b scales (the 1D1D recipe), float32 out.
  m, n, k = 7168, 18432, 16384
  wcfg = hopper_tiling.default_config(m, n, k, out_dtype=f32, b_scale_rows=1)
  out[f"wgrad_{m}x{n}x{k}"] = (
      lambda a, sa, b, sb: hopper.blockwise_fp8_dot(a, sa, b, sb, None, beta=1.0, out_dtype=f32,
                                                    b_scale_rows=1, config=wcfg),
      [s((m, k), f8), s((m, k // 128), f32), s((n, k), f8), s((n, k // 128), f32)])
  gcfg = hopper_tiling.glu_config(4096, 2048, 7168, out_dtype=f8)
  out["glu_fp8_4096x2048x7168"] = (
      lambda a, sa, b, sb: hopper.glu(a, sa, b, sb, activation="silu", out_dtype=f8,
                                      config=gcfg),
      [s((4096, 7168), f8), s((4096, 56), f32), s((4096, 7168), f8), s((32, 56), f32)])
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="folder for <case>.jaxpr files")
  p.add_argument("--compare", help="a folder written before, to compare with")
  p.add_argument("--cases", default="", help="comma list of case names (default: all)")
  args = p.parse_args(argv)
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  import jax
  os.makedirs(args.out, exist_ok=True)
  chosen = set(filter(None, args.cases.split(",")))
  differ = []
  for name, (fn, avals) in cases().items():
    if chosen and name not in chosen:
      continue
    text = str(jax.make_jaxpr(fn)(*avals))
    with open(os.path.join(args.out, f"{name}.jaxpr"), "w") as f:
      f.write(text)
    verdict = ""
    if args.compare:
      try:
        with open(os.path.join(args.compare, f"{name}.jaxpr")) as f:
          same = f.read() == text
      except OSError:
        same = False
      verdict = "  same" if same else "  DIFFERS"
      if not same:
        differ.append(name)
    print(f"{name:32s} {hashlib.sha1(text.encode()).hexdigest()[:12]}{verdict}", flush=True)
  if differ:
    print(f"kernel_jaxprs: {len(differ)} case(s) differ: {', '.join(differ)}")
  return 1 if differ else 0


if __name__ == "__main__":
  sys.exit(main())
