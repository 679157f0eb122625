"""A DeepSeek-V3 dense MLP forward, bf16 against FP8: y = (silu(x Wg) * (x Wu)) Wd.

x [T, 7168] bf16; gate and up weights side by side, 7168 -> 2 x 18432; down
18432 -> 7168. Weights are quantised once, outside the timed call (as a model
does at load time); activations are quantised inside it. TFLOP/s counts the
GEMMs, 6 * T * H * F.

The fused path (issue 22, items 2-3) is a hook: jax_fp8.blockwise_fp8_glu(a,
a_scale, b, b_scale, activation="silu", out_dtype=...) with b = [gate; up] stacked
as [2F, H] (GLU_ORDER; gate rows first), and its FP8 output (out_dtype e4m3 ->
(q, scale), the next GEMM's 1x128 operand). Each is reported unavailable while
jax_fp8 lacks it.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_fp8
from harness import checks
from harness import report
from harness import runner
from harness.registry import Contender, Registry
from workloads import common

HIDDEN, FFN = 7168, 18432
TOKENS = (64, 128, 1024, 4096, 16384)
SMALL = ((64, 256, 384), (200, 256, 384))   # (tokens, hidden, ffn) for the CPU smoke test
# Must match jax_fp8.blockwise_fp8_glu's documented order of b's rows; a mismatch
# shows as a failed check of the fused contenders.
GLU_ORDER = ("gate", "up")
# FP8 rounding of every GEMM operand against the exact math: ~4e-2 per layer (README);
# the bound only catches garbage.
FP8_BOUND = 0.15


@dataclasses.dataclass(frozen=True)
class Shape:
  tokens: int
  hidden: int
  ffn: int


def case(tokens, hidden, ffn) -> runner.Case:
  s = Shape(tokens, hidden, ffn)
  size = 2 * (2 * tokens * hidden + 3 * hidden * ffn)  # x, y, weights in bf16
  return runner.Case(f"mlp {tokens}x{hidden}-{ffn}",
                     {"tokens": tokens, "hidden": hidden, "ffn": ffn},
                     flops=6.0 * tokens * hidden * ffn, set_bytes=size, contract="mlp", params=s)


def cases(presets) -> list[runner.Case]:
  out = []
  for preset in presets:
    shapes = [(t, HIDDEN, FFN) for t in TOKENS] if preset == "deepseek_v3" else list(SMALL)
    out += [case(*s) for s in shapes]
  return out


@dataclasses.dataclass
class InputSet:
  x: jax.Array        # [T, H] bf16
  w_gate_up: jax.Array  # [H, 2F] bf16: gate columns, then up columns
  w_down: jax.Array   # [F, H] bf16


@functools.partial(jax.jit, static_argnums=(1,))
def _make_set(key, s: Shape):
  kx, kg, kd = jax.random.split(key, 3)
  x = jax.random.normal(kx, (s.tokens, s.hidden), jnp.float32)
  wgu = jax.random.normal(kg, (s.hidden, 2 * s.ffn), jnp.float32) / np.sqrt(s.hidden)
  wd = jax.random.normal(kd, (s.ffn, s.hidden), jnp.float32) / np.sqrt(s.ffn)
  return tuple(v.astype(jnp.bfloat16) for v in (x, wgu, wd))


def make_sets(case_, count, seed):
  s: Shape = case_.params
  base = common.case_key(seed, s.tokens, s.hidden, s.ffn)
  return [InputSet(*_make_set(jax.random.fold_in(base, i), s)) for i in range(count)]


@jax.jit
def _quantised_weights(w_gate_up, w_down):
  """The weights as jax_fp8 takes them: [N, K] e4m3 with 128x128 scales."""
  return (*jax_fp8.quantize_128x128(w_gate_up.T), *jax_fp8.quantize_128x128(w_down.T))


def _fp8_prepare(s: InputSet):
  return (s.x, *_quantised_weights(s.w_gate_up, s.w_down))


def _gated(h, ffn):
  """silu(gate) * up from the [T, 2F] gate/up product, in float32."""
  h = h.astype(jnp.float32)
  return jax.nn.silu(h[:, :ffn]) * h[:, ffn:]


# ---- contenders ---------------------------------------------------------------------

REGISTRY = Registry()


@REGISTRY.add("bf16", "the MLP in bf16 (XLA's GEMMs)")
def _bf16(case_, opts, env) -> Contender:
  ffn = case_.params.ffn

  def fn(x, wgu, wd):
    return _gated(x @ wgu, ffn).astype(jnp.bfloat16) @ wd
  return Contender(fn, lambda s: (s.x, s.w_gate_up, s.w_down))


@REGISTRY.add("jax_fp8", "per GEMM: quantize_1x128 of the activations + blockwise_fp8_dot "
              "(backend auto); the gate/up output goes through HBM in bf16", role="backend")
def _jax_fp8(case_, opts, env) -> Contender:
  ffn = case_.params.ffn

  def fn(x, qgu, sgu, qd, sd):
    h = jax_fp8.blockwise_fp8_dot(*jax_fp8.quantize_1x128(x), qgu, sgu)
    act = _gated(h, ffn)
    return jax_fp8.blockwise_fp8_dot(*jax_fp8.quantize_1x128(act), qd, sd)
  return Contender(fn, _fp8_prepare, bound=FP8_BOUND)


@REGISTRY.add("jax_fp8_glu", "gate/up in one fused kernel (jax_fp8.blockwise_fp8_glu, bf16 "
              "out), then quantize_1x128 + blockwise_fp8_dot", role="backend")
def _jax_fp8_glu(case_, opts, env) -> Contender:
  glu = common.api("blockwise_fp8_glu", "issue 22, item 3")

  def fn(x, qgu, sgu, qd, sd):
    act = glu(*jax_fp8.quantize_1x128(x), qgu, sgu, activation="silu", out_dtype=jnp.bfloat16)
    return jax_fp8.blockwise_fp8_dot(*jax_fp8.quantize_1x128(act), qd, sd)
  return Contender(fn, _fp8_prepare, bound=FP8_BOUND)


@REGISTRY.add("jax_fp8_glu_fp8", "fused gate/up with an FP8 output epilogue (out_dtype e4m3 -> "
              "(q, scale)), then blockwise_fp8_dot: no bf16 round trip", role="backend")
def _jax_fp8_glu_fp8(case_, opts, env) -> Contender:
  glu = common.api("blockwise_fp8_glu", "issue 22, items 2-3")

  def fn(x, qgu, sgu, qd, sd):
    qa, sa = glu(*jax_fp8.quantize_1x128(x), qgu, sgu, activation="silu",
                 out_dtype=jnp.float8_e4m3fn)
    return jax_fp8.blockwise_fp8_dot(qa, sa, qd, sd)
  return Contender(fn, _fp8_prepare, bound=FP8_BOUND)


def default_backends(env) -> list[str]:
  return list(REGISTRY.all())


def reference(contract, s: InputSet, case_):
  """The MLP of the bf16 inputs in float64 on the device (call under jax.enable_x64)."""
  del contract
  x, wgu, wd = (v.astype(jnp.float64) for v in (s.x, s.w_gate_up, s.w_down))
  h = x @ wgu
  f = case_.params.ffn
  return (jax.nn.silu(h[:, :f]) * h[:, f:]) @ wd


def intro(opts, env) -> list[str]:
  return ["measured: one forward of the gated MLP y = (silu(x Wg) * (x Wu)) Wd (weights "
          "quantised beforehand, activations inside the call); TFLOP/s counts its GEMMs, "
          "6*T*H*F; rel_err against the exact float64 MLP of the bf16 inputs (FP8 rounding, "
          "~4e-2, is expected)"]


def workload(opts) -> runner.Workload:
  return runner.Workload(
      name="mlp", registry=REGISTRY, make_sets=make_sets,
      references=lambda: checks.DeviceReferences(reference), title="DeepSeek-V3 MLP forward",
      layout=report.Layout("case", (20, 22, 9, 8)), ratio_peers=("bf16",), intro=intro)
