"""tools/wgmma_probe.py: its cases, the ring fill's copy count, and its kernel's CUDA
lowering (timing it needs the GPU)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import wgmma_probe  # noqa: E402


def test_cases_parse_and_reject():
  assert wgmma_probe.parse_case("3x128") == (3, 128, 1)
  assert wgmma_probe.parse_case("2X128x2") == (2, 128, 2)
  for bad in ("4x128", "2x100", "2x264", "2", "2x128x0", "ax128"):
    with pytest.raises(ValueError):
      wgmma_probe.parse_case(bad)


def test_fill_copies_carry_the_tiles_ring_bytes():
  # 192 x 128 tile: (192 + 128) x 128 bytes a K step = one 320-row copy a step.
  assert wgmma_probe.fill_copies(3, 128, 1, 4000) == 4000
  # 128 x 256: (128 + 256) x 128 = 1.2 copies a step.
  assert wgmma_probe.fill_copies(2, 128, 2, 1000) == 1200
  assert wgmma_probe.fill_copies(2, 128, 1, 1) == wgmma_probe.WRITER_SLOTS  # at least a ring


@pytest.mark.parametrize("a_in_registers", [False, True])
def test_probe_kernel_lowers_for_cuda(a_in_registers):
  for with_fill in (False, True):
    assert wgmma_probe.time_case(2, 128, 2, 4, with_fill, a_in_registers,
                                 lower_only=True) == (None, None)


@pytest.mark.parametrize("scales,b_scales", [(False, False), (True, False), (True, True)])
def test_ring_probe_sums_match_float64_in_interpret_mode(scales, b_scales):
  """The --stages ring (the kernel's pipeline, a-scales in it with --scales; with
  --b_scales two GMEM b scales a step, each 32-column piece its block's) feeds every
  step its own K block and factors: the sums match a float64 model, with no race."""
  import jax.numpy as jnp
  import numpy as np
  from jax_fp8 import testing
  w, n, chunks, steps, stages = 2, 64, 2, 5, 2
  with testing.gpu_interpret_mode():
    f, avals = wgmma_probe.build(w, n, chunks, steps, 0, False, sms=2, stages=stages,
                                 scales=scales, b_scales=b_scales)
    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, avals[0].shape).astype(np.float32)
    b = rng.integers(-3, 4, avals[1].shape).astype(np.float32)
    s = np.exp2(rng.integers(-3, 4, avals[2].shape)).astype(np.float32)
    bs = np.exp2(rng.integers(-3, 4, avals[3].shape)).astype(np.float32)
    out = np.asarray(f(jnp.asarray(a).astype(avals[0].dtype),
                       jnp.asarray(b).astype(avals[1].dtype), jnp.asarray(s), jnp.asarray(bs)))
  for cta in range(2):
    boundary = 128 - (cta * 32) % 128  # columns before it take b block 0's scale
    col_b = np.where(np.arange(n * chunks) < boundary, 0, 1)
    want = np.zeros((64 * w, n * chunks))
    for i in range(steps):
      kb = slice(i * 128, (i + 1) * 128)  # K blocks cycle over RING_K_BLOCKS > steps
      block = a[:, kb].astype(np.float64) @ b[:, kb].astype(np.float64).T
      row = s[i][:, None] if scales else 1.0
      col = bs[i][col_b][None, :] if b_scales else 1.0001
      want += block * row * col
    assert np.all(np.isfinite(out[cta]))
    np.testing.assert_allclose(out[cta], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
