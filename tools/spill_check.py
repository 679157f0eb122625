"""Compiles the Hopper kernel at its default tilings and reports ptxas's register
spills per kernel, any WGMMAs it serialises, and WGMMA chunks whose block
accumulator is zeroed by moves (compile only: nothing runs). On the GPU machine:
PTX and ptxas run when XLA compiles, for the attached GPU.

    python3 tools/spill_check.py                    # the default cases
    python3 tools/spill_check.py --cases=dense:1024x4096x7168,masked:4x384x7168x2048
    python3 tools/spill_check.py --cases=masked:1x1024x4096x7168 \
        --variant=tile_n=256,wide_chunks=False,a_scale_window=0,producer_registers=72

A case is KIND:DIMS:
  dense:MxNxK    bf16 output          fp8out:MxNxK   FP8 output (1x128 scales)
  wgrad:MxNxK    per-row b scales (the weight gradient's recipe), float32 output
  glu:MxFxK      a fused GLU, b of 2F rows, bf16 output;  glu8:MxFxK  ... FP8 output
  masked:GxCAPACITYxNxK               ragged:GxROWSxNxK  (G groups of ROWS rows)
Each case is compiled with Mosaic's dumps on (MOSAIC_GPU_DUMP_TO, read when it
compiles) and its ptxas report read back. Why it matters: with spills in their
consumers' K loop, 128 x 256 tiles on grids of one tile per CTA took 21-64%
longer (benchmarks/RESULTS.md, 2026-11-26). Also fails a case whose report says
ptxas serialised its WGMMAs (C7514-style "wgmma.mma_async instructions are
serialized": every WGMMA then waits for the one before; a WGMMA group in flight
across the K loop's back edge did it, pallas/README.md). Where ptxas and cuobjdump
are on PATH (the GPU machine's /usr/local/cuda/bin), it also reads the kernel's SASS
and counts the WGMMA chunks (groups of WGMMAs ending in one wait) whose first WGMMA
lacks the no-accumulate flag (`QGMMA ... RZ, !UPT`): Mosaic issues every WGMMA
accumulating onto registers set to zero, and ptxas folds the zeros into the flag
only where it can see them; where it cannot, the chunk's accumulator is zeroed by 64
moves between the chunk before and its WGMMA (a 128 x 256 kernel in which it did,
with another epilogue, ran 13% slower; benchmarks/RESULTS.md, 2026-11-26 23:06).
Prints a line per case (tiling as tools/tiling_picks.py writes it, spilled bytes,
zeroed chunks); exit status 1 if a case spills more than --max_bytes, has its WGMMAs
serialised, gave no ptxas report, or (--fail_zeroed) has a zeroed chunk or no SASS
to read. --variant replaces HopperConfig fields of every case's default
(tools/compare_configs.py's syntax).
"""
from __future__ import annotations

import argparse
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

KINDS = {"dense": 3, "fp8out": 3, "wgrad": 3, "glu": 3, "glu8": 3, "masked": 4, "ragged": 4}

# The dense benchmark's N x K at M = 512, 1024 (grids of one 128 x 256 tile per
# CTA among them) and 4096; the training and MLP GEMMs; the grouped benchmark's.
_NK = ("2112x7168", "24576x1536", "32768x512", "7168x16384", "4096x7168", "7168x2048")
DEFAULT_CASES = (
    [f"dense:{m}x{nk}" for m in (512, 1024, 4096) for nk in _NK]
    + ["dense:4096x18432x7168", "dense:4096x7168x18432", "fp8out:4096x18432x7168",
       "wgrad:7168x18432x4096", "wgrad:18432x7168x16384", "glu8:4096x18432x7168",
       "masked:1x1024x4096x7168", "masked:4x384x7168x2048", "masked:32x128x4096x7168",
       "ragged:8x4096x4096x7168", "ragged:8x4096x7168x2048"])


def parse_case(text: str) -> tuple[str, tuple[int, ...]]:
  """'masked:4x384x7168x2048' -> ('masked', (4, 384, 7168, 2048))."""
  kind, sep, dims = text.strip().partition(":")
  if not sep or kind not in KINDS:
    raise ValueError(f"a case is KIND:DIMS with KIND one of {sorted(KINDS)}, got {text!r}")
  parts = dims.lower().split("x")
  if len(parts) != KINDS[kind] or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"{kind} takes {KINDS[kind]} positive integers joined by 'x', got {text!r}")
  return kind, tuple(int(p) for p in parts)


def spilled_bytes(ptxas_report: str) -> int | None:
  """The largest 'N bytes spill stores' of a ptxas -v report; None if it has none."""
  found = [int(b) for b in re.findall(r"(\d+) bytes spill stores", ptxas_report)]
  return max(found) if found else None


def wgmma_serialized(ptxas_report: str) -> str | None:
  """ptxas's note that it serialised the kernel's WGMMAs (its reason), or None."""
  found = re.search(r"wgmma\.mma_async instructions are serialized[^\n]*", ptxas_report)
  return found.group(0) if found else None


def zeroed_chunks(sass: str) -> tuple[int, int]:
  """(WGMMA chunks, chunks whose first WGMMA accumulates instead of carrying the
  no-accumulate flag) of a kernel's SASS (cuobjdump -sass). A chunk is a run of
  WGMMA instructions (QGMMA/HGMMA) up to the one that arms its wait (`gsb0`)."""
  chunks = zeroed = 0
  first = True
  for line in sass.splitlines():
    if not re.search(r"\b[QH]GMMA\.", line):
      continue
    if first:
      chunks += 1
      zeroed += "!UPT" not in line
    first = "gsb0" in line
  return chunks, zeroed


def sass_of(ptx_path: str) -> str | None:
  """The SASS of a dumped PTX file (ptxas for sm_90a, then cuobjdump), or None
  where either tool is missing."""
  path = os.environ.get("PATH", "") + os.pathsep + "/usr/local/cuda/bin"
  ptxas, cuobjdump = (shutil.which(t, path=path) for t in ("ptxas", "cuobjdump"))
  if ptxas is None or cuobjdump is None:
    return None
  cubin = ptx_path + ".cubin"
  subprocess.run([ptxas, "-arch=sm_90a", ptx_path, "-o", cubin], check=True,
                 capture_output=True)
  return subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True,
                        text=True).stdout


def kernel_call(kind: str, dims: tuple[int, ...], variant: dict | None = None):
  """(the case's default Hopper config (fields of `variant` replaced), a function
  running it, its argument avals)."""
  import dataclasses

  import jax
  import jax.numpy as jnp
  from jax_fp8.pallas import hopper, hopper_tiling
  f8, f32, bf16 = jnp.float8_e4m3fn, jnp.float32, jnp.bfloat16
  s = jax.ShapeDtypeStruct
  cdiv = lambda x: -(-x // 128)  # noqa: E731
  if kind in ("masked", "ragged"):
    g, rows, n, k = dims
    m = rows if kind == "masked" else g * rows
    cfg = dataclasses.replace(hopper_tiling.default_config(
        m, n, k, groups=g if kind == "masked" else 1, grouped=True,
        row_masks=kind == "ragged"), **(variant or {}))
    lead = (g,) if kind == "masked" else ()
    fn = functools.partial(getattr(hopper, f"{kind}_dot"), out_dtype=bf16, config=cfg)
    return cfg, fn, (s((*lead, m, k), f8), s((*lead, m, cdiv(k)), f32), s((g, n, k), f8),
                     s((g, cdiv(n), cdiv(k)), f32), s((g,), jnp.int32))
  m, n, k = dims
  if kind in ("glu", "glu8"):
    out = f8 if kind == "glu8" else bf16
    cfg = dataclasses.replace(hopper_tiling.glu_config(m, n, k, out_dtype=out), **(variant or {}))
    fn = functools.partial(hopper.glu, activation="silu", out_dtype=out, config=cfg)
    return cfg, fn, (s((m, k), f8), s((m, cdiv(k)), f32), s((2 * n, k), f8),
                     s((2 * n // 128, cdiv(k)), f32))
  out = {"dense": bf16, "fp8out": f8, "wgrad": f32}[kind]
  rows = 1 if kind == "wgrad" else 128
  cfg = dataclasses.replace(hopper_tiling.config_for(m, n, k, out_dtype=out, b_scale_rows=rows),
                            **(variant or {}))
  fn = lambda a, sa, b, sb: hopper.blockwise_fp8_dot(  # noqa: E731
      a, sa, b, sb, None, beta=0.0, out_dtype=out, b_scale_rows=rows, config=cfg)
  return cfg, fn, (s((m, k), f8), s((m, cdiv(k)), f32), s((n, k), f8),
                   s((n if rows == 1 else cdiv(n), cdiv(k)), f32))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma list of KIND:DIMS")
  p.add_argument("--max_bytes", type=int, default=0, help="spill bytes a case may have")
  p.add_argument("--variant", default="", help="HopperConfig fields replaced in every case's "
                 "default, e.g. tile_n=256,producer_registers=72")
  p.add_argument("--fail_zeroed", action="store_true",
                 help="also fail a case with a WGMMA chunk zeroed by moves")
  args = p.parse_args(argv)
  cases = [parse_case(c) for c in args.cases.split(",") if c.strip()]
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  sys.path.insert(0, os.path.dirname(__file__))
  import jax
  from compare_configs import parse_variant
  from tiling_picks import spec
  variant = parse_variant(args.variant) if args.variant.strip() else None
  failed = []
  for kind, dims in cases:
    name = f"{kind}:{'x'.join(map(str, dims))}"
    with tempfile.TemporaryDirectory(prefix="spill_check_") as dump:
      os.environ["MOSAIC_GPU_DUMP_TO"] = dump
      os.environ["MOSAIC_GPU_DUMP_PTXAS"] = "1"
      os.environ["MOSAIC_GPU_DUMP_PTX"] = "1"
      cfg, fn, avals = kernel_call(kind, dims, variant)
      jax.jit(fn).trace(*avals).lower().compile()
      report = "".join(open(f).read() for f in glob.glob(os.path.join(dump, "*.ptxas")))
      ptx = glob.glob(os.path.join(dump, "*.ptx"))
      sass = sass_of(ptx[0]) if len(ptx) == 1 else None
    spilled = spilled_bytes(report)
    serialized = wgmma_serialized(report)
    verdict = "no ptxas report" if spilled is None else f"{spilled} bytes spilled"
    zeroed = 0
    if sass is not None:
      chunks, zeroed = zeroed_chunks(sass)
      verdict += f"; {zeroed} of {chunks} WGMMA chunks zeroed by moves"
    elif args.fail_zeroed:  # asked for, and no SASS to read: unreported, not passed
      verdict += "; no SASS (ptxas and cuobjdump needed)"
    if serialized:
      verdict += f"; {serialized}"
    bad = (spilled is None or spilled > args.max_bytes or serialized is not None
           or (args.fail_zeroed and (sass is None or zeroed > 0)))
    print(f"{name:32s} {spec(cfg):34s} {verdict}{'  <--' if bad else ''}", flush=True)
    if bad:
      failed.append(name)
  if failed:
    print(f"spill_check: {len(failed)} case(s) over {args.max_bytes} bytes, serialised, "
          f"unreported{' or zeroing' if args.fail_zeroed else ''}: {', '.join(failed)}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
