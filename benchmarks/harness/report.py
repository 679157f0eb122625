"""Results: one row per (case, contender), the table, ratios to peers, JSON, plot."""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os

PLOT_HINT = ("matplotlib is not installed: pip install '.[plot]' (in the repository) "
             "or pip install matplotlib")


@dataclasses.dataclass
class Row:
  case: str                     # the case's label, e.g. "64x2112x7168"
  dims: dict                    # its dimensions, JSON keys first, e.g. {"m": 64, ...}
  backend: str
  status: str = "ok"            # ok | interpret | unavailable | error | skipped | pending
  reason: str | None = None
  resolved: str | None = None
  ms: float | None = None
  tflops: float | None = None
  rel_err: float | None = None
  check: str | None = None      # ok | FAIL | not checked: why
  bound: float | None = None
  contract: str = "default"
  is_kernel: bool = True
  timing: str | None = None
  input_sets: int | None = None
  kernels: list = dataclasses.field(default_factory=list)
  wall_s: float | None = None   # seconds this row took (compile, timing), for the log
  ratios: dict = dataclasses.field(default_factory=dict)  # peer -> peer_ms / ms
  gbs: float | None = None      # GB/s, where the workload counts bytes
  extra: dict = dataclasses.field(default_factory=dict)   # workload-specific JSON fields


@dataclasses.dataclass(frozen=True)
class Layout:
  """The table's columns."""
  shape_header: str = "shape MxNxK"
  min_widths: tuple = (16, 22, 9, 8)
  gbs: bool = False             # a GB/s column
  rel_err: bool = True          # a rel_err column (off when nothing is checked)


def compute_ratios(rows, peers):
  """ratio = peer ms / row ms: > 1 means faster than that peer."""
  by_case = collections.defaultdict(dict)
  for r in rows:
    if r.ms is not None:
      by_case[r.case][r.backend] = r.ms
  for r in rows:
    if r.ms is None:
      continue
    for p in peers:
      pm = by_case[r.case].get(p)
      if pm is not None:
        r.ratios[p] = pm / r.ms


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def _rate(x):
  return None if x is None else (f"{x:.1f}" if x >= 10 else f"{x:.4f}")


def header(peers, layout: Layout) -> list:
  return (["shape MxNxK" if layout.shape_header is None else layout.shape_header, "backend",
           "ms", "TFLOP/s"] + (["GB/s"] if layout.gbs else [])
          + [f"vs_{p}" for p in peers] + (["rel_err"] if layout.rel_err else []))


def _cells(row: Row, peers, layout: Layout, default_contract) -> list:
  name = row.backend if row.resolved in (None, row.backend) else f"{row.backend}={row.resolved}"
  if row.status in ("unavailable", "error", "skipped"):
    return [row.case, name, f"{row.status}: {row.reason}"]
  if row.status == "pending":
    return [row.case, name, "pending"]
  cells = [row.case, name, _fmt(row.ms, ".4f"), _rate(row.tflops) or "-"]
  if layout.gbs:
    cells.append(_rate(row.gbs) or "-")
  cells += [_fmt(row.ratios.get(p), ".2f") for p in peers]
  if layout.rel_err:
    err = "-" if row.rel_err is None else f"{row.rel_err:.2e}"
    if row.check and row.check != "ok":
      err += f" {row.check}"
    if row.contract != default_contract:
      err += f" (vs {row.contract})"
    cells.append(err)
  if row.status == "interpret":
    cells.append("interpret mode: correctness only")
  return cells


def format_table(rows, peers, layout: Layout = Layout(), contracts=None,
                 with_header=True) -> str:
  """contracts: case label -> the case's contract; a row checked against another one
  says so in its rel_err column."""
  head = header(peers, layout)
  contracts = contracts or {}
  body = [_cells(r, peers, layout, contracts.get(r.case, r.contract)) for r in rows]
  mins = layout.min_widths
  widths = [max(len(h), mins[i] if i < len(mins) else 0) for i, h in enumerate(head)]
  for cells in body:
    if len(cells) < len(head):  # "unavailable: why" runs on past the columns
      continue
    for i, c in enumerate(cells[:len(head)]):
      widths[i] = max(widths[i], len(c))
  line = lambda cells: "  ".join(  # noqa: E731
      c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(cells)).rstrip()
  lines = [line(c) for c in body]
  if with_header:
    lines = [line(head), line(["-" * w for w in widths])] + lines
  return "\n".join(lines)


def row_json(r: Row) -> dict:
  d = dict(r.dims)
  fields = dataclasses.asdict(r)
  for key in ("case", "dims", "gbs", "extra"):
    fields.pop(key)
  d.update(fields)
  for key in ("rel_err", "ms", "tflops"):
    if d[key] is not None and not math.isfinite(d[key]):
      d[key] = None if key != "rel_err" else "nan"
  d["shape"] = r.case
  if r.gbs is not None:
    d["gbs"] = r.gbs
  d.update(r.extra)
  return d


def write_json(path: str, data: dict):
  """Written whole or not at all (a run cut short keeps the previous version)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=1)
  os.replace(tmp, path)


def matplotlib_missing() -> bool:
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    return True
  return False


def plot(rows, path, title, log=print) -> bool:
  """A bar chart of TFLOP/s per case and contender; False (and why, logged) if none."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    log(f"WARNING: --plot_out={path} not written: {PLOT_HINT}")
    return False
  timed = [r for r in rows if r.tflops]
  if not timed:
    log(f"WARNING: --plot_out={path} not written: nothing was timed")
    return False
  cases = list(dict.fromkeys(r.case for r in timed))
  names = list(dict.fromkeys(r.backend for r in timed))
  val = {(r.case, r.backend): r.tflops for r in timed}
  width = 0.8 / len(names)
  fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(cases) * max(1, len(names) / 3)), 5))
  for i, name in enumerate(names):
    xs = [j + i * width for j in range(len(cases))]
    ax.bar(xs, [val.get((s, name), 0.0) for s in cases], width, label=name)
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
  ax.set_xticklabels(cases, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("TFLOP/s")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  log(f"wrote {path}")
  return True
