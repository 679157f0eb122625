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


def test_new_forms_are_those_the_other_rules_never_pick(monkeypatch):
  """--new_since: this checkout's rules against themselves add nothing; against rules
  that pick one other config everywhere, every form is new."""
  import dataclasses
  from jax_fp8.pallas import hopper_tiling
  here = os.path.join(os.path.dirname(__file__), "..", "pallas", "hopper_tiling.py")
  assert interpret_forms.new_forms("required", here) == []

  class Other:
    @staticmethod
    def default_config(m, n, k, **kw):
      return dataclasses.replace(hopper_tiling.default_config(m, n, k, **kw), stages=99)

  import tiling_picks
  monkeypatch.setattr(tiling_picks, "load_revision", lambda rev: Other)
  assert interpret_forms.new_forms("required", "any") == interpret_forms.forms("required")
