"""Compile-only check of the fused quantisers (pallas/quantize.py) for sm_100a.

There is no Blackwell GPU here. On a machine with any CUDA GPU (the H100), this
lowers and compiles every quantiser kernel for compute capability 10.0 on a
compile-only topology (Mosaic GPU -> PTX -> ptxas for sm_100a) and checks the
PTX: it must target sm_100a, move tiles with TMA, divide with div.rn.f32 and
convert with cvt.rn.satfinite.e4m3x2.f32. It proves that the kernels build
for Blackwell, not that they are right there (GPU interpret mode is that
proof; the kernels use nothing Hopper-only).

    python3 tools/xcompile_quantize_sm100.py [--shape=4096x7168] [--dtype=bfloat16]

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
  p.add_argument("--shape", default="4096x7168", help="TxK of x (NxK of a weight)")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
  p.add_argument("--power_of_two_scales", action="store_true")
  p.add_argument("--dump_dir", default=None, help="keep Mosaic's PTX dumps here")
  return p.parse_args()


def main() -> int:
  args = _parse()
  dump = pathlib.Path(args.dump_dir or tempfile.mkdtemp(prefix="xcompile_quantize_sm100_"))
  dump.mkdir(parents=True, exist_ok=True)
  os.environ["MOSAIC_GPU_DUMP_TO"] = str(dump)  # read when Mosaic compiles
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax._src.lib import _jax
  from jax.experimental import topologies
  import jax.experimental.mosaic.gpu.utils as mgpu_utils
  from jax_fp8.pallas import quantize as qk

  t, k = (int(x) for x in args.shape.lower().split("x"))
  report = {"shape": [t, k], "dtype": args.dtype, "power_of_two_scales": args.power_of_two_scales}
  if jax.default_backend() != "gpu":
    raise SystemExit(f"needs a machine with a CUDA GPU (it compiles for sm_100a there); "
                     f"this one has {jax.default_backend()!r}")
  # A compile-only device of compute capability 10.0: the host GPU's target
  # config with its major version changed.
  target = _jax.get_topology_for_devices(jax.devices()).target_config
  text = target.decode() if isinstance(target, bytes) else target
  text10, count = re.subn(r"(cuda_compute_capability\s*\{\s*major:\s*)\d+", r"\g<1>10", text,
                          count=1)
  if not count:
    raise SystemExit("the GPU's target config has no cuda_compute_capability to change")
  topo = topologies.get_topology_desc(
      platform="cuda", target_config=text10 if isinstance(target, str) else text10.encode(),
      topology="1x1x1")
  mesh = jax.sharding.Mesh(np.array(topo.devices[:1]), ("x",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  mgpu_utils._infer_arch = lambda: (10, 0)  # Mosaic would ask the host GPU (9.0)
  x = jax.ShapeDtypeStruct((t, k), jnp.dtype(args.dtype), sharding=replicated)

  pow2 = args.power_of_two_scales
  kernels = {
      "quantize_1x128": lambda x: qk.quantize_1x128(x, power_of_two_scales=pow2),
      "quantize_1x128_with_transpose":
          lambda x: qk.quantize_1x128_with_transpose(x, power_of_two_scales=pow2),
      "quantize_128x128": lambda x: qk.quantize_128x128(x, power_of_two_scales=pow2,
                                                        with_transpose=True),
  }
  ok = True
  for name, fn in kernels.items():
    before = set(dump.glob("*.ptx"))
    t0 = time.time()
    jax.jit(fn).trace(x).lower().compile()
    new = sorted(set(dump.glob("*.ptx")) - before)
    ptx = "\n".join(p.read_text(errors="replace") for p in new)
    checks = {
        "compile_s": round(time.time() - t0, 1),
        "ptx_files": len(new),
        "target_sm_100a": bool(re.search(r"^\.target\s+sm_100a", ptx, re.M)),
        "tma_load": ptx.count("cp.async.bulk.tensor") > 0,
        "div_rn_f32": ptx.count("div.rn.f32"),
        "div_full_f32": ptx.count("div.full.f32"),
        "cvt_e4m3x2": ptx.count("cvt.rn.satfinite.e4m3x2.f32"),
    }
    checks["ok"] = (checks["target_sm_100a"] and checks["tma_load"] and checks["div_rn_f32"] > 0
                    and checks["div_full_f32"] == 0 and checks["cvt_e4m3x2"] > 0)
    ok = ok and checks["ok"]
    report[name] = checks
  report["ok"] = ok
  print(json.dumps(report))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
