"""tools/sass_summary.py (the profile summary of tools/ncu_sass.sh) on small synthetic exports."""
import gzip
import importlib.util
import pathlib
import sys

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "tools" / "sass_summary.py"
_spec = importlib.util.spec_from_file_location("sass_summary", _PATH)
sass_summary = importlib.util.module_from_spec(_spec)
sys.modules["sass_summary"] = sass_summary  # dataclasses look their module up there
_spec.loader.exec_module(sass_summary)

# The shape of `ncu --page source --csv --print-source sass`: a kernel-name row, then
# the header, then one row per SASS instruction (counts with thousands separators).
_SASS = '''"Kernel Name","anonymous_mosaic_gpu_kernel",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","# Samples","Instructions Executed"
"0x00","      LDC R1, c[0x0][0x28]","3","3","3","1,584"
"0x10","      SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR9], R4","5","5","5","157,696"
"0x20","      @!P1  BRA 0x7f8f2d7bf130","433","433","433","157,696"
"0x30","      QGMMA.64x192x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT","68","68","68","157,696"
"0x40","      QGMMA.64x192x32.F32.E4M3.E4M3 R24, gdesc[UR16], R24, gsb0","119","119","119","157,696"
"0x50","      WARPGROUP.DEPBAR.LE gsb0, 0x0","2,059","2,059","2,059","157,696"
"0x60","      FFMA R30, R24, R220, R30","12","12","12","157,696"
"0x70","      FFMA R31, R25, R220, R31","10","10","10","157,696"
"0x80","      QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT","1","1","1","2,816"
"0x90","      EXIT","0","0","0","1,584"
'''

_DETAILS = '''"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"
"0","k","GPU Speed Of Light Throughput","Elapsed Cycles","cycle","183,947"
"0","k","GPU Speed Of Light Throughput","Duration","us","109.38"
"0","k","Launch Statistics","Registers Per Thread","register/thread","168"
'''


@pytest.fixture
def sass_file(tmp_path):
  path = tmp_path / "sass.csv.gz"
  with gzip.open(path, "wt") as f:
    f.write(_SASS)
  return str(path)


def test_reads_every_instruction_with_its_counts(sass_file):
  lines = sass_summary.read_sass(sass_file)
  assert len(lines) == 10
  assert lines[5].text == "WARPGROUP.DEPBAR.LE gsb0, 0x0"
  assert (lines[5].executed, lines[5].samples) == (157696, 2059)


def test_opcodes_drop_predicates_and_modifiers(sass_file):
  ops = [ln.opcode for ln in sass_summary.read_sass(sass_file)]
  assert ops == ["LDC", "SYNCS", "BRA", "QGMMA", "QGMMA", "WARPGROUP", "FFMA", "FFMA", "QGMMA",
                 "EXIT"]


def test_hot_loop_is_the_count_most_mmas_share(sass_file):
  lines = sass_summary.read_sass(sass_file)
  assert sass_summary.loop_count(lines) == 157696  # not the epilogue MMA's 2,816


def test_opcode_mix_shares(sass_file):
  mix = {op: (n, share, stall) for op, n, share, stall in
         sass_summary.opcode_mix(sass_summary.read_sass(sass_file))}
  total = 2 * 1584 + 7 * 157696 + 2816
  assert mix["FFMA"][0] == 2 * 157696
  assert mix["FFMA"][1] == pytest.approx(2 * 157696 / total)
  assert mix["WARPGROUP"][2] == pytest.approx(2059 / (3 + 5 + 433 + 68 + 119 + 2059 + 22 + 1))


def test_details_and_main(sass_file, tmp_path, capsys):
  details = tmp_path / "details.csv"
  details.write_text(_DETAILS)
  assert sass_summary.read_details(str(details))["Elapsed Cycles"] == "183,947 cycle"
  assert sass_summary.main([sass_file, f"--details={details}", "--loop"]) == 0
  out = capsys.readouterr().out
  assert "Elapsed Cycles: 183,947 cycle" in out
  assert "hot loop (executed 157,696 times): 7 instructions, 2 MMA, 2 FFMA, 3 other" in out


def test_details_report_the_sms_spread(tmp_path, capsys):
  """ncu's workload-imbalance rule on the SMs (not its SMSP twin) becomes a headline
  entry; without the rule there is none."""
  rule = ('"0","k","WorkloadDistribution","","","","WorkloadImbalance","OPT","One or more {} '
          'have a much lower number of active cycles than the average number of active '
          'cycles. Maximum instance value is {}% above the average, while the minimum '
          'instance value is {}% below the average."\n')
  header = ('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value",'
            '"Rule Name","Rule Type","Rule Description"\n')
  details = tmp_path / "details.csv"
  details.write_text(header + rule.format("SMs", "9.85", "23.14")
                     + rule.format("SMSPs", "8.78", "22.94"))
  got = sass_summary.read_details(str(details))
  assert got[sass_summary.SM_SPREAD] == "+9.85% / -23.14%"
  details.write_text(_DETAILS)
  assert sass_summary.SM_SPREAD not in sass_summary.read_details(str(details))


def test_rejects_a_file_without_the_header(tmp_path):
  path = tmp_path / "bad.csv"
  path.write_text('"a","b"\n"1","2"\n')
  with pytest.raises(ValueError, match="no header row"):
    sass_summary.read_sass(str(path))


# An export with per-reason columns (ncu writes every stall_* twice: all samples and
# "(Not Issued)"); only the first set counts.
_SASS_REASONS = '''"Kernel Name","k",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier","stall_not_selected","stall_barrier (Not Issued)"
"0x00","      QGMMA.64x160x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT","4","448","0","4","0"
"0x10","      WARPGROUP.DEPBAR.LE gsb0, 0x0","30","448","30","0","30"
"0x20","      FFMA R30, R24, R220, R30","6","448","0","6","0"
"0x30","      EXIT","1","1","0","1","0"
'''


def test_hot_loop_stall_reasons(tmp_path, capsys):
  path = tmp_path / "reasons.csv"
  path.write_text(_SASS_REASONS)
  lines = sass_summary.read_sass(str(path))
  assert lines[1].reasons == (("barrier", 30),)
  hot = [ln for ln in lines if ln.executed == 448]
  assert sass_summary.stall_reasons(hot) == [("barrier", 30, 0.75), ("not_selected", 10, 0.25)]
  assert sass_summary.main([str(path)]) == 0
  assert "its stall reasons: barrier 75.0%, not_selected 25.0%" in capsys.readouterr().out


def test_step_phases_share_the_step_by_samples(tmp_path, capsys):
  path = tmp_path / "reasons.csv"
  path.write_text(_SASS_REASONS)
  hot = [ln for ln in sass_summary.read_sass(str(path)) if ln.executed == 448]
  phases = sass_summary.step_phases(hot, 800.0)
  # 40 samples: the wait 30 (600 cycles), the FFMA 6 (120), the QGMMA 4 (80)
  assert phases["wgmma wait"] == (pytest.approx(600.0), {"barrier": pytest.approx(600.0)})
  assert phases["promotion"] == (pytest.approx(120.0), {"not_selected": pytest.approx(120.0)})
  assert phases["rest"][0] == pytest.approx(80.0)
  details = tmp_path / "details.csv"
  details.write_text(_DETAILS)  # 183,947 elapsed cycles
  assert sass_summary.main([str(path), f"--details={details}", "--steps=100"]) == 0
  out = capsys.readouterr().out
  assert "a step: 1839 cycles (elapsed / 100 steps)" in out
  assert "wgmma wait  1380 cycles (barrier 1380)" in out
  with pytest.raises(SystemExit):
    sass_summary.main([str(path), "--steps=100"])  # no --details
