"""tools/kernel_timeline.py: how it reads Mosaic GPU's profiler buffer (CPU, a buffer
written by hand) and, on a Hopper GPU, that a profiled kernel still computes the
contract and records every phase the kernel names."""
import os
import sys

import numpy as np
import pytest
from conftest import requires_gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import kernel_timeline as kt  # noqa: E402

NAMES = {"full_wait": 0, "wgmma": 1, "empty_wait": 2, "produce": 3}
ENTRIES = 3 + 2 * 2 * 8  # header, then up to 8 phases of two (tag, clock) events


def _buffer(traces):
  """One CTA's buffer from [[(name, begin, end), ...] per warpgroup]."""
  buf = np.zeros((1, len(traces), ENTRIES), np.uint32)
  for wg, phases in enumerate(traces):
    events = []
    for name, begin, end in phases:
      events += [NAMES[name], begin % kt.CLOCK, NAMES[name] | kt.EXIT, end % kt.CLOCK]
    buf[0, wg, 2] = len(events)
    buf[0, wg, kt.HEADER:kt.HEADER + len(events)] = events
  return buf.reshape(-1)


# Two consumers, each a step of two chunks, then the producer.
WG0 = [("full_wait", 100, 200), ("wgmma", 250, 600), ("wgmma", 800, 1100),
       ("full_wait", 1300, 1400), ("wgmma", 1450, 1800)]
WG1 = [("full_wait", 150, 260), ("wgmma", 300, 700), ("wgmma", 900, 1200),
       ("full_wait", 1360, 1420), ("wgmma", 1500, 1900)]
PRODUCER = [("empty_wait", 0, 50), ("produce", 60, 90)]


def test_reads_phases_lengths_and_gaps():
  buf = _buffer([WG0, WG1, PRODUCER])
  phases = kt.warpgroup_phases(buf, NAMES, ENTRIES, 3, 0, 0)
  assert [(p.name, p.begin, p.end) for p in phases] == WG0
  assert kt.phase_lengths(phases) == {"full_wait": 100.0, "wgmma": 350.0}
  g = kt.gaps(phases)
  assert g[("full_wait", "wgmma")] == (2, 50.0)
  assert g[("wgmma", "wgmma")] == (1, 200.0)
  assert g[("wgmma", "full_wait")] == (1, 200.0)
  assert kt.step_period(phases) == 1200.0


def test_counts_the_cycles_no_chunk_is_in_flight():
  consumers = [kt.warpgroup_phases(_buffer([WG0, WG1, PRODUCER]), NAMES, ENTRIES, 3, 0, wg)
               for wg in (0, 1)]
  # chunks cover 250-700, 800-1200, 1450-1900: idle 700-800 and 1200-1450
  assert kt.tensor_idle(consumers) == (1650, 350)
  assert kt.tensor_idle([[], []]) == (0, 0)
  lines = kt.report(_buffer([WG0, WG1, PRODUCER]), NAMES, ENTRIES, 3, 0)
  assert lines[-1].startswith("no chunk in flight: 350 of 1650 cycles")


def test_the_clock_may_wrap_and_a_bad_trace_is_refused():
  start = kt.CLOCK - 100  # the 32-bit clock wraps inside the second phase
  wrapped = [("full_wait", start, start + 50), ("wgmma", start + 80, start + 300)]
  phases = kt.warpgroup_phases(_buffer([wrapped, PRODUCER]), NAMES, ENTRIES, 2, 0, 0)
  assert kt.phase_lengths(phases) == {"full_wait": 50.0, "wgmma": 220.0}
  bad = _buffer([[("full_wait", 0, 10)], PRODUCER]).reshape(1, 2, ENTRIES)
  bad[0, 0, kt.HEADER + 2] = NAMES["wgmma"] | kt.EXIT  # closes a phase it never opened
  with pytest.raises(ValueError, match="corrupt"):
    kt.warpgroup_phases(bad.reshape(-1), NAMES, ENTRIES, 2, 0, 0)


def test_shapes_are_checked():
  with pytest.raises(ValueError, match="MxNxK"):
    kt._dims("4096x4096")


@requires_gpu(major=9)
def test_gpu_profiled_kernel(tmp_path, capsys):
  """The traced kernel computes the contract (main's exit status) and every
  consumer and the producer record their phases."""
  assert kt.main(["--shape=512x512x1024", "--config_shape=4096x4096x7168",
                  f"--out={tmp_path}", "--events=64"]) == 0
  out = capsys.readouterr().out
  for phase in ("full_wait", "wgmma", "epilogue", "empty_wait", "produce", "no chunk in flight"):
    assert phase in out
  assert list(tmp_path.glob("trace_*.json")) and list(tmp_path.glob("raw_*.npz"))
