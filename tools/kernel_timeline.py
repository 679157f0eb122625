"""Where a CTA's cycles go, phase by phase: the Hopper kernel's intra-kernel timeline
from Mosaic GPU's on-device profiler (pallas/hopper.profiled). On the GPU machine.

    python3 tools/kernel_timeline.py --shape=2048x4096x7168 --config_shape=4096x4096x7168
    python3 tools/kernel_timeline.py --shape=2048x4096x7168 \\
        --variant=tile_m=128,tile_n=256,wg_split=n,cluster_n=1

Runs the dense kernel (bf16 output) with the tiling the rules give --config_shape (default:
--shape; --variant replaces fields, tools/compare_configs.py's syntax) three times under
the profiler, checks the last call's output against the float64 contract, and prints
for one CTA (--cta), per warpgroup, from the clock every warpgroup of an SM reads:

- each phase's median length in cycles: "full_wait" (a consumer's wait for its ring
  slot), "wgmma" (one chunk: its WGMMAs issued, then waited for), "epilogue";
  the producer's "empty_wait" and "produce" (its TMA issue);
- the median gap between consecutive phases: after a "wgmma" comes the chunk's
  promotion (the gap to the next "wgmma" within a step; to "full_wait" it also holds
  the slot's release and the loop), after a "full_wait" the step's top (scale loads,
  WGMMA descriptors);
- the K step's period (one "full_wait" to the next) and the cycles per step in which
  no consumer warpgroup has a chunk in flight (there the warpgroups' chains, not the
  tensor cores, set the pace).

Writes the Chrome trace (chrome://tracing or Perfetto) and the raw event buffer (npz)
to --out. The records cost cycles (an SMEM store and a clock read each: the traced
kernel runs slower than the untraced one), so read the phases against each other,
not as the kernel's speed (tools/compare_configs.py times it).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys

import numpy as np

EXIT = 1 << 31      # Mosaic GPU's profiler: the tag of a phase's end
HEADER = 3          # entries before a warpgroup's events: start time, SM id, entries used
CLOCK = 1 << 32     # %clock is 32 bits wide


@dataclasses.dataclass(frozen=True)
class Phase:
  name: str
  begin: int  # cycles (the SM's %clock, unwrapped)
  end: int


def warpgroup_phases(buf: np.ndarray, names: dict, entries: int, warpgroups: int,
                     cta: int, wg: int) -> list[Phase]:
  """The phases warpgroup `wg` of CTA `cta` recorded, in order of their begin.
  buf: the profiler's flat uint32 buffer ([CTA, warpgroup, entries]); names: the
  profiler's {name: id}."""
  trace = np.asarray(buf, np.int64).reshape(-1, warpgroups, entries)[cta, wg]
  used = int(trace[2])
  events = trace[HEADER:HEADER + used].reshape(-1, 2)
  unintern = {v: k for k, v in names.items()}
  stack, out, last, wraps = [], [], None, 0
  for tag, clock in events:
    if last is not None and clock < last:  # the 32-bit clock wrapped
      wraps += 1
    last = int(clock)
    t = int(clock) + wraps * CLOCK
    name = unintern[int(tag) & ~EXIT]
    if int(tag) & EXIT:
      opened, begin = stack.pop()
      if opened != name:
        raise ValueError(f"phase {opened!r} closed as {name!r}: the trace is corrupt")
      out.append(Phase(name, begin, t))
    else:
      stack.append((name, t))
  return sorted(out, key=lambda p: p.begin)


def phase_lengths(phases: list[Phase]) -> dict[str, float]:
  """Median length of each phase, cycles."""
  by = {}
  for p in phases:
    by.setdefault(p.name, []).append(p.end - p.begin)
  return {name: float(np.median(v)) for name, v in by.items()}


def gaps(phases: list[Phase]) -> dict[tuple[str, str], tuple[int, float]]:
  """{(phase, next phase): (count, median cycles from the first's end to the next's begin)}."""
  by = {}
  for a, b in zip(phases, phases[1:]):
    by.setdefault((a.name, b.name), []).append(b.begin - a.end)
  return {k: (len(v), float(np.median(v))) for k, v in by.items()}


def step_period(phases: list[Phase]) -> float:
  """Median cycles from one "full_wait" to the next (a K step; NaN without two)."""
  begins = [p.begin for p in phases if p.name == "full_wait"]
  return float(np.median(np.diff(begins))) if len(begins) > 1 else float("nan")


def tensor_idle(consumers: list[list[Phase]]) -> tuple[int, int]:
  """(cycles from the first chunk's issue to the last chunk's wait, cycles of that
  span in which no consumer warpgroup had a "wgmma" phase open)."""
  spans = sorted((p.begin, p.end) for phases in consumers for p in phases if p.name == "wgmma")
  if not spans:
    return 0, 0
  idle, reach = 0, spans[0][1]
  for begin, end in spans[1:]:
    if begin > reach:
      idle += begin - reach
    reach = max(reach, end)
  return reach - spans[0][0], idle


def report(buf, names, entries: int, warpgroups: int, cta: int) -> list[str]:
  """The printed summary of one CTA (the last warpgroup is the producer)."""
  phases = [warpgroup_phases(buf, names, entries, warpgroups, cta, wg)
            for wg in range(warpgroups)]
  lines = []
  for wg, ph in enumerate(phases):
    role = "producer" if wg == warpgroups - 1 else "consumer"
    lengths = ", ".join(f"{n} {v:.0f}" for n, v in sorted(phase_lengths(ph).items()))
    lines.append(f"warpgroup {wg} ({role}), {len(ph)} phases; median cycles: {lengths}")
    for (a, b), (count, med) in sorted(gaps(ph).items()):
      lines.append(f"    gap {a:>11} -> {b:<11} x{count:<5d} median {med:6.0f}")
    if role == "consumer":
      lines.append(f"    K step period (full_wait to full_wait): median {step_period(ph):.0f}")
  consumers = phases[:-1]
  span, idle = tensor_idle(consumers)
  steps = max(sum(p.name == "full_wait" for p in consumers[0]), 1)
  if span:
    lines.append(f"no chunk in flight: {idle} of {span} cycles ({idle / span:.1%}), "
                 f"{idle / steps:.0f} a K step")
  return lines


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", required=True, help="MxNxK of the problem run")
  p.add_argument("--config_shape", default=None, help="MxNxK whose default tiling runs it")
  p.add_argument("--variant", default="", help="HopperConfig fields replaced, a=b,c=d")
  p.add_argument("--cta", type=int, default=0, help="the CTA reported")
  p.add_argument("--events", type=int, default=700, help="phases recorded a warpgroup")
  p.add_argument("--out", default=".out/timeline", help="where the traces go")
  return p.parse_args(argv)


def _dims(text: str) -> tuple[int, ...]:
  dims = tuple(int(x) for x in text.lower().split("x"))
  if len(dims) != 3 or min(dims) < 1:
    raise ValueError(f"a shape is MxNxK of positive integers, got {text!r}")
  return dims


def main(argv=None) -> int:
  args = _parse(argv)
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
  import jax
  import jax.numpy as jnp
  from jax.experimental.mosaic.gpu import profiler as mgpu_profiler
  from compare_configs import parse_variant
  from jax_fp8 import testing
  from jax_fp8.pallas import hopper, hopper_tiling

  m, n, k = _dims(args.shape)
  cfg = hopper_tiling.default_config(*_dims(args.config_shape or args.shape),
                                     out_dtype=jnp.dtype(jnp.bfloat16))
  cfg = dataclasses.replace(cfg, **parse_variant(args.variant))
  print(f"{m}x{n}x{k}: {cfg}", flush=True)
  os.makedirs(args.out, exist_ok=True)

  # The profiler writes a Chrome trace; its raw buffer keeps the clock that every
  # warpgroup of an SM shares (the trace aligns warpgroups by wall time instead).
  raw = {}
  dump = mgpu_profiler.ProfilerSpec.dump

  def keep_raw(spec, buffer, f, grid, block):
    raw.update(buf=np.asarray(buffer).copy(), names=dict(spec.interned_names),
               entries=spec.entries_per_warpgroup, warpgroups=int(np.prod(block)) // 128)
    return dump(spec, buffer, f, grid, block)
  mgpu_profiler.ProfilerSpec.dump = keep_raw

  ops = testing.random_operands(0, m, n, k, with_c=False)
  call = jax.jit(lambda a, sa, b, sb: hopper.blockwise_fp8_dot(
      a, sa, b, sb, None, beta=1.0, out_dtype=jnp.bfloat16, config=cfg))
  with hopper.profiled(os.path.abspath(args.out), args.events):
    for _ in range(3):
      # Every call of one compilation writes the same file name: the last one's is kept.
      jax.effects_barrier()
      for old in glob.glob(os.path.join(args.out, "*-trace.json")):
        os.remove(old)
      out = jax.block_until_ready(call(*ops.args()[:4]))
    jax.effects_barrier()
  err = testing.rel_error(out, testing.reference_f64(*ops.args()[:4]))
  if not raw:
    print("no profile was recorded", file=sys.stderr)
    return 1
  label = f"{m}x{n}x{k}" + (f"_{args.variant}" if args.variant else "")
  traces = sorted(glob.glob(os.path.join(args.out, "*-trace.json")), key=os.path.getmtime)
  os.replace(traces[-1], os.path.join(args.out, f"trace_{label}.json"))
  np.savez_compressed(os.path.join(args.out, f"raw_{label}.npz"), buf=raw["buf"],
                      names=json.dumps(raw["names"]), entries=raw["entries"],
                      warpgroups=raw["warpgroups"])
  print(f"output: relative Frobenius error {err:.2e} (bf16 bound 4e-3)")
  for line in report(raw["buf"], raw["names"], raw["entries"], raw["warpgroups"], args.cta):
    print(line)
  return 0 if err <= 4e-3 else 1


if __name__ == "__main__":
  sys.exit(main())
