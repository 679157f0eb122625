"""Runs every distinct form the Hopper tiling rules pick, in Pallas's GPU interpret mode.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
        python tools/interpret_forms.py [--shapes=required|sweep|both] [--forms=START:STOP]
        python tools/interpret_forms.py --new_since=main     # what a rule change adds

A form is a default config (pallas/hopper_tiling.default_config) of the shapes of
tools/tiling_picks.py, with its kind (dense, with a residual c, per-row b scales,
ragged, masked) and output dtype; the shapes that give the same form run it once.
Each runs as an explicit config at a small shape of its tiles (two row and two
column tiles, a partial last row tile and K block, two CTAs: tiles chained through
the ring) under `jax_fp8.testing.gpu_interpret_mode` (races, TMA alignment) and
is checked against the float64 reference of its contract. The GPU tests run the
rules' picks at the benchmark shapes only: this covers the forms the rules take
elsewhere (2026-11-28: 301 forms of required + sweep, all passing, ~20 min on 2
cores). With --new_since=REV only the forms REV's rules never pick run: those a change of
the rules adds (2026-11-29: 18 forms, the 192 x 128 tiles' producer warp over short K, ~2
min). Prints one line per form and exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def forms(shapes: str, default_config=None) -> list[tuple[tuple, tuple[int, int, int]]]:
  """[((kind, out_dtype, c_dtype, config), first (m, n, k) picking it)], in order, of
  the rules' default_config (this checkout's pallas/hopper_tiling.default_config, or
  another revision's)."""
  import tiling_picks
  from jax_fp8.pallas import hopper_tiling
  default_config = default_config or hopper_tiling.default_config
  gens = {"required": (tiling_picks.required,), "sweep": (tiling_picks.sweep,),
          "both": (tiling_picks.required, tiling_picks.sweep)}[shapes]
  found: dict = {}
  for gen in gens:
    for m, n, k, _, kw in gen():
      cfg = default_config(m, n, k, **kw)
      kind = ("ragged" if kw.get("row_masks") else "masked" if kw.get("grouped") else
              "per-row" if kw.get("b_scale_rows") == 1 else "dense")
      key = (kind, kw.get("out_dtype"), kw.get("c_dtype"), dataclasses.replace(cfg, group=0))
      found.setdefault(key, (m, n, k))
  return list(found.items())


def new_forms(shapes: str, rev: str) -> list[tuple[tuple, tuple[int, int, int]]]:
  """The forms of this checkout's rules that the rules of `rev` (a git revision, or the
  path of its pallas/hopper_tiling.py: tiling_picks.load_revision) never pick: what a
  change of the rules asks interpret mode to check."""
  import tiling_picks
  old = {key for key, _ in forms(shapes, tiling_picks.load_revision(rev).default_config)}
  return [(key, shape) for key, shape in forms(shapes) if key not in old]


def small_problem(cfg, m0: int) -> tuple[int, int, int]:
  """(m, n, k) of two row and two column tiles (units of its clusters), the last row
  tile partial, and K blocks enough for every warpgroup's and split's steps (the
  last block partial where K is not split across CTAs)."""
  m = min(m0, 2 * cfg.tile_m * cfg.cluster_m + 37)
  n = 2 * cfg.tile_n * cfg.cluster_n + 40
  blocks = max(3, 2 * cfg.split_k * cfg.k_step * cfg.consumers)
  if cfg.split_k > 1:
    return m, n, math.lcm(blocks, cfg.split_k) * 128
  return m, n, (blocks + 1) * 128 - 40


def run_form(i: int, kind: str, out_dtype, c_dtype, cfg, m: int, n: int, k: int) -> None:
  """Raises if the form's output misses its float64 reference (or the interpreter
  finds a race or a misaligned TMA copy)."""
  import jax
  import jax.numpy as jnp
  from jax_fp8 import testing
  from jax_fp8.pallas import hopper
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    if kind in ("dense", "per-row"):
      block = (1, 128) if kind == "per-row" else (128, 128)
      ops = testing.random_operands(i, m, n, k, with_c=c_dtype is not None,
                                    c_dtype=c_dtype or jnp.float32, b_scale_block=block)
      out = jax.jit(lambda a, sa, b, sb, c: hopper.blockwise_fp8_dot(
          a, sa, b, sb, c, beta=0.5, out_dtype=out_dtype, config=cfg,
          b_scale_rows=block[0]))(*ops.args())
      ref = testing.reference_f64(*ops.args(), beta=0.5, b_scale_block=block)
    elif kind == "ragged":
      ops = testing.random_ragged_operands(i, m, n, k, [37, 0, 1, max(0, m - 58)])
      out = jax.jit(lambda *x: hopper.ragged_dot(*x, out_dtype=out_dtype, config=cfg))(
          *ops.args())
      ref = testing.reference_ragged_f64(*ops.args())
    else:
      ops = testing.random_masked_operands(i, m, n, k, [m, 0, m // 2 + 1])
      out = jax.jit(lambda *x: hopper.masked_dot(*x, out_dtype=out_dtype, config=cfg))(
          *ops.args())
      ref = testing.reference_masked_f64(*ops.args())
    jax.block_until_ready(out)
  testing.assert_close(out, ref, out_dtype)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shapes", choices=("required", "sweep", "both"), default="both")
  p.add_argument("--forms", default=":", help="START:STOP of the forms, in order")
  p.add_argument("--new_since", default=None, metavar="REV",
                 help="only the forms the rules of REV (a git revision, or the path of its "
                      "pallas/hopper_tiling.py) do not pick")
  args = p.parse_args(argv)
  import numpy as np
  import tiling_picks
  items = forms(args.shapes) if args.new_since is None else new_forms(args.shapes,
                                                                      args.new_since)
  start, _, stop = args.forms.partition(":")
  lo, hi = int(start or 0), int(stop or len(items))
  print(f"{len(items)} forms; running {lo}..{hi}", flush=True)
  failed = 0
  for i, ((kind, out_dtype, c_dtype, cfg), (m0, _, _)) in enumerate(items[lo:hi], lo):
    cl = cfg.cluster_m * cfg.cluster_n
    cfg = dataclasses.replace(cfg, num_sms=2 * cl, group=8)
    m, n, k = small_problem(cfg, m0)
    t0 = time.time()
    try:
      run_form(i, kind, out_dtype, c_dtype, cfg, m, n, k)
      status = "ok"
    except Exception as e:  # noqa: BLE001 (every failure is reported, then counted)
      failed += 1
      status = "FAIL " + (str(e).splitlines() or [type(e).__name__])[0][:300]
    c_name = None if c_dtype is None else np.dtype(c_dtype).name
    print(f"[{i}] {kind} {np.dtype(out_dtype).name} c={c_name} {tiling_picks.spec(cfg)} "
          f"m,n,k={m},{n},{k} ({time.time() - t0:.1f} s): {status}", flush=True)
  print(f"{hi - lo} forms, {failed} failed", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
