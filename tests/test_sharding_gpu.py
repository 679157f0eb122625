"""Sharded blockwise_fp8_dot with the real GPU kernels on two or more GPUs.

Skipped unless at least two CUDA devices are attached (CI has none). Each case
is compared with the float64 reference, and the compiled HLO is checked for the
collectives a matmul needs: none for M or N sharding, one reduction for K.
"""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_fp8
from jax_fp8 import testing
from test_sharding import collectives


def _gpus():
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


pytestmark = pytest.mark.skipif(len(_gpus()) < 2, reason="needs >= 2 GPUs")

CASES = [  # name, (m, n, k), specs of (a, a_scale, b, b_scale, c/out), expected collectives
    ("M", (4096, 2112, 7168), (P("x"), P("x"), P(), P(), P("x")), {}),
    # decode: each GPU's 64 rows take the Pallas kernel's split-K path
    ("M-decode", (128, 2112, 7168), (P("x"), P("x"), P(), P(), P("x")), {}),
    ("N", (256, 4096, 7168), (P(), P(), P("x"), P("x"), P(None, "x")), {}),
    ("K", (512, 2048, 4096), (P(None, "x"), P(None, "x"), P(None, "x"), P(None, "x"), P()),
     {"all-reduce": 1}),
]


@pytest.mark.parametrize("name,shape,specs,expect", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("backend", ["auto", "ffi"])
def test_sharded_dot_on_gpus(name, shape, specs, expect, backend):
  mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=_gpus()[:2])
  m, n, k = shape
  ops = testing.random_operands(sum(map(ord, name)), m, n, k, with_c=True)
  shardings = [NamedSharding(mesh, s) for s in specs]
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, beta=0.5, out_dtype=jnp.bfloat16,
                                                   backend=backend),
              in_shardings=tuple(shardings), out_shardings=shardings[-1])
  args = [jax.device_put(x, s) for x, s in zip(ops.args(), shardings)]
  compiled = f.lower(*args).compile()
  out = compiled(*args)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), jnp.bfloat16)
  counts = collectives(compiled.as_text())
  assert {op: c for op, c in counts.items() if c} == expect, counts
