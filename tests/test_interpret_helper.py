"""The GPU interpret-mode test helper really fails on a race."""
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
