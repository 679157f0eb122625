"""Calls one GEMM of jax_fp8 a few times (for profilers: tools/ncu_sass.sh profiles
the last call).

    python3 tools/one_call.py 4096x2112x7168 [--backend=pallas_sm90] [--calls=4]
                              [--out_dtype=bfloat16] [--variant="a_scale_window=4,stages=4"]
    python3 tools/one_call.py ragged:8x4096x4096x7168 [--variant=...]
    python3 tools/one_call.py 1536x1760x57344 --backend=deepgemm   # DeepGEMM's 1D2D GEMM

A plain MxNxK runs jax_fp8.blockwise_fp8_dot through --backend. A case of
tools/spill_check.py's syntax (KIND:DIMS: dense, fp8out, wgrad, glu, glu8, masked,
ragged) runs the Hopper kernel directly at that case's default config, on random
operands: ragged groups of ROWS rows each, masked groups filled to their capacity.
--variant: HopperConfig fields replaced in the default config (the form of
tools/compare_configs.py), which then runs through the Hopper kernel directly.
--backend=deepgemm (a plain MxNxK, bf16 output) calls DeepGEMM's `fp8_gemm_nt` instead,
where `import deep_gemm` works (a peer built on the GPU machine, tools/build_deepgemm.sh),
on the same operands: its kernel's profile beside ours (tools/ncu_sass.sh, NCU_KERNEL).
"""
from __future__ import annotations

import argparse
import os
import sys


def case_operands(avals, group_rows: int, seed: int = 0):
  """Random operands for spill_check.kernel_call's argument avals: FP8 values of
  a few binades, power-of-two scales, and a grouped case's group vector, every
  entry group_rows (a case's second number: ragged, ROWS rows per group; masked,
  every group filled to its capacity)."""
  import jax.numpy as jnp
  import numpy as np
  rng = np.random.default_rng(seed)
  ops = []
  for aval in avals:
    if aval.dtype == jnp.int32:  # group_sizes / masked_m: [G]
      ops.append(jnp.full(aval.shape, group_rows, jnp.int32))
    elif aval.dtype == jnp.float32:
      ops.append(jnp.asarray(np.exp2(rng.integers(-12, -4, size=aval.shape)), jnp.float32))
    else:
      values = np.clip(rng.standard_normal(aval.shape) * 64, -448, 448)  # e4m3's range
      ops.append(jnp.asarray(values, jnp.float32).astype(aval.dtype))
  return ops


def deepgemm_calls(ops, calls: int):
  """DeepGEMM 2.6.1's dense 1D2D GEMM on jax_fp8's operands, `calls` times: d [M, N]
  bf16 = a b^T with a's 1x128 and b's 128x128 scales, handed over as the dense
  benchmark's DeepGEMM contender hands them (benchmarks/workloads/deepgemm.py: the
  a-scales in the layout its kernel reads, made once before the calls)."""
  try:
    import deep_gemm
  except Exception as e:  # noqa: BLE001 (not built here)
    raise SystemExit(f"one_call: --backend=deepgemm needs `import deep_gemm` "
                     f"({type(e).__name__}: {e}); tools/build_deepgemm.sh builds it") from e
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
  from harness import torch_glue
  from workloads import deepgemm
  torch = torch_glue.cuda_torch()
  a, sa, b, sb = (torch_glue.to_torch(x) for x in ops)  # new contiguous tensors
  sa = deepgemm.mn_major_scales(deep_gemm, sa)
  d = torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
  for _ in range(calls):
    deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d)
  torch.cuda.synchronize()
  return d


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("shape", help="MxNxK, or KIND:DIMS (tools/spill_check.py's cases)")
  p.add_argument("--backend", default="pallas_sm90")
  p.add_argument("--calls", type=int, default=4)
  p.add_argument("--out_dtype", default="bfloat16", choices=("bfloat16", "float32"),
                 help="of an MxNxK shape (a case's kind sets its own)")
  p.add_argument("--variant", default="", help="HopperConfig fields, e.g. stages=4,cluster_m=2")
  args = p.parse_args()
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  sys.path.insert(0, os.path.dirname(__file__))
  import jax
  import jax.numpy as jnp
  import jax_fp8
  from compare_configs import parse_variant
  from jax_fp8.pallas import autotune

  variant = parse_variant(args.variant) if args.variant else None
  if ":" in args.shape:
    import spill_check
    kind, dims = spill_check.parse_case(args.shape)
    _, fn, avals = spill_check.kernel_call(kind, dims, variant)
    f, ops = jax.jit(fn), case_operands(avals, dims[1])
  else:
    m, n, k = (int(x) for x in args.shape.lower().split("x"))
    ops = autotune.random_operands(0, m, n, k)[:4]
    out_dtype = jnp.dtype(args.out_dtype)
    if args.backend == "deepgemm":
      if variant or out_dtype != jnp.bfloat16:
        raise SystemExit("one_call: --backend=deepgemm takes no --variant and writes bfloat16")
      d = deepgemm_calls(ops, args.calls)
      print(f"one_call: {args.shape} deepgemm x{args.calls}: out {tuple(d.shape)} {d.dtype}, "
            f"finite: {bool(d.float().isfinite().all())}")
      return 0
    if variant:
      import dataclasses
      from jax_fp8.pallas import hopper, hopper_tiling
      cfg = dataclasses.replace(hopper_tiling.default_config(m, n, k, out_dtype=out_dtype),
                                **variant)
      f = jax.jit(lambda *x: hopper.blockwise_fp8_dot(*x, None, beta=1.0, out_dtype=out_dtype,
                                                      config=cfg))
    else:
      f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, out_dtype=out_dtype,
                                                       backend=args.backend))
  for _ in range(args.calls):
    out = f(*ops)
  out = jax.block_until_ready(out)
  first = jax.tree.leaves(out)[0]
  how = args.variant or ("the default config" if ":" in args.shape else args.backend)
  print(f"one_call: {args.shape} {how} x{args.calls}: "
        f"out {first.shape} {first.dtype}, "
        f"finite: {bool(jnp.isfinite(first.astype(jnp.float32)).all())}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
