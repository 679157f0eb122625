"""The GPU interpret-mode test helper really fails on a race and on a TMA copy whose SMEM
address the GPU would reject."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8 import testing


def _two_warpgroup_kernel(x, *, both_write: bool):
  def body(x_ref, o_ref, smem):
    wg = jax.lax.axis_index("wg")

    @pl.when(jnp.logical_or(both_write, wg == 0))
    def _():
      smem[...] = x_ref[...] + wg.astype(jnp.float32)

    @pl.when(wg == 0)
    def _():
      o_ref[...] = smem[...]

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                      scratch_types=[plgpu.SMEM((128,), jnp.float32)],
                      num_threads=2, thread_name="wg")(x)


def test_race_free_kernel_passes():
  x = jnp.arange(128, dtype=jnp.float32)
  out = testing.run_in_gpu_interpret_mode(
      lambda x: _two_warpgroup_kernel(x, both_write=False), x)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def test_racy_kernel_fails():
  x = jnp.arange(128, dtype=jnp.float32)
  with pytest.raises(AssertionError, match="data race"):
    testing.run_in_gpu_interpret_mode(lambda x: _two_warpgroup_kernel(x, both_write=True), x)


def _store_rows_from(row: int, x):
  """Copies rows [row, row + 2) of x ([8, 32] bf16: 64-byte rows) through SMEM by TMA."""
  def body(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem.at[pl.ds(row, 2)], o_ref.at[pl.ds(row, 2)])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      scratch_types=[plgpu.SMEM(x.shape, x.dtype)])(x)


def test_tma_copy_from_an_aligned_smem_row_passes():
  x = jnp.arange(8 * 32, dtype=jnp.float32).reshape(8, 32).astype(jnp.bfloat16)
  out = testing.run_in_gpu_interpret_mode(lambda x: _store_rows_from(2, x), x)
  np.testing.assert_array_equal(np.asarray(out[2:4]), np.asarray(x[2:4]))


def test_tma_copy_from_a_misaligned_smem_row_fails():
  """Row 1 starts 64 bytes into the buffer: the GPU faults ("misaligned address");
  the interpreter would not notice."""
  x = jnp.arange(8 * 32, dtype=jnp.float32).reshape(8, 32).astype(jnp.bfloat16)
  with pytest.raises(AssertionError, match="SMEM byte offset 64 .*test_interpret_helper"):
    testing.run_in_gpu_interpret_mode(lambda x: _store_rows_from(1, x), x)


def test_few_cpu_threads_warn(monkeypatch):
  """One warpgroup per XLA CPU thread: too few of them can hang a kernel whose
  warpgroups wait for one another (CI configures 8 CPU devices: no warning)."""
  import os
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with testing.gpu_interpret_mode():
      pass
  monkeypatch.setattr(jax, "devices", lambda *a: [None])
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  with pytest.warns(RuntimeWarning, match="xla_force_host_platform_device_count"):
    with testing.gpu_interpret_mode():
      pass
