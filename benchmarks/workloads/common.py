"""What the workloads share: block arithmetic, random operands, jax_fp8 backend names."""
from __future__ import annotations

import jax
import jax.numpy as jnp

import jax_fp8
from jax_fp8 import backends
from harness.registry import Unavailable

BLOCK = 128  # the quantisation group: 1x128 activations, 128x128 weights
FP8 = jnp.float8_e4m3fn


def blocks(n: int) -> int:
  """ceil(n / 128): scale entries along a dimension of n elements."""
  return -(-n // BLOCK)


def random_fp8(key, shape):
  """e4m3 values over most of the format's range (jax_fp8.testing's distribution,
  drawn on the device)."""
  return (jax.random.normal(key, shape, jnp.float32) * 64).astype(FP8)


def random_scales(key, shape):
  """Positive float32 scales over several binades (2^-12 .. 2^-4)."""
  return jnp.exp2(jax.random.uniform(key, shape, jnp.float32, -12.0, -4.0))


def case_key(seed: int, *dims: int):
  """A key per seed and case, so every contender of a case sees the same operands."""
  h = 0
  for d in dims:
    h = (h * 1_000_003 + int(d)) % (2**31)
  return jax.random.fold_in(jax.random.key(seed), h)


def pallas_backend(env) -> str:
  """The Pallas kernel of this device's generation ("pallas" on the command line)."""
  cc = env.target_compute_capability
  for name in backends.PALLAS:
    if backends.BACKENDS[name].arch(cc):
      return name
  raise Unavailable(f"no Pallas kernel for compute capability {cc[0]}.{cc[1]} "
                    f"({', '.join(backends.PALLAS)})")


def needs_gpu_or_interpret(name: str, env, interpret: bool | None):
  """An explicit Pallas kernel without a GPU runs only in GPU interpret mode
  (interpret None: the script has no --interpret)."""
  if not env.on_gpu and not interpret and name in backends.PALLAS:
    if interpret is None:
      raise Unavailable(f"{name} needs an NVIDIA GPU")
    raise Unavailable(f"{name} needs an NVIDIA GPU; on the CPU, --interpret runs it in GPU "
                      "interpret mode (correctness only, no timing)")


def api(name: str, issue: str):
  """jax_fp8.<name>, or Unavailable if this jax_fp8 does not have it yet."""
  fn = getattr(jax_fp8, name, None)
  if fn is None:
    raise Unavailable(f"jax_fp8.{name} does not exist in this jax_fp8 yet ({issue})")
  return fn


def dequantize_weights(b, b_scale, dtype=jnp.bfloat16):
  """[..., N, K] e4m3 with [..., N/128, K/128] scales -> [..., N, K] dtype."""
  fn = lambda q, s: jax_fp8.dequantize_128x128(q, s, dtype)  # noqa: E731
  for _ in range(b.ndim - 2):
    fn = jax.vmap(fn)
  return fn(b, b_scale)
