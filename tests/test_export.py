"""jax.export with symbolic shapes (issue 19): a symbolic M and symbolic batch
dims export through the reference body and run at any size; kernels that need
static shapes say so; exporting backend="auto" for CUDA from a machine without
a GPU says which kernel it embeds."""
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_fp8
from jax_fp8 import testing
from jax_fp8.pallas import device

FP8, F32 = jnp.float8_e4m3fn, jnp.float32


def _avals(batch, m, n, k, with_c):
  kb, nb = -(-k // 128), -(-n // 128)
  avals = [jax.ShapeDtypeStruct((*batch, m, k), FP8), jax.ShapeDtypeStruct((*batch, m, kb), F32),
           jax.ShapeDtypeStruct((n, k), FP8), jax.ShapeDtypeStruct((nb, kb), F32)]
  if with_c:
    avals.append(jax.ShapeDtypeStruct((*batch, m, n), jnp.bfloat16))
  return avals


@pytest.mark.parametrize("spec,sizes", [("m", [((), 1), ((), 37)]),
                                        ("b, m", [((2,), 5), ((3,), 130)])])
def test_symbolic_m_and_batch_export_and_run_at_any_size(spec, sizes):
  *batch, m = export.symbolic_shape(spec)
  n, k = 200, 300
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, beta=-0.5, out_dtype=F32))
  exported = export.export(f, platforms=["cpu"])(*_avals(batch, m, n, k, with_c=True))
  assert "callback" not in exported.mlir_module().lower()
  restored = export.deserialize(exported.serialize())
  for i, (b, rows) in enumerate(sizes):
    ops = testing.random_operands(i, rows, n, k, batch=b, with_c=True, c_dtype=jnp.bfloat16)
    out = restored.call(*ops.args())
    assert out.shape == (*b, rows, n)
    testing.assert_close(out, testing.reference_f64(*ops.args(), beta=-0.5), F32)


def test_symbolic_batch_of_weights_exports():
  """vmap over the weights too: one dot per batch element, a symbolic count."""
  bsym, m = export.symbolic_shape("b, m")
  f = jax.jit(jax.vmap(lambda *x: jax_fp8.blockwise_fp8_dot(*x, out_dtype=F32)))
  avals = [jax.ShapeDtypeStruct((bsym, m, 256), FP8), jax.ShapeDtypeStruct((bsym, m, 2), F32),
           jax.ShapeDtypeStruct((bsym, 136, 256), FP8), jax.ShapeDtypeStruct((bsym, 2, 2), F32)]
  restored = export.deserialize(export.export(f, platforms=["cpu"])(*avals).serialize())
  ops = [testing.random_operands(10 + i, 7, 136, 256) for i in range(3)]
  stack = lambda name: jnp.stack([getattr(o, name) for o in ops])
  out = restored.call(stack("a"), stack("a_scale"), stack("b"), stack("b_scale"))
  for i, o in enumerate(ops):
    testing.assert_close(out[i], testing.reference_f64(*o.args()[:4]), F32)


def test_symbolic_n_or_k_is_refused_by_name():
  m, n = export.symbolic_shape("m, n")
  avals = [jax.ShapeDtypeStruct((m, 256), FP8), jax.ShapeDtypeStruct((m, 2), F32),
           jax.ShapeDtypeStruct((n, 256), FP8), jax.ShapeDtypeStruct((3, 2), F32)]
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x))
  with pytest.raises(ValueError, match="N and K must be static"):
    export.export(f, platforms=["cpu"])(*avals)


@pytest.mark.parametrize("backend", ["pallas_sm90", "ffi"])
def test_kernels_say_they_need_static_shapes(backend):
  m, = export.symbolic_shape("m")
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, backend=backend))
  with pytest.raises(jax_fp8.BackendUnavailableError, match="needs static shapes, but M = m"):
    export.export(f, platforms=["cuda"])(*_avals((), m, 300, 256, with_c=False))


def test_auto_with_symbolic_m_for_cuda_falls_back_to_the_reference_and_says_so():
  m, = export.symbolic_shape("m")
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exported = export.export(f, platforms=["cuda"])(*_avals((), m, 300, 256, with_c=False))
  assert "mosaic_gpu" not in exported.mlir_module()
  messages = [str(w.message) for w in caught]
  assert any(re.search(r"M = m is symbolic.*reference", msg) for msg in messages), messages


@pytest.mark.skipif(bool(device.gpus()), reason="the warning is for machines without a GPU")
def test_auto_exported_for_cuda_without_a_gpu_names_the_embedded_kernel():
  f = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exported = export.export(f, platforms=["cuda"])(*_avals((), 64, 300, 256, with_c=False))
  assert "mosaic_gpu" in exported.mlir_module()
  messages = [str(w.message) for w in caught]
  assert any("without a GPU" in msg and "'pallas_sm90'" in msg for msg in messages), messages
  # An explicit backend is the user's choice: no warning.
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    g = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, backend="reference"))
    export.export(g, platforms=["cuda"])(*_avals((), 64, 300, 256, with_c=False))
  assert not [w for w in caught if "blockwise_fp8_dot" in str(w.message)]
