"""tools/one_call.py: the operands it builds for a tools/spill_check.py case (the
call itself needs the GPU: tools/ncu_sass.sh runs it there)."""
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

_TOOLS = os.path.join(os.path.dirname(__file__), "..", "tools")
sys.path.insert(0, _TOOLS)
import one_call  # noqa: E402
import spill_check  # noqa: E402


@pytest.mark.parametrize("case,groups", [
    ("ragged:3x200x256x384", [200, 200, 200]),   # G groups of ROWS rows: all of M
    ("masked:2x130x256x384", [130, 130]),        # every group filled to its capacity
    ("dense:70x256x300", None),
    ("wgrad:256x384x512", None),
])
def test_case_operands_match_the_kernels_avals(case, groups):
  kind, dims = spill_check.parse_case(case)
  _, _, avals = spill_check.kernel_call(kind, dims)
  ops = one_call.case_operands(avals, dims[1])
  assert [(o.shape, o.dtype) for o in ops] == [(a.shape, a.dtype) for a in avals]
  vec = [o for o in ops if o.dtype == jnp.int32]
  assert (np.asarray(vec[0]).tolist() if vec else None) == groups
  for o in ops:
    if o.dtype == jnp.float32:  # scales: powers of two, finite, positive
      s = np.asarray(o)
      assert np.all(s > 0) and np.all(np.log2(s) == np.round(np.log2(s)))
    elif o.dtype != jnp.int32:  # FP8 values, finite and not all zero
      v = np.asarray(o.astype(jnp.float32))
      assert np.all(np.isfinite(v)) and np.any(v != 0)


def test_deepgemm_backend_says_what_it_needs(monkeypatch):
  """--backend=deepgemm runs DeepGEMM's GEMM where `import deep_gemm` works (a peer
  built on the GPU machine); elsewhere it stops with the reason."""
  monkeypatch.setitem(sys.modules, "deep_gemm", None)  # an import of it fails
  with pytest.raises(SystemExit, match="needs `import deep_gemm`.*build_deepgemm"):
    one_call.deepgemm_calls((None, None, None, None), 1)
