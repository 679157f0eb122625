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
