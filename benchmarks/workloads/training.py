"""Training one layer in FP8: forward + backward of jax_fp8.dense against bf16, and its wgrad GEMM.

Step cases ("step TxK->N"): value_and_grad of loss = sum(y * g), y = x @ kernel,
with respect to x [T, K] and kernel [K, N] (bf16; g [T, N] a fixed random
upstream gradient, so dy = g). jax_fp8.dense quantises inside the step (x 1x128
along K, kernel 128x128; dy 1x128 for dgrad; x and dy 1x128 along the tokens for
wgrad); bf16 is `x @ kernel` with its jax.grad. The time is the sum of every
kernel of one step; TFLOP/s counts the three GEMMs, 6 * T * K * N.

wgrad cases ("wgrad MxNxK"): the weight-gradient GEMM alone, dkernel [K, N] =
x^T dy in the NT form a = x^T [K, T], b = dy^T [N, T], both with per-row 1x128
scales along the tokens ("1D1D"), float32 out: blockwise_fp8_dot(...,
b_scale_block=(1, 128)); with c (accumulating into a float32 gradient, as
DeepGEMM's Hopper 1D1D kernel always does) as jax_fp8_acc.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_fp8
from jax_fp8 import backends
from jax_fp8 import testing
from harness import checks
from harness import report
from harness import runner
from harness.registry import Contender, Registry, Unavailable
from workloads import common
from workloads import deepgemm

F32 = np.dtype(jnp.float32)
LAYERS = ((7168, 18432), (18432, 7168))   # DeepSeek-V3 MLP: K -> N
TOKENS = (4096, 16384)
SMALL = ((256, 256, 384),)                 # (tokens, K, N) for the CPU smoke test
# jax_fp8.dense against the exact (unquantised) math: FP8 rounding of both operands of
# each GEMM gives ~4e-2 (README); the bound only catches garbage.
FP8_RECIPE_BOUND = 0.15
GPU_F32_BOUND = 2.5e-4  # FP8 WGMMA's ~14-bit accumulation within a K block


@dataclasses.dataclass(frozen=True)
class Shape:
  kind: str     # "step" | "wgrad"
  tokens: int
  k: int        # the layer's input features
  n: int        # its output features


def step_case(tokens, k, n) -> runner.Case:
  s = Shape("step", tokens, k, n)
  io = 2 * (2 * tokens * k + 2 * k * n + 2 * tokens * n)  # x, kernel, g, dx, dkernel (bf16)
  return runner.Case(f"step {tokens}x{k}->{n}", {"kind": "step", "tokens": tokens, "k": k,
                                                 "n": n},
                     flops=6.0 * tokens * k * n, set_bytes=io, contract="grads", params=s)


def wgrad_case(tokens, k, n) -> runner.Case:
  s = Shape("wgrad", tokens, k, n)
  tb = common.blocks(tokens)
  size = (k + n) * (tokens + 4 * tb) + 4 * k * n
  return runner.Case(f"wgrad {k}x{n}x{tokens}", {"kind": "wgrad", "m": k, "n": n, "k": tokens},
                     flops=2.0 * k * n * tokens, set_bytes=size, contract="1d1d", params=s)


def cases(presets) -> list[runner.Case]:
  out = []
  for preset in presets:
    shapes = ([(t, k, n) for t in TOKENS for k, n in LAYERS] if preset == "deepseek_v3"
              else list(SMALL))
    out += [step_case(*s) for s in shapes] + [wgrad_case(*s) for s in shapes]
  return out


# ---- input sets ---------------------------------------------------------------------

@dataclasses.dataclass
class StepSet:
  x: jax.Array        # [T, K] bf16
  kernel: jax.Array   # [K, N] bf16
  g: jax.Array        # [T, N] bf16, the upstream gradient


@dataclasses.dataclass
class WgradSet:
  a: jax.Array        # [K, T] e4m3 (x^T)
  a_scale: jax.Array  # [K, ceil(T/128)] f32
  b: jax.Array        # [N, T] e4m3 (dy^T)
  b_scale: jax.Array  # [N, ceil(T/128)] f32


@functools.partial(jax.jit, static_argnums=(1,))
def _make_step(key, s: Shape):
  kx, kw, kg = jax.random.split(key, 3)
  x = jax.random.normal(kx, (s.tokens, s.k), jnp.float32)
  w = jax.random.normal(kw, (s.k, s.n), jnp.float32) / np.sqrt(s.k)
  g = jax.random.normal(kg, (s.tokens, s.n), jnp.float32)
  return x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), g.astype(jnp.bfloat16)


@functools.partial(jax.jit, static_argnums=(1,))
def _make_wgrad(key, s: Shape):
  ka, kb_, ksa, ksb = jax.random.split(key, 4)
  tb = common.blocks(s.tokens)
  return (common.random_fp8(ka, (s.k, s.tokens)), common.random_scales(ksa, (s.k, tb)),
          common.random_fp8(kb_, (s.n, s.tokens)), common.random_scales(ksb, (s.n, tb)))


def make_sets(case, count, seed):
  s: Shape = case.params
  base = common.case_key(seed, len(s.kind), s.tokens, s.k, s.n)
  make, cls = (_make_step, StepSet) if s.kind == "step" else (_make_wgrad, WgradSet)
  return [cls(*make(jax.random.fold_in(base, i), s)) for i in range(count)]


# ---- contenders ---------------------------------------------------------------------

REGISTRY = Registry()
_is_step = lambda case: case.params.kind == "step"  # noqa: E731
_is_wgrad = lambda case: case.params.kind == "wgrad"  # noqa: E731


def _loss(y, g):
  return jnp.sum(y.astype(jnp.float32) * g.astype(jnp.float32))


def _step(layer):
  """value_and_grad of the same scalar loss, with respect to x and kernel."""
  grad = jax.value_and_grad(lambda x, w, g: _loss(layer(x, w), g), argnums=(0, 1))
  return lambda x, w, g: grad(x, w, g)


def _grads(out):
  """(loss, (dx, dkernel)) -> (dx, dkernel): what is checked."""
  return out[1]


def _wgrad_api():
  """blockwise_fp8_dot, if it takes per-row b scales (b_scale_block=(1, 128))."""
  if "b_scale_block" not in inspect.signature(jax_fp8.blockwise_fp8_dot).parameters:
    raise Unavailable("jax_fp8.blockwise_fp8_dot has no b_scale_block yet (the 1D1D recipe, "
                      "issue 21)")
  return functools.partial(jax_fp8.blockwise_fp8_dot, out_dtype=jnp.float32,
                           b_scale_block=(1, 128))


def _wgrad_args(s: WgradSet):
  return s.a, s.a_scale, s.b, s.b_scale


@REGISTRY.add("jax_fp8", "step: jax_fp8.dense forward + backward (quantisation included); "
              "wgrad: blockwise_fp8_dot(..., b_scale_block=(1, 128)), float32 out",
              role="backend")
def _jax_fp8(case, opts, env) -> Contender:
  if _is_step(case):
    dense = common.api("dense", "issue 21")
    return Contender(_step(dense), lambda s: (s.x, s.kernel, s.g), bound=FP8_RECIPE_BOUND,
                     result=_grads)
  dot = _wgrad_api()
  return Contender(dot, _wgrad_args, bound=_f32_bound(env))


@REGISTRY.add("jax_fp8_acc", "wgrad: as jax_fp8 with c (beta=1): accumulating into a float32 "
              "gradient, as DeepGEMM does", role="backend", applies=_is_wgrad)
def _jax_fp8_acc(case, opts, env) -> Contender:
  dot = _wgrad_api()
  s: Shape = case.params
  prepare = lambda w: (*_wgrad_args(w), jnp.zeros((s.k, s.n), jnp.float32))  # noqa: E731
  return Contender(lambda a, sa, b, sb, c: dot(a, sa, b, sb, c, beta=1.0), prepare,
                   bound=_f32_bound(env))


@REGISTRY.add("pallas_direct", "wgrad: this GPU's Pallas kernel with per-row b scales, called as "
              "jax_fp8.backends.select returns it (b_scale_rows=1): the kernel before the "
              "public op takes b_scale_block", role="backend", applies=_is_wgrad, in_all=False)
def _pallas_direct(case, opts, env) -> Contender:
  s: Shape = case.params
  backend = common.pallas_backend(env)
  common.needs_gpu_or_interpret(backend, env, interpret=None)
  try:
    name, kernel = backends.select(env.platform, backend, m=s.k, n=s.n, k=s.tokens,
                                   out_dtype=F32, has_c=False, b_scale_rows=1)
  except (jax_fp8.BackendUnavailableError, TypeError) as e:
    raise Unavailable(str(e)) from e
  fn = lambda a, sa, b, sb: kernel(a, sa, b, sb, None, beta=1.0,  # noqa: E731
                                   out_dtype=jnp.float32, b_scale_rows=1)
  return Contender(fn, _wgrad_args, bound=GPU_F32_BOUND, resolved=name)


@REGISTRY.add("bf16", "step: x @ kernel in bf16 with its jax.grad; wgrad: a bf16 dot of the "
              "dequantised operands, float32 out")
def _bf16(case, opts, env) -> Contender:
  if _is_step(case):
    return Contender(_step(lambda x, w: x @ w), lambda s: (s.x, s.kernel, s.g), result=_grads)
  deq = jax.jit(lambda a, sa, b, sb: (jax_fp8.dequantize_1x128(a, sa, jnp.bfloat16),
                                      jax_fp8.dequantize_1x128(b, sb, jnp.bfloat16)))
  fn = lambda x, y: lax.dot_general(x, y, (((1,), (1,)), ((), ())),  # noqa: E731
                                    preferred_element_type=jnp.float32)
  return Contender(fn, lambda w: deq(*_wgrad_args(w)))


@REGISTRY.add("deepgemm", "wgrad: DeepGEMM's fp8_gemm_nt with recipe (1, 1, 128) (its 1D1D "
              "kernel, d += a b^T into zeros) where `import deep_gemm` works",
              runtime="torch", applies=_is_wgrad)
def _deepgemm(case, opts, env) -> Contender:
  fn, prepare = deepgemm.wgrad(env)
  return Contender(fn, prepare, bound=GPU_F32_BOUND)


def _f32_bound(env):
  return GPU_F32_BOUND if env.on_gpu else testing.TOLERANCE[F32]


def default_backends(env) -> list[str]:
  if env.on_gpu:
    return list(REGISTRY.all()) + ["pallas_direct"]
  return ["jax_fp8", "jax_fp8_acc", "bf16"]


# ---- references ---------------------------------------------------------------------

def _rows_f64(q, scale):
  """q [R, T] e4m3 with 1x128 scales along T -> float64."""
  t = q.shape[-1]
  return q.astype(jnp.float64) * jnp.repeat(scale.astype(jnp.float64), common.BLOCK, -1)[:, :t]


def reference(contract, s, case):
  """float64 on the device (call under jax.enable_x64): the exact gradients of the step
  (from the bf16 inputs), or the 1D1D contract."""
  if contract == "grads":
    x, w, g = (v.astype(jnp.float64) for v in (s.x, s.kernel, s.g))
    return g @ w.T, x.T @ g
  return _rows_f64(s.a, s.a_scale) @ _rows_f64(s.b, s.b_scale).T


def intro(opts, env) -> list[str]:
  return ["measured: step = one value_and_grad of sum((x @ kernel) * g) with respect to x and "
          "kernel (all kernels of the step; TFLOP/s counts its 3 GEMMs, 6*T*K*N); wgrad = the "
          "1D1D weight-gradient GEMM alone (2*M*N*K)",
          f"rel_err of a step: against the exact float64 gradients (jax_fp8 bound "
          f"{FP8_RECIPE_BOUND}: FP8 rounding, ~4e-2, is expected); of a wgrad: against its "
          "contract"]


def workload(opts) -> runner.Workload:
  return runner.Workload(
      name="training", registry=REGISTRY, make_sets=make_sets,
      references=lambda: checks.DeviceReferences(reference),
      title="FP8 training: one layer, forward + backward", intro=intro,
      layout=report.Layout("case", (26, 22, 9, 8)), ratio_peers=("bf16", "deepgemm"))
