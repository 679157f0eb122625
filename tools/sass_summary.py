"""Summarises a per-SASS Nsight Compute export (tools/ncu_sass.sh): where a kernel's
instructions and stall samples go. Runs anywhere (no GPU).

    python3 tools/sass_summary.py .out/sass_4096x2112x7168.csv.gz \\
        [--details=.out/details_4096x2112x7168.csv] [--top=15] [--loop] [--steps=448]

Prints the report's headline metrics (with --details; among them, where ncu's
workload-imbalance rule fired, how far the busiest and idlest SM's active cycles lie
from the mean), the opcode mix (share of executed instructions and of stall samples),
the lines with the most stall samples, and the hot
loop: the instructions executed as often as most of the kernel's tensor-core MMAs (one K
step of one warp), with --loop each of them, else only how many there are, and where the
export has them the hot loop's stall reasons (its share of samples on each; two kernels'
consumers side by side: which waits the slower one spends its extra cycles in).
With --steps (the K steps a CTA runs, e.g. 448 for one tile per CTA over K = 57344) and
--details, a consumer warp's step in cycles (elapsed cycles / steps) split by phase in
proportion to the hot loop's samples: the WGMMA wait, the promotion (FFMAs), the rest;
each with its stall reasons in cycles. (A warp's samples are uniform in its time; a
kernel whose loop is unrolled, DeepGEMM's, splits the same.)
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import gzip
import re
import sys

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"
STALL_PREFIX = "stall_"
MMA_OPCODES = ("QGMMA", "HGMMA", "IGMMA", "BGMMA", "UTCQMMA", "UTCHMMA", "UTCMMA", "UTCOMMA")
SM_SPREAD = "SM active cycles spread"
_IMBALANCE = re.compile(r"One or more SMs .*?Maximum instance value is ([\d.]+)% above the "
                        r"average, while the minimum instance value is ([\d.]+)% below")
# (A name ncu repeats across sections keeps its first value: "Memory Throughput" is the
# Speed Of Light percentage.)
HEADLINE = ("Duration", "Elapsed Cycles", "SM Active Cycles", "SM Frequency",
            "Executed Instructions", "Registers Per Thread", "Local Memory Spilling Requests",
            "Issue Slots Busy", "Compute (SM) Throughput", "Memory Throughput",
            "L1/TEX Cache Throughput", "L2 Cache Throughput", "Mem Busy", "Max Bandwidth",
            "Mem Pipes Busy", "L1/TEX Hit Rate", "L2 Hit Rate", "DRAM Throughput", SM_SPREAD)


@dataclasses.dataclass(frozen=True)
class Line:
  index: int
  text: str
  executed: int
  samples: int
  reasons: tuple = ()  # (stall reason, samples) of the export's stall_* columns, nonzero

  @property
  def opcode(self) -> str:
    """The mnemonic without predicate and modifiers (`@!P1 BRA ...` -> BRA)."""
    words = re.sub(r"^@!?U?P\w+\s+", "", self.text).split()
    return words[0].split(".")[0] if words else "?"


def _open(path: str):
  return (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8")


def _int(text: str) -> int:
  text = text.replace(",", "").strip()
  return int(float(text)) if text else 0


def read_sass(path: str) -> list[Line]:
  """The rows of `ncu --page source --csv --print-source sass` (header found by name)."""
  with _open(path) as f:
    rows = list(csv.reader(f))
  for h, row in enumerate(rows):
    if "Source" in row and EXECUTED in row:
      src, ex = row.index("Source"), row.index(EXECUTED)
      sm = row.index(SAMPLES) if SAMPLES in row else None
      break
  else:
    raise ValueError(f"{path}: no header row with 'Source' and '{EXECUTED}'")
  # Per-reason samples: "stall_barrier", ... (not their "(Not Issued)" twins).
  reason_cols = [(j, name[len(STALL_PREFIX):]) for j, name in enumerate(rows[h])
                 if name.startswith(STALL_PREFIX) and not name.endswith("(Not Issued)")]

  def reasons(r):
    return tuple((name, n) for j, name in reason_cols if j < len(r) and (n := _int(r[j])))
  return [Line(i, r[src].strip(), _int(r[ex]), _int(r[sm]) if sm is not None else 0,
               reasons(r))
          for i, r in enumerate(rows[h + 1:]) if len(r) > max(src, ex)]


def stall_reasons(lines: list[Line]) -> list[tuple[str, int, float]]:
  """(reason, samples, share) over the lines' per-reason samples, most first (what a
  warp waited on: "barrier" is a WGMMA wait, "not_selected" an eligible warp another
  warp's issue kept waiting, "long_sb" a GMEM load, ...)."""
  total = collections.Counter()
  for ln in lines:
    for name, n in ln.reasons:
      total[name] += n
  whole = sum(total.values()) or 1
  return [(name, n, n / whole) for name, n in total.most_common()]


def read_details(path: str) -> dict[str, str]:
  """Metric name -> 'value unit' of `ncu --page details --csv` (first occurrence);
  with ncu's workload-imbalance rule on the SMs' active cycles, SM_SPREAD -> '+max%
  / -min%' of the mean (the busiest and idlest SM: a tail the kernel's elapsed
  cycles pay for; ncu states it only past its own threshold)."""
  with open(path, encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  out = {}
  for r in rows:
    name = r.get("Metric Name")
    if name and name not in out:
      out[name] = f"{r.get('Metric Value', '')} {r.get('Metric Unit', '')}".strip()
    found = _IMBALANCE.search(r.get("Rule Description") or "")
    if found and SM_SPREAD not in out:
      out[SM_SPREAD] = f"+{found.group(1)}% / -{found.group(2)}%"
  return out


def opcode_mix(lines: list[Line]) -> list[tuple[str, int, float, float]]:
  """(opcode, executions, share of executions, share of stall samples), most executed first."""
  ex, st = collections.Counter(), collections.Counter()
  for ln in lines:
    ex[ln.opcode] += ln.executed
    st[ln.opcode] += ln.samples
  total_ex, total_st = sum(ex.values()) or 1, sum(st.values()) or 1
  return [(op, n, n / total_ex, st[op] / total_st) for op, n in ex.most_common()]


def loop_count(lines: list[Line]) -> int | None:
  """The execution count most of the tensor-core MMA instructions share (a warp's K steps)."""
  counts = collections.Counter(ln.executed for ln in lines
                               if ln.opcode in MMA_OPCODES and ln.executed)
  return counts.most_common(1)[0][0] if counts else None


WGMMA_WAIT = "WARPGROUP"  # WARPGROUP.DEPBAR: a consumer waiting for its WGMMAs
                         # (WARPGROUP.ARRIVE, its fence before them, is 'rest')


def step_phases(hot: list[Line], cycles_per_step: float) -> dict:
  """{phase: (cycles a step, {stall reason: cycles})} for the phases "wgmma wait",
  "promotion" (FFMA) and "rest" of a consumer's K step, the step's cycles shared in
  proportion to the hot loop's stall samples."""
  scale = cycles_per_step / (sum(ln.samples for ln in hot) or 1)
  out = {}
  for phase in ("wgmma wait", "promotion", "rest"):
    mine = [ln for ln in hot if _phase(ln) == phase]
    reasons = {name: n * scale for name, n, _ in stall_reasons(mine)}
    out[phase] = (sum(ln.samples for ln in mine) * scale, reasons)
  return out


def _phase(ln: Line) -> str:
  if ln.opcode == WGMMA_WAIT and "DEPBAR" in ln.text:
    return "wgmma wait"
  return "promotion" if ln.opcode == "FFMA" else "rest"


def _cycles(details: dict) -> float | None:
  value = details.get("Elapsed Cycles", "").split(" ")[0].replace(",", "")
  return float(value) if value else None


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("sass", help="sass_<shape>.csv(.gz) from tools/ncu_sass.sh")
  p.add_argument("--details", help="details_<shape>.csv from tools/ncu_sass.sh")
  p.add_argument("--top", type=int, default=15)
  p.add_argument("--loop", action="store_true", help="list the hot loop's instructions")
  p.add_argument("--steps", type=int, default=None,
                 help="K steps a CTA runs (with --details: the step's cycles by phase)")
  args = p.parse_args(argv)
  if args.steps is not None and (args.steps < 1 or not args.details):
    p.error("--steps needs a positive count and --details (the elapsed cycles)")
  lines = read_sass(args.sass)
  details = {}
  if args.details:
    details = read_details(args.details)
    print("  ".join(f"{k}: {details[k]}" for k in HEADLINE if k in details))
  total_ex = sum(ln.executed for ln in lines)
  total_st = sum(ln.samples for ln in lines) or 1
  print(f"{len(lines)} SASS lines, {total_ex:,} instructions executed, {total_st:,} stall samples")
  print("\nopcode        executed   share  stall share")
  for op, n, share, stall in opcode_mix(lines)[:args.top]:
    print(f"{op:12s} {n:10,d}  {100 * share:5.1f}%  {100 * stall:5.1f}%")
  print(f"\nmost stall samples (line, executions, samples, share, instruction):")
  for ln in sorted(lines, key=lambda ln: -ln.samples)[:args.top]:
    print(f"{ln.index:5d} {ln.executed:10,d} {ln.samples:6d} {100 * ln.samples / total_st:5.1f}%  "
          f"{ln.text}")
  count = loop_count(lines)
  if count is not None:
    hot = [ln for ln in lines if ln.executed == count]
    mma = sum(ln.opcode in MMA_OPCODES for ln in hot)
    ffma = sum(ln.opcode == "FFMA" for ln in hot)
    print(f"\nhot loop (executed {count:,} times): {len(hot)} instructions, {mma} MMA, "
          f"{ffma} FFMA, {len(hot) - mma - ffma} other; "
          f"{100 * sum(ln.samples for ln in hot) / total_st:.1f}% of stall samples")
    if any(ln.reasons for ln in hot):
      print("  its stall reasons: " + ", ".join(
          f"{name} {100 * share:.1f}%" for name, _, share in stall_reasons(hot)[:args.top]))
    cycles = _cycles(details) if args.steps else None
    if cycles:
      print(f"  a step: {cycles / args.steps:.0f} cycles (elapsed / {args.steps} steps)")
      for phase, (c, reasons) in step_phases(hot, cycles / args.steps).items():
        top = ", ".join(f"{name} {r:.0f}" for name, r in
                        sorted(reasons.items(), key=lambda kv: -kv[1])[:5])
        print(f"    {phase:10s} {c:5.0f} cycles" + (f" ({top})" if top else ""))
    if args.loop:
      for ln in hot:
        if ln.opcode != "FFMA":
          print(f"{ln.index:5d} {ln.samples:6d}  {ln.text}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
