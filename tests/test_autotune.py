"""Autotuning (pallas/autotune.py): the fastest correct config per (kernel,
device, shape), cached on disk and used by the kernel without being told.

On the CPU the Hopper kernel's candidates run in GPU interpret mode (with race
detection): their times mean nothing there, but the choice, the correctness
gate, the cache and its use at lowering time are the same code as on a GPU.
"""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_fp8
from conftest import requires_gpu
from jax_fp8 import testing
from jax_fp8.pallas import autotune, hopper, hopper_tiling

BF16 = np.dtype(jnp.bfloat16)
# Two small candidates that differ in tiling; 2 CTAs each walk several tiles.
CANDIDATES = [
    hopper.HopperConfig(tile_m=64, tile_n=128, wg_split="n", stages=2, num_sms=2),
    hopper.HopperConfig(tile_m=128, tile_n=128, wg_split="m", stages=2, num_sms=2),
]


@dataclasses.dataclass(frozen=True)
class Cfg:
  tile: int


# Every test gets its own empty cache file (conftest.autotune_cache).
pytestmark = pytest.mark.usefixtures("autotune_cache")


def test_tune_keeps_the_fastest_and_skips_failures(autotune_cache):
  times = {1: 3.0, 2: 1.0, 3: 0.5, 4: 2.0}

  def time_config(cfg):
    if cfg.tile == 3:  # the fastest "runs" but fails (e.g. wrong output): never chosen
      raise ValueError("relative error 1.0e+00 > 4.0e-03")
    return times[cfg.tile]

  key = autotune.make_key("k", 10, 20, 30, out_dtype=BF16, device="dev")
  best = autotune.tune(key, [Cfg(t) for t in (1, 2, 3, 4)], time_config)
  assert best == Cfg(2)
  entry = json.loads(autotune_cache.read_text())[key]
  assert entry["config"] == {"tile": 2} and entry["ms"] == 1.0 and entry["failed"] == 1
  assert autotune.lookup(key) == {"tile": 2}
  autotune.clear_memory()  # a new process reads the file
  assert autotune.lookup(key) == {"tile": 2}
  assert autotune.lookup(autotune.make_key("k", 10, 20, 31, out_dtype=BF16, device="dev")) is None


def test_tune_raises_when_every_candidate_fails():
  def broken(cfg):
    raise RuntimeError("out of registers")
  with pytest.raises(RuntimeError, match="every candidate config failed"):
    autotune.tune("key", [Cfg(1), Cfg(2)], broken)
  assert autotune.lookup("key") is None


def test_corrupt_cache_is_ignored(autotune_cache):
  autotune_cache.write_text("{not json")
  with pytest.warns(UserWarning, match="ignoring autotune cache"):
    assert autotune.lookup("anything") is None
  autotune.tune("key", [Cfg(1)], lambda cfg: 1.0)
  assert json.loads(autotune_cache.read_text())["key"]["config"] == {"tile": 1}


def test_check_rejects_wrong_output():
  x = jnp.ones((4, 4), jnp.float32)

  def check(out):
    if not bool(jnp.all(out == 2 * x)):
      raise ValueError("wrong")
  assert autotune.kernel_time_ms(lambda v: 2 * v, [x], iters=2, check=check) >= 0
  with pytest.raises(ValueError, match="wrong"):
    autotune.kernel_time_ms(lambda v: 3 * v, [x], iters=2, check=check)


def test_timed_calls_rotate_through_operand_copies_past_the_l2():
  """On a GPU every timed call reads the next copy of the operands (fresh
  buffers covering ROTATE_BYTES), so that none finds them in the L2."""
  x = jnp.arange(1 << 20, dtype=jnp.float32)  # 4 MiB
  sets = autotune.operand_sets([x, None], rotate_bytes=10 << 20)
  assert len(sets) == 3 and all(len(s) == 2 and s[1] is None for s in sets)
  assert len({s[0].unsafe_buffer_pointer() for s in sets}) == 3  # new buffers
  assert all(np.array_equal(s[0], x) for s in sets)
  assert len(autotune.operand_sets([x], rotate_bytes=1 << 40)) == autotune.MAX_OPERAND_SETS
  seen = []
  rotating = autotune._Rotating(lambda v, _: seen.append(v) or v, sets)
  assert isinstance(rotating, jax.stages.Wrapped)  # profiler.measure calls it as it is
  for _ in range(4):
    rotating()
  assert [v is s[0] for v, s in zip(seen, sets + sets[:1])] == [True] * 4


def test_hopper_candidates_are_buildable():
  for m, n, k in [(64, 2112, 7168), (4096, 7168, 2048), (200, 7000, 1000)]:
    for out_dtype in (jnp.bfloat16, jnp.float32):
      cands = hopper_tiling.candidate_configs(m, n, k, out_dtype=out_dtype)
      assert cands[0] == hopper_tiling.default_config(m, n, k, out_dtype=out_dtype)
      assert len(cands) == len(set(cands)) >= 3
      for cfg in cands:
        cfg.check()
        assert cfg.smem_bytes(out_dtype) <= hopper_tiling.SMEM_BYTES
        assert m > 64 or cfg.tile_m == 64  # decode never wastes a 128-row tile


def test_hopper_tune_then_public_api_uses_cache(monkeypatch):
  m, n, k = 70, 200, 300
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    best = hopper_tiling.tune(m, n, k, candidates=CANDIDATES, iters=1)
    # Interpret-mode timings are cached under their own device name, also where a GPU exists.
    key = autotune.make_key("pallas_sm90", m, n, k, out_dtype=BF16)
  assert "interpret" in key
  assert best in CANDIDATES
  assert hopper.HopperConfig(**autotune.lookup(key)) == best

  # The public entry point now lowers with the cached config, not the heuristic.
  def no_heuristic(*args, **kwargs):
    raise AssertionError("the heuristic was consulted although the shape is tuned")
  monkeypatch.setattr(hopper_tiling, "default_config", no_heuristic)
  ops = testing.random_operands(5, m, n, k)
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    out = jax.block_until_ready(jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
        *x, backend="pallas_sm90"))(*ops.args()[:4]))
  testing.assert_close(out, testing.reference_f64(*ops.args()[:4]), BF16)


def test_env_tunes_on_a_cache_miss_inside_jit(monkeypatch, autotune_cache):
  monkeypatch.setenv("JAX_FP8_AUTOTUNE", "1")
  monkeypatch.setattr(hopper_tiling, "candidate_configs", lambda *a, **kw: list(CANDIDATES))
  m, n, k = 24, 136, 256
  ops = testing.random_operands(6, m, n, k, with_c=True)
  with testing.gpu_interpret_mode(detect_races=True, uninitialized_memory="nan"):
    out = jax.block_until_ready(jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(
        *x, beta=0.5, out_dtype=jnp.float32, backend="pallas_sm90"))(*ops.args()))
    key = autotune.make_key("pallas_sm90", m, n, k, out_dtype=jnp.float32, c_dtype=jnp.float32)
  testing.assert_close(out, testing.reference_f64(*ops.args(), beta=0.5), jnp.float32)
  entry = json.loads(autotune_cache.read_text())[key]
  assert hopper.HopperConfig(**entry["config"]) in CANDIDATES
  assert len(entry["candidates"]) == 2 and entry["failed"] == 0


@requires_gpu(major=9)
def test_gpu_tune_deepseek_shape(autotune_cache):
  """Every candidate at 128x2112x7168 on the GPU: each is checked against the
  float32 reference before it is timed, and the winner is cached for this GPU."""
  m, n, k = 128, 2112, 7168
  best = hopper_tiling.tune(m, n, k, iters=10)
  entry = json.loads(autotune_cache.read_text())[
      autotune.make_key("pallas_sm90", m, n, k, out_dtype=BF16)]
  for c in sorted(entry["candidates"], key=lambda c: c["ms"]):
    cfg = c["config"]
    print(f"{c['ms'] * 1e3:8.1f} us  {2 * m * n * k / c['ms'] / 1e9:7.1f} TFLOP/s  "
          f"{cfg['tile_m']}x{cfg['tile_n']} split={cfg['wg_split']} minor={cfg['grid_minor']} "
          f"cluster_m={cfg['cluster_m']} stages={cfg['stages']}")
  assert entry["failed"] == 0, entry
  assert entry["ms"] == min(c["ms"] for c in entry["candidates"])
  assert dataclasses.asdict(best) == entry["config"]


@requires_gpu(major=9)
def test_gpu_env_tunes_during_lowering(monkeypatch, autotune_cache):
  """JAX_FP8_AUTOTUNE=1: the cache miss is tuned inside the primitive's CUDA lowering."""
  monkeypatch.setenv("JAX_FP8_AUTOTUNE", "1")
  real = hopper_tiling.candidate_configs
  monkeypatch.setattr(hopper_tiling, "candidate_configs", lambda *a, **kw: real(*a, **kw)[:3])
  m, n, k = 300, 2112, 1024
  ops = testing.random_operands(8, m, n, k)
  out = jax.jit(lambda *x: jax_fp8.blockwise_fp8_dot(*x, backend="pallas_sm90"))(*ops.args()[:4])
  testing.assert_close(out, testing.reference_f64(*ops.args()[:4]), BF16)
  entry = json.loads(autotune_cache.read_text())[
      autotune.make_key("pallas_sm90", m, n, k, out_dtype=BF16)]
  assert len(entry["candidates"]) == 3 and entry["failed"] == 0
