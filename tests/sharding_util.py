"""Helpers of the sharding tests: what a compiled program communicates, and the
reference-backend dot that they partition."""
import re

import jax_fp8

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all",
               "collective-permute", "collective-broadcast")


def collectives(hlo: str) -> dict[str, int]:
  """The collective ops that occur in compiled HLO text, per kind (async ones
  counted at their -start); matched by opcode, whatever the result type (tuples
  included)."""
  got = {op: len(re.findall(rf"(?<=\s){op}(?:-start)?\(", hlo)) for op in COLLECTIVES}
  return {op: n for op, n in got.items() if n}


def reference_dot(beta, out_dtype):
  """f(a, a_scale, b, b_scale, c): blockwise_fp8_dot on the reference backend."""
  def f(a, a_scale, b, b_scale, c):
    return jax_fp8.blockwise_fp8_dot(a, a_scale, b, b_scale, c, beta=beta, out_dtype=out_dtype,
                                     backend="reference")
  return f
