"""tools/masked_tilings.py: its case syntax, its fills, and one run in GPU interpret
mode (the timings mean nothing there; the path through the kernel does)."""
import json
import os
import sys

import numpy as np
import pytest

from jax_fp8 import testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import masked_tilings  # noqa: E402


def test_cases_parse_or_say_why():
  assert masked_tilings.parse_case("4x384x7168x2048") == (4, 384, 7168, 2048)
  for bad in ("4x384x7168", "4x0x7168x2048", "ax384x7168x2048"):
    with pytest.raises(ValueError, match="GxCAPACITYxNxK"):
      masked_tilings.parse_case(bad)


def test_fills_span_half_to_all_of_the_capacity():
  fills = masked_tilings.draws(8, 384, 50)
  rows = np.concatenate(fills)
  assert len(fills) == 50 and all(f.shape == (8,) and f.dtype == np.int32 for f in fills)
  assert rows.min() >= 192 and rows.max() <= 384 and rows.max() - rows.min() > 150
  assert all((a == b).all() for a, b in zip(fills, masked_tilings.draws(8, 384, 50)))
  rows = np.concatenate(masked_tilings.draws(8, 2048, 50, expected_m=100))
  assert rows.min() >= 70 and rows.max() <= 130 and rows.max() - rows.min() > 40
  assert np.concatenate(masked_tilings.draws(8, 384, 50, expected_m=350)).max() == 384


def test_runs_in_interpret_mode(tmp_path):
  out = tmp_path / "rows.json"
  with testing.gpu_interpret_mode():
    masked_tilings.main(["--cases=2x64x128x256", "--draws=1", "--iters=1",
                         "--variants=stages=3; tile_n=100", f"--json_out={out}"])
  rows = json.loads(out.read_text())
  assert [r["config"] for r in rows] == ["default", "stages=3"]   # tile_n=100: refused
  assert all(len(r["us"]) == 1 and r["us"][0] > 0 for r in rows)
  assert all(r["max_diff_from_default"] == 0 for r in rows)   # the same sums
  assert all("FAIL" not in r["check"] and "rows checked" in r["check"] for r in rows)
  with testing.gpu_interpret_mode():   # told the expected rows: fills around them
    masked_tilings.main(["--cases=2x64x128x256", "--draws=1", "--iters=1", "--expected_m=20",
                         f"--json_out={out}"])
  rows = json.loads(out.read_text())
  assert len(rows) == 1 and all(14 <= r <= 26 for r in rows[0]["fills"][0])


def test_contiguous_fills_sum_to_the_rows():
  fills = masked_tilings.contiguous_draws(8, 512, 20)
  assert all(f.sum() == 8 * 512 and f.min() >= 0 for f in fills)
  sizes = np.concatenate(fills)
  assert sizes.min() < 480 and sizes.max() > 544   # not all aligned
  assert all((a == b).all() for a, b in zip(fills, masked_tilings.contiguous_draws(8, 512, 20)))
  assert all((f == 512).all() for f in masked_tilings.contiguous_draws(8, 512, 3, aligned=True))


def test_contiguous_runs_in_interpret_mode(tmp_path):
  out = tmp_path / "rows.json"
  with testing.gpu_interpret_mode():
    masked_tilings.main(["--contiguous", "--cases=2x72x128x256", "--draws=1", "--iters=1",
                         "--variants=stages=3", f"--json_out={out}"])
  rows = json.loads(out.read_text())
  assert [r["config"] for r in rows] == ["default", "stages=3"]
  assert sum(rows[0]["fills"][0]) == 144 and rows[1]["max_diff_from_default"] == 0
  assert all("FAIL" not in r["check"] for r in rows)


def test_sampled_rows_take_the_boundaries():
  rows = masked_tilings.sampled_rows([823, 4096], 4096, 8)
  assert {822, 823, 824, 832, 833, 4095} <= set(rows.tolist())
  assert rows.max() < 4096 and rows.min() >= 0 and len(set(rows.tolist())) == len(rows)


def test_check_rows_fails_wrong_or_unwritten_rows():
  """A live row zeroed (what row-exact stores past N did on the GPU) or a row that
  must be zero written fails; the reference itself passes."""
  rng = np.random.default_rng(0)
  rows, live = np.array([1, 3, 5, 6]), np.array([True, True, True, False])
  ref = rng.standard_normal((4, 32)) * np.array([[1], [1], [1], [0]])
  out = np.zeros((8, 32))
  out[rows] = ref
  assert "FAIL" not in masked_tilings.check_rows(out, ref, rows, live)
  bad = out.copy()
  bad[3, :16] = 0.0
  assert "FAIL" in masked_tilings.check_rows(bad, ref, rows, live)
  bad = out.copy()
  bad[6] = 1.0
  assert "zero rows not 0" in masked_tilings.check_rows(bad, ref, rows, live)
  bad[1] = np.nan
  assert "FAIL" in masked_tilings.check_rows(bad, ref, rows, live)
