"""Compile-only check of the Blackwell kernel (pallas/blackwell.py) for sm_100a.

There is no Blackwell GPU here. On a machine with any CUDA GPU (the H100), this
lowers and compiles the kernel for compute capability 10.0 on a compile-only
topology (Mosaic GPU -> PTX -> ptxas for sm_100a) and checks the PTX: it must
target sm_100a and issue FP8 tcgen05 MMAs. It proves that the kernel builds for
Blackwell, not that it runs correctly there (GPU interpret mode is that proof).

    python3 tools/xcompile_sm100.py [--shape=4096x7168x2048] [--with_c] [--out_dtype=bfloat16]

Prints one JSON line; exit status 0 if every check passed. Uses two private
hooks (a target config with compute capability 10.0, Mosaic's _infer_arch), so
run it in its own process.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile
import time


def _parse():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", default="4096x7168x2048", help="MxNxK")
  p.add_argument("--with_c", action="store_true", help="with a float32 residual c")
  p.add_argument("--out_dtype", default="bfloat16",
                 choices=("bfloat16", "float32", "float8_e4m3fn"),
                 help="float8_e4m3fn: the FP8 output quantised in the epilogue")
  p.add_argument("--dump_dir", default=None, help="keep Mosaic's PTX dumps here")
  return p.parse_args()


def main() -> int:
  args = _parse()
  dump = pathlib.Path(args.dump_dir or tempfile.mkdtemp(prefix="xcompile_sm100_"))
  dump.mkdir(parents=True, exist_ok=True)
  os.environ["MOSAIC_GPU_DUMP_TO"] = str(dump)  # read when Mosaic compiles
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

  import jax
  import jax.numpy as jnp
  from jax_fp8.pallas import blackwell, sm100
  import sm100_target  # tools/: beside this file

  m, n, k = (int(x) for x in args.shape.lower().split("x"))
  report = {"shape": [m, n, k], "with_c": args.with_c, "out_dtype": args.out_dtype}

  replicated = sm100_target.replicated_sharding()
  blackwell.num_sms = lambda: 148            # a B200's SMs

  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  kb, nb = -(-k // 128), -(-n // 128)
  avals = [spec((m, k), jnp.float8_e4m3fn), spec((m, kb), jnp.float32),
           spec((n, k), jnp.float8_e4m3fn), spec((nb, kb), jnp.float32)]
  avals.append(spec((m, n), jnp.float32) if args.with_c else None)

  def fn(a, sa, b, sb, c):
    return sm100.blockwise_fp8_dot(a, sa, b, sb, c, beta=1.0,
                                   out_dtype=jnp.dtype(args.out_dtype))

  t0 = time.time()
  jax.jit(fn).trace(*avals).lower().compile()
  report["compile_s"] = round(time.time() - t0, 1)

  ptx = "\n".join(p.read_text(errors="replace") for p in sorted(dump.glob("*.ptx")))
  report["ptx_files"] = len(list(dump.glob("*.ptx")))
  report["target_sm_100a"] = bool(re.search(r"^\.target\s+sm_100a", ptx, re.M))
  report["tcgen05_mma_f8f6f4"] = len(re.findall(r"tcgen05\.mma\S*kind::f8f6f4", ptx))
  report["tcgen05_alloc"] = ptx.count("tcgen05.alloc")
  report["tcgen05_ld"] = ptx.count("tcgen05.ld")
  ok = report["target_sm_100a"] and report["tcgen05_mma_f8f6f4"] > 0 and report["tcgen05_alloc"] > 0
  report["ok"] = ok
  print(json.dumps(report))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
