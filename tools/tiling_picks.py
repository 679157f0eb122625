"""The Hopper default configs (pallas/hopper_tiling.default_config) of this
checkout against those of another revision, shape by shape; no GPU needed.

    python tools/tiling_picks.py                      # required shapes vs the rules
    python tools/tiling_picks.py --shapes=sweep --rev=main
    python tools/tiling_picks.py --shapes=required --table   # the picks as a table
    python tools/tiling_picks.py --shapes=sweep --time       # on a GPU: time both picks

Shape sets: `required` (the 18 DeepSeek-V3 dense shapes x bf16/f32 out x no c,
f32 c, bf16 c; the ragged and masked MoE shapes; the training recipe's forward,
dgrad and per-row-b wgrad shapes), `sweep` (M x N x K grid in 8 variants),
`extended` (a finer grid, 4 variants). The other revision's hopper_tiling.py and
hopper_cost.py are loaded next to this checkout's kernel modules; the default, 737fe5c,
is the last one with rule-based tiling (before the cost model). SM count pinned to 132 (H100).
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import os
import subprocess
import sys
import tempfile

import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from jax_fp8.pallas import hopper, hopper_tiling  # noqa: E402
from jax_fp8.pallas.common import FP8_OUT  # noqa: E402

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
DENSE_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
OUT_C = {"bf16": (BF16, None), "bf16+cf32": (BF16, F32), "bf16+cbf16": (BF16, BF16),
         "f32": (F32, None), "f32+cf32": (F32, F32), "f32+cbf16": (F32, BF16)}


def required():
  """(m, n, k, variant, kwargs) of the shapes whose picks must not change."""
  for m, (n, k), (name, (out, c)) in itertools.product((64, 128, 4096), DENSE_NK, OUT_C.items()):
    yield m, n, k, name, dict(out_dtype=out, c_dtype=c)
  for (n, k), out in itertools.product(((4096, 7168), (7168, 2048)), ("bf16", "f32")):
    dt = OUT_C[out][0]
    for g in (4, 8):
      yield 32768, n, k, f"{out} ragged x{g}", dict(out_dtype=dt, groups=g, grouped=True,
                                                     row_masks=True)
    for g, rows in ((1, 1024), (2, 512), (4, 256), (32, 64)):
      yield rows, n, k, f"{out} masked x{g}", dict(out_dtype=dt, groups=g, grouped=True)
  for (m, n), k, out in itertools.product(((7168, 18432), (18432, 7168)), (4096, 16384),
                                          ("bf16", "f32")):
    yield m, n, k, f"{out} per-row b", dict(out_dtype=OUT_C[out][0], b_scale_rows=1)
  for t, (n, k), out in itertools.product((4096, 16384), ((18432, 7168), (7168, 18432)),
                                          ("bf16", "f32")):
    yield t, n, k, out, dict(out_dtype=OUT_C[out][0])


VARIANTS = {
    "bf16": dict(out_dtype=BF16), "f32": dict(out_dtype=F32),
    "bf16+cf32": dict(out_dtype=BF16, c_dtype=F32), "f32+cf32": dict(out_dtype=F32, c_dtype=F32),
    "bf16+cbf16": dict(out_dtype=BF16, c_dtype=BF16),
    "f32 per-row b": dict(out_dtype=F32, b_scale_rows=1),
    "bf16 ragged": dict(out_dtype=BF16, grouped=True, row_masks=True),
    "bf16 masked x4": dict(out_dtype=BF16, groups=4, grouped=True),
}


def sweep():
  ms = (1, 8, 64, 65, 100, 128, 129, 200, 256, 512, 1000, 1024, 2048, 4096, 8192)
  ns = (128, 256, 576, 1536, 2112, 4096, 7168)
  ks = (128, 256, 512, 1536, 2048, 7168)
  for (name, kw), m, n, k in itertools.product(VARIANTS.items(), ms, ns, ks):
    yield m, n, k, name, kw


def extended():
  ms = (1, 8, 32, 64, 65, 96, 100, 128, 129, 160, 192, 200, 256, 384, 512, 768, 1000, 1024,
        1536, 2048, 3000, 4096, 8192, 16384)
  ns = (128, 256, 512, 576, 1024, 1536, 2048, 2112, 3072, 4096, 6144, 7168, 8192, 12288,
        16384, 18432, 24576, 32768)
  ks = tuple(range(128, 2049, 128)) + (2560, 3072, 3584, 4096, 4608, 5120, 6144, 7168, 8192,
                                       10240, 12288, 14336, 16384, 18432)
  variants = {"bf16": VARIANTS["bf16"], "f32 per-row b": VARIANTS["f32 per-row b"],
              "bf16 ragged": VARIANTS["bf16 ragged"],
              "bf16 masked x8": dict(out_dtype=BF16, groups=8, grouped=True)}
  for (name, kw), m, n, k in itertools.product(variants.items(), ms, ns, ks):
    yield m, n, k, name, kw


def spec(cfg) -> str:
  """A config in one short string (the fields that differ from the usual)."""
  s = f"{cfg.tile_m}x{cfg.tile_n}{cfg.wg_split}{cfg.consumers} s{cfg.stages} e{cfg.epi_tile_n}"
  s += f" o{cfg.grid_minor}"
  for field, short in (("k_step", "ks"), ("split_k", "sk"), ("cluster_m", "cm"),
                       ("cluster_n", "cn")):
    if getattr(cfg, field) != 1:
      s += f" {short}{getattr(cfg, field)}"
  if cfg.producer_registers != 40:
    s += f" p{cfg.producer_registers}"
  s += ("" if cfg.scale_product else " sep") + (" wide" if cfg.wide_chunks else "")
  s += f" aw{cfg.a_scale_window}" if cfg.a_scale_window else ""
  s += " tma" if getattr(cfg, "tma_scales", False) else ""
  s += " ov" if getattr(cfg, "step_top_overlap", False) else ""
  s += " dc" if getattr(cfg, "desc_carry", False) else ""
  s += " cs" if getattr(cfg, "carried_slot", False) else ""
  s += " pw" if getattr(cfg, "producer_warp", False) else ""
  s += " pf" if getattr(cfg, "probe_in_flight", False) else ""
  return s + (" lf" if getattr(cfg, "live_first", False) else "")


def _source(rev: str, path: str) -> str | None:
  root = os.path.join(os.path.dirname(__file__), "..")
  done = subprocess.run(["git", "-C", root, "show", f"{rev}:{path}"], capture_output=True,
                        text=True)
  return done.stdout if done.returncode == 0 else None


def _module(name: str, *, path: str | None = None, src: str | None = None):
  """A module from a file, or from source text (written to a temporary file)."""
  if path is None:
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
      f.write(src)
  module_spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_revision(rev: str):
  """pallas/hopper_tiling.py of a git revision, as a module, with the revision's
  cost model (pallas/hopper_cost.py, where the revision has one) in place of this
  checkout's, so that a change of either shows; where `rev` is a path (on a
  machine without the git history), that hopper_tiling.py with this checkout's
  cost model."""
  if os.path.isfile(rev):
    return _module("hopper_tiling_rev", path=rev)
  tiling_src = _source(rev, "pallas/hopper_tiling.py")
  if tiling_src is None:
    raise SystemExit(f"tiling_picks: no pallas/hopper_tiling.py at {rev}")
  cost_src = _source(rev, "pallas/hopper_cost.py")
  if cost_src is None:
    return _module("hopper_tiling_rev", src=tiling_src)
  import jax_fp8.pallas as package  # the revision's tiling imports the cost model from here
  name = "jax_fp8.pallas.hopper_cost"
  mine = sys.modules[name]
  cost = _module("hopper_cost_rev", src=cost_src)
  sys.modules[name], package.hopper_cost = cost, cost
  try:
    return _module("hopper_tiling_rev", src=tiling_src)
  finally:
    sys.modules[name], package.hopper_cost = mine, mine


def _check_dequantised(out, *, check):
  """check(q * its 1x128 scales) of an FP8 output (q, scale)."""
  import jax_fp8
  check(jax_fp8.dequantize_1x128(*out))


def time_pair(m, n, k, kw, configs, rounds=2, iters=20):
  """Kernel times (ms) of the configs at one dense shape, alternated over rounds
  so the noise shows; each output checked against the float32 contract first
  (also tools/compare_configs.py's timer)."""
  import functools
  from jax_fp8.pallas import autotune
  out_dtype, c_dtype = kw["out_dtype"], kw.get("c_dtype")
  rows = kw.get("b_scale_rows", 128)
  args = autotune.random_operands(0, m, n, k, c_dtype=c_dtype, b_scale_rows=rows)
  fp8 = out_dtype == FP8_OUT
  # An FP8 output is checked dequantised, within e4m3's rounding (2^-4 of a value at most).
  tol = 5e-2 if fp8 else 2.5e-4 if out_dtype == F32 else 4e-3
  check = autotune.output_check(args, beta=1.0, tol=tol, b_scale_rows=rows)
  if fp8:
    check = functools.partial(_check_dequantised, check=check)
  times = [[] for _ in configs]
  for _, (i, cfg) in itertools.product(range(rounds), enumerate(configs)):
    fn = functools.partial(hopper.blockwise_fp8_dot, beta=1.0, out_dtype=out_dtype, config=cfg,
                           b_scale_rows=rows)
    times[i].append(autotune.kernel_time_ms(fn, args, iters=iters, check=check))
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rev", default="737fe5c", help="the revision to compare with (or "
                      "the path of its pallas/hopper_tiling.py)")
  parser.add_argument("--shapes", default="required", choices=("required", "sweep", "extended"))
  parser.add_argument("--table", action="store_true", help="print this checkout's picks")
  parser.add_argument("--time", action="store_true",
                      help="time both picks where they differ (dense shapes; needs a GPU)")
  args = parser.parse_args()
  hopper.num_sms = lambda: 132
  shapes = {"required": required, "sweep": sweep, "extended": extended}[args.shapes]()
  if args.table:
    for m, n, k, name, kw in shapes:
      cfg = hopper_tiling.default_config(m, n, k, **kw)
      print(f"    ({m}, {n}, {k}, {name!r}, {spec(cfg)!r}),")
    return
  other = load_revision(args.rev)
  total, diffs = 0, collections.defaultdict(list)
  for m, n, k, name, kw in shapes:
    total += 1
    old, new = other.default_config(m, n, k, **kw), hopper_tiling.default_config(m, n, k, **kw)
    if old != new:
      diffs[(spec(old), spec(new))].append(f"{m}x{n}x{k} {name}")
      if args.time and set(kw) <= {"out_dtype", "c_dtype"}:
        t_old, t_new = time_pair(m, n, k, kw, (old, new))
        tflops = lambda ms: 2 * m * n * k / ms / 1e9
        print(f"{m}x{n}x{k} {name}: {args.rev} {spec(old)} "
              f"{' '.join(f'{tflops(t):.0f}' for t in t_old)} TFLOP/s; now {spec(new)} "
              f"{' '.join(f'{tflops(t):.0f}' for t in t_new)} TFLOP/s", flush=True)
  print(f"{total} shapes, {sum(map(len, diffs.values()))} picks differ from {args.rev}")
  for (old, new), where in sorted(diffs.items(), key=lambda d: -len(d[1])):
    print(f"{len(where):5d}  {args.rev}: {old:38s} now: {new:38s} at {', '.join(where[:6])}"
          + (" ..." if len(where) > 6 else ""))


if __name__ == "__main__":
  main()
