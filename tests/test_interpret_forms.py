"""tools/interpret_forms.py: every form the Hopper rules pick, in GPU interpret mode."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import interpret_forms  # noqa: E402


def test_forms_cover_every_kind_once():
  items = interpret_forms.forms("required")
  kinds = {key[0] for key, _ in items}
  assert kinds == {"dense", "per-row", "ragged", "masked"}
  assert len({key for key, _ in items}) == len(items)


def test_a_form_runs_against_its_reference(capsys):
  assert interpret_forms.main(["--shapes=required", "--forms=0:1"]) == 0
  assert ": ok" in capsys.readouterr().out


def test_a_failing_form_fails_the_run(monkeypatch, capsys):
  def broken(*args):
    raise AssertionError("relative error 1.0")
  monkeypatch.setattr(interpret_forms, "run_form", broken)
  assert interpret_forms.main(["--shapes=required", "--forms=0:1"]) == 1
  assert "FAIL relative error 1.0" in capsys.readouterr().out
