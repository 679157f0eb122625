"""tools/kernel_jaxprs.py (same-kernel check for refactors): one case traced twice is the
same; a changed file is reported and fails."""
import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parent.parent / "tools" / "kernel_jaxprs.py"
_spec = importlib.util.spec_from_file_location("kernel_jaxprs", _PATH)
kernel_jaxprs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernel_jaxprs)

CASE = "dense_64x2112x7168"


def test_same_code_traces_the_same_kernel(tmp_path, capsys):
  before, after = tmp_path / "before", tmp_path / "after"
  assert kernel_jaxprs.main([f"--out={before}", f"--cases={CASE}"]) == 0
  text = (before / f"{CASE}.jaxpr").read_text()
  assert "wgmma" in text and "barrier_wait" in text  # the kernel body, not just a call
  assert kernel_jaxprs.main([f"--out={after}", f"--compare={before}", f"--cases={CASE}"]) == 0
  assert "same" in capsys.readouterr().out


def test_a_changed_kernel_fails(tmp_path, capsys):
  before, after = tmp_path / "before", tmp_path / "after"
  before.mkdir()
  (before / f"{CASE}.jaxpr").write_text("another kernel")
  assert kernel_jaxprs.main([f"--out={after}", f"--compare={before}", f"--cases={CASE}"]) == 1
  assert "DIFFERS" in capsys.readouterr().out
