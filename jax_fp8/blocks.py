"""The blockwise FP8 format's constants, shared by the quantisers, the ops and
their partitioners (a module of its own so that none of them imports another
for a number)."""
from __future__ import annotations

import jax.numpy as jnp

BLOCK = 128                 # elements of a scale group along K (and of a 128x128 block's edge)
FP8 = jnp.float8_e4m3fn     # the operands' format


def num_blocks(n: int) -> int:
  """Scale groups of 128 along a dimension of n elements (the last may be partial)."""
  return -(-n // BLOCK)
