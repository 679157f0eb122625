"""A corrupt or stale autotune cache never breaks a call (issue 19): a file that
is not a JSON object of entries, entries of the wrong form and configs with
unknown, missing or invalid fields are ignored with a warning naming the file,
and the kernel runs with its heuristic config."""
import dataclasses
import json

import jax
import numpy as np
import pytest

import jax_fp8
from jax_fp8 import testing
from jax_fp8.pallas import autotune, hopper, hopper_tiling

BF16 = np.dtype(jax.numpy.bfloat16)


# Every test gets its own empty cache file (conftest.autotune_cache).
pytestmark = pytest.mark.usefixtures("autotune_cache")


@dataclasses.dataclass(frozen=True)
class Cfg:
  tile: int
  depth: int = 2

  def check(self):
    if self.tile <= 0:
      raise ValueError(f"tile must be positive, got {self.tile}")


@pytest.mark.parametrize("content", ["[1, 2]", "3", '"text"', "null", "{not json", "\xff\xfe"])
def test_a_cache_that_is_not_an_object_of_entries_is_ignored(autotune_cache, content):
  autotune_cache.write_bytes(content.encode("latin-1"))
  with pytest.warns(UserWarning, match=f"ignoring autotune cache {autotune_cache}"):
    assert autotune.lookup("key") is None
  # Tuning rewrites it.
  autotune.tune("key", [Cfg(1)], lambda cfg: 1.0)
  assert json.loads(autotune_cache.read_text())["key"]["config"] == {"tile": 1, "depth": 2}


def test_a_cache_path_that_cannot_be_read_is_ignored(autotune_cache):
  autotune_cache.mkdir()  # a directory where the file should be
  with pytest.warns(UserWarning, match="unreadable"):
    assert autotune.lookup("key") is None


def test_entries_of_the_wrong_form_are_ignored_one_by_one(autotune_cache):
  autotune_cache.write_text(json.dumps({
      "number": 5, "no_config": {"ms": 1.0}, "config_list": {"config": [1, 2]},
      "good": {"config": {"tile": 4, "depth": 3}}}))
  with pytest.warns(UserWarning) as record:
    assert autotune.lookup("good", config_type=Cfg) == Cfg(4, 3)
  messages = " ".join(str(w.message) for w in record)
  for key in ("number", "no_config", "config_list"):
    assert f"entry '{key}' in {autotune_cache}" in messages
  for key in ("number", "no_config", "config_list"):
    assert autotune.lookup(key) is None


@pytest.mark.parametrize("config,why", [
    ({"tile": 4, "depth": 3, "removed_field": 1}, r"unknown: \['removed_field'\]"),
    ({"tile": 4}, r"missing: \['depth'\]"),
    ({"tile": -1, "depth": 2}, "tile must be positive"),
    ({"tile": "wide", "depth": 2}, "not supported between|'<=' not supported"),
])
def test_stale_configs_are_ignored_with_a_warning(autotune_cache, config, why):
  autotune_cache.write_text(json.dumps({"key": {"config": config}}))
  with pytest.warns(UserWarning, match=f"entry 'key' in {autotune_cache}: stale or invalid config"):
    assert autotune.lookup("key", config_type=Cfg) is None
  with pytest.warns(UserWarning, match=why):
    autotune.clear_memory()
    autotune.lookup("key", config_type=Cfg)
  # Without a type the fields are returned as they are (the caller checks them).
  assert autotune.lookup("key") == config


def test_each_bad_entry_warns_once(autotune_cache):
  autotune_cache.write_text(json.dumps({"key": {"config": {"tile": 4, "extra": 0}}}))
  with pytest.warns(UserWarning):
    autotune.lookup("key", config_type=Cfg)
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert autotune.lookup("key", config_type=Cfg) is None


def test_a_stale_hopper_entry_does_not_break_the_kernel(autotune_cache):
  """The public API at a shape whose cached config has a field the current
  HopperConfig lacks: a warning, then the heuristic config."""
  m, n, k = 24, 136, 256
  fields = dataclasses.asdict(hopper_tiling.default_config(m, n, k, out_dtype=BF16))
  with testing.gpu_interpret_mode(detect_races=False):
    key = autotune.make_key("pallas_sm90", m, n, k, out_dtype=BF16)
  autotune_cache.write_text(json.dumps({key: {"config": {**fields, "tile_k": 64}}}))
  ops = testing.random_operands(3, m, n, k)
  with pytest.warns(UserWarning, match="stale or invalid config"):
    with testing.gpu_interpret_mode(detect_races=False, uninitialized_memory="nan"):
      out = jax.block_until_ready(jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
          *x, backend="pallas_sm90"))(*ops.args()[:4]))
  testing.assert_close(out, testing.reference_f64(*ops.args()[:4]), BF16)
  assert isinstance(hopper.HopperConfig(**fields), hopper.HopperConfig)
