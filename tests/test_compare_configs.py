"""tools/compare_configs.py: its variant syntax and one run per output kind in GPU
interpret mode (the timings mean nothing there; the configs and the checks do)."""
import os
import sys

import pytest

from jax_fp8 import testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import compare_configs  # noqa: E402
import tiling_picks  # noqa: E402


def test_variants_parse():
  assert compare_configs.parse_variant("cluster_m=2, wg_split=n,wide_chunks=False,num_sms=None") \
      == {"cluster_m": 2, "wg_split": "n", "wide_chunks": False, "num_sms": None}
  with pytest.raises(ValueError, match="field=value"):
    compare_configs.parse_variant("stages")


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float8_e4m3fn"])
def test_runs_in_interpret_mode(out_dtype, capsys):
  with testing.gpu_interpret_mode():
    assert compare_configs.main(["--shapes=130x256x256", "--variants=stages=2; tile_n=100",
                                 "--rounds=1", "--iters=1", f"--out_dtype={out_dtype}"]) == 0
  out = capsys.readouterr().out
  assert "tile_n=100: refused" in out
  assert "default " in out and "stages=2 " in out and "TFLOP/s" in out


def test_fp8_outputs_are_checked_dequantised(monkeypatch):
  # A wrong FP8 output must fail its check: here every scale off by a factor of 2.
  import jax.numpy as jnp
  from jax_fp8.pallas import autotune
  calls = []

  def timed(fn, args, *, iters, check):
    q, s = fn(*args)
    check((q, s * 2))  # raises
    calls.append(1)
    return 1.0
  monkeypatch.setattr(autotune, "kernel_time_ms", timed)
  cfg = tiling_picks.hopper_tiling.fp8_output_config(130, 256, 256)
  with testing.gpu_interpret_mode(), pytest.raises(ValueError, match="relative error"):
    tiling_picks.time_pair(130, 256, 256, {"out_dtype": jnp.dtype(jnp.float8_e4m3fn)}, [cfg],
                           rounds=1, iters=1)
  assert not calls
