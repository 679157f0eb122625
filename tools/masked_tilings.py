"""Times Hopper tilings of masked (or, with --contiguous, ragged) grouped GEMMs over
random fills: the rows of a grouped GEMM (masked_m, group_sizes) are known on the
device only, so a tiling is judged by its mean time over fills, not at one draw.
On the GPU machine.

    python3 tools/masked_tilings.py --cases=1x1408x4096x7168,4x384x7168x2048 \\
        --draws=6 --variants="cluster_m=2; \\
        tile_m=128,tile_n=192,consumers=2,wide_chunks=True,a_scale_window=4"

A case is GxCAPACITYxNxK. Each draw gives every group masked_m uniform in
[capacity / 2, capacity] (seeded), or with --expected_m=E uniform in [0.7 E,
1.3 E] and at most the capacity, the default then the rules' pick for that hint
(blockwise_fp8_masked_dot's expected_m). A variant is a comma list of HopperConfig fields
replaced in the case's default (pallas/hopper_tiling.default_config), variants
separated by ';' (tools/compare_configs.py's syntax); the default is always timed.
With --contiguous a case is GxROWSxNxK: a [G * ROWS, K] cut into G contiguous
groups of sizes uniform in [0.7, 1.3] x ROWS rescaled to sum to G * ROWS
(blockwise_fp8_ragged_dot; the default is the rules' ragged pick; --aligned: every
group ROWS rows). Every variant's
output at the first draw is compared with the default's (the same sums: a difference
is reported), and every config's, the default's too, with the contract at sampled rows
(`sampled_rows`: the rows around each group's boundaries and each 64-row chunk start
after them, where a row-exact store going wrong shows, and random ones; float32 on the
device), "FAIL" beyond bf16's bound or where a row that must be zero is not. One
compilation per config: masked_m is a device array, so the draws only change operands.
Prints each config's time per draw and its mean (kernel time through CUPTI, operands
rotated past the L2); --json_out writes them.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import numpy as np


def parse_case(text: str) -> tuple[int, int, int, int]:
  """'4x384x7168x2048' -> (groups, capacity, n, k)."""
  parts = text.lower().split("x")
  if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"a case is GxCAPACITYxNxK of positive integers, got {text!r}")
  g, cap, n, k = (int(p) for p in parts)
  return g, cap, n, k


def draws(groups: int, capacity: int, count: int, seed: int = 0,
          expected_m: int | None = None) -> list[np.ndarray]:
  """`count` masked_m vectors, each group's rows uniform in [capacity / 2, capacity],
  or in [0.7, 1.3] x expected_m and at most the capacity."""
  rng = np.random.default_rng([seed, groups, capacity])
  if expected_m is None:
    return [np.floor(capacity * rng.uniform(0.5, 1.0, groups)).astype(np.int32)
            for _ in range(count)]
  return [np.minimum(capacity, np.floor(expected_m * rng.uniform(0.7, 1.3, groups)))
          .astype(np.int32) for _ in range(count)]


def contiguous_draws(groups: int, rows: int, count: int, seed: int = 0,
                     aligned: bool = False) -> list[np.ndarray]:
  """`count` group_sizes vectors summing to groups * rows, each size ~uniform in
  [0.7, 1.3] x rows before the rescale (the last group takes the rounding), or
  (aligned) every group `rows` rows."""
  if aligned:
    return [np.full(groups, rows, np.int32) for _ in range(count)]
  rng = np.random.default_rng([seed, groups, rows, 1])
  out = []
  for _ in range(count):
    w = rng.uniform(0.7, 1.3, groups)
    sizes = np.floor(w / w.sum() * groups * rows).astype(np.int32)
    sizes[-1] += groups * rows - sizes.sum()
    out.append(sizes)
  return out


def sampled_rows(bounds, rows: int, count: int, seed: int = 0) -> np.ndarray:
  """Rows of an output of `rows` rows to check: around each boundary b (b - 1, b,
  b + 1, the first 64-row chunk start from b and the row after it) and `count`
  drawn at random; sorted, unique, within [0, rows)."""
  picks = [np.random.default_rng(seed).integers(0, rows, count)]
  for b in bounds:
    chunk = -(-int(b) // 64) * 64
    picks.append(np.array([b - 1, b, b + 1, chunk, chunk + 1]))
  out = np.unique(np.concatenate(picks).astype(np.int64))
  return out[(out >= 0) & (out < rows)]


def contract_rows(a, a_scale, b, b_scale, rows, groups_of_rows, live):
  """The float32 contract at `rows` of a [.., K] (rows into its flattened leading
  axes): row r times b[groups_of_rows[r]] where live[r], else 0; [len(rows), N]."""
  import jax
  import jax.numpy as jnp
  from jax_fp8.quantize import dequantize_128x128, dequantize_1x128
  k = a.shape[-1]
  a32 = dequantize_1x128(a.reshape(-1, k)[rows],
                         a_scale.reshape(-1, a_scale.shape[-1])[rows])
  groups_of_rows, live = np.asarray(groups_of_rows), np.asarray(live, bool)
  out = np.zeros((len(rows), b.shape[1]))
  for g in np.unique(groups_of_rows[live]):
    mine = np.nonzero((groups_of_rows == g) & live)[0]
    out[mine] = np.asarray(jnp.dot(a32[mine], dequantize_128x128(b[g], b_scale[g]).T,
                                   precision=jax.lax.Precision.HIGHEST))
  return out


def check_rows(out, ref, rows, live) -> str:
  """A report of out (flattened to [-1, N]) at `rows` against ref: the relative
  error of the live rows (testing.rel_error, NaN for a non-finite one) within
  bf16's bound and whether the others are zero; 'FAIL' if either is off."""
  import jax.numpy as jnp
  from jax_fp8 import testing
  got = np.asarray(out, np.float64).reshape(-1, ref.shape[1])[rows]
  live = np.asarray(live, bool)
  err = testing.rel_error(got[live], ref[live]) if live.any() else 0.0
  zeros_ok = bool(np.all(got[~live] == 0))
  verdict = "" if err <= testing.TOLERANCE[np.dtype(jnp.bfloat16)] and zeros_ok else " FAIL"
  zeros = "" if zeros_ok else ", zero rows not 0"
  return f"rows checked {len(rows)}: rel. err {err:.2e}{zeros}{verdict}"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cases", required=True, help="comma list of GxCAPACITYxNxK")
  p.add_argument("--variants", default="", help="';'-separated HopperConfig field variants")
  p.add_argument("--draws", type=int, default=6)
  p.add_argument("--iters", type=int, default=15)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--expected_m", type=int, default=None,
                 help="the rows a group is expected to hold (the fills and the default's hint)")
  p.add_argument("--contiguous", action="store_true",
                 help="ragged (contiguous) groups: cases are GxROWSxNxK")
  p.add_argument("--aligned", action="store_true",
                 help="with --contiguous: every group ROWS rows (else random sizes)")
  p.add_argument("--json_out", default=None)
  args = p.parse_args(argv)
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  sys.path.insert(0, os.path.dirname(__file__))
  import jax.numpy as jnp
  from compare_configs import parse_variant, variant_configs
  from jax_fp8.pallas import autotune, hopper, hopper_tiling

  variants = [parse_variant(v) for v in args.variants.split(";") if v.strip()]
  rng = np.random.default_rng(args.seed)
  rows = []
  for case in args.cases.split(","):
    g, cap, n, k = parse_case(case)
    kb, nb = -(-k // 128), -(-n // 128)
    fp8 = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32) * 64).astype(
        jnp.float8_e4m3fn)
    scales = lambda *s: jnp.asarray(np.exp2(rng.uniform(-12, -4, size=s)).astype(np.float32))
    if args.contiguous:
      m = g * cap
      operands = (fp8(m, k), scales(m, kb), fp8(g, n, k), scales(g, nb, kb))
      fills = contiguous_draws(g, cap, args.draws, args.seed, args.aligned)
      base = hopper_tiling.default_config(m, n, k, groups=g, grouped=True, row_masks=True)
      run = hopper.ragged_dot
    else:
      operands = (fp8(g, cap, k), scales(g, cap, kb), fp8(g, n, k), scales(g, nb, kb))
      fills = draws(g, cap, args.draws, args.seed, args.expected_m)
      base = hopper_tiling.default_config(cap, n, k, groups=g, grouped=True,
                                          expected_m=args.expected_m)
      run = hopper.masked_dot
    configs = variant_configs(base, variants, case)
    print(f"{case}: {'group_sizes' if args.contiguous else 'masked_m'} draws "
          f"{[f.tolist() for f in fills]}; default {base}", flush=True)
    fill = fills[0]
    if args.contiguous:  # rows of group g: [starts[g], starts[g + 1]); then zeros
      starts = np.concatenate([[0], np.cumsum(fill)])
      check = sampled_rows(starts[1:], m, 64, args.seed)
      groups_of = np.minimum(np.searchsorted(starts, check, side="right") - 1, g - 1)
      live = check < starts[-1]
    else:  # group g's rows g * cap + [0, masked_m[g]); the rest zeros
      check = np.concatenate([r * cap + sampled_rows([fill[r]], cap, 16, args.seed + r)
                              for r in range(g)])
      groups_of, live = check // cap, (check % cap) < fill[check // cap]
    ref = contract_rows(*operands, check, groups_of, live)
    reference = None
    for name, cfg in configs.items():
      fn = functools.partial(run, out_dtype=jnp.bfloat16, config=cfg)
      out = np.asarray(fn(*operands, jnp.asarray(fill)).astype(jnp.float32))
      if reference is None:
        reference = out
      differs = np.abs(out - reference).max() if np.isfinite(out).all() else float("nan")
      verdict = check_rows(out, ref, check, live)
      us = [1e3 * autotune.kernel_time_ms(fn, (*operands, jnp.asarray(f)), iters=args.iters)
            for f in fills]
      print(f"  {name:60s} mean {np.mean(us):8.1f} us | {' '.join(f'{t:7.1f}' for t in us)}"
            f" | max|out - default's| {differs:g} | {verdict}", flush=True)
      rows.append(dict(case=case, config=name, fills=[f.tolist() for f in fills], us=us,
                       max_diff_from_default=float(differs), check=verdict))
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
