"""Small and edge shapes through the FFI backend, for compute-sanitizer on a GPU.

    compute-sanitizer --tool memcheck --kernel-name kns=fp8_gemm python3 tools/ffi_sanitize.py
    compute-sanitizer --tool racecheck --kernel-name kns=fp8_gemm python3 tools/ffi_sanitize.py

Each output is checked against the float64 contract (bf16 4e-3, f32 2.5e-4: the WGMMA
kernel's FP8 accumulation), so a run also fails on a wrong result. On an sm_90a library
the TMA + WGMMA kernel takes the shapes with K % 16 == 0; JAX_FP8_FFI_DISABLE_WGMMA=1
sends every shape to the mma.sync kernel. Exits 1 on a failed check.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import jax_fp8  # noqa: E402
from jax_fp8 import testing  # noqa: E402

BF16, F32 = np.dtype(jnp.bfloat16), np.dtype(jnp.float32)
TOL = {BF16: 4e-3, F32: 2.5e-4}
# (m, n, k, with_c, out_dtype): a partial tile, K % 16 != 0 (mma.sync), ragged N, split-K
# (few tiles, long K), c with f32 out.
SHAPES = [(3, 8, 16, False, BF16), (129, 200, 1000, True, F32), (129, 200, 1024, True, BF16),
          (70, 136, 384, False, F32), (128, 256, 4096, False, BF16), (300, 520, 640, True, F32)]


def main() -> int:
  failed = 0
  for i, (m, n, k, with_c, out_dtype) in enumerate(SHAPES):
    ops = testing.random_operands(i, m, n, k, with_c=with_c)
    beta = 0.5 if with_c else 1.0
    out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
        *x, beta=beta, out_dtype=out_dtype, backend="ffi"))(*ops.args())
    err = testing.rel_error(out, testing.reference_f64(*ops.args(), beta=beta))
    ok = err <= TOL[out_dtype]
    failed += not ok
    print(f"{m}x{n}x{k} c={with_c} {out_dtype}: rel err {err:.2e} {'ok' if ok else 'FAIL'}",
          flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
