"""jax_fp8: DeepSeek-style blockwise-scaled FP8 matmul for JAX on Hopper and Blackwell."""
import os as _os

# Installed, `pallas/` and `ffi/` live inside this package (pyproject maps
# them there). Run from a source checkout, they sit beside it at the top level:
# let the subpackages jax_fp8.pallas and jax_fp8.ffi resolve there too.
_here = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_here, "pallas")):
  _root = _os.path.dirname(_here)
  if _os.path.isfile(_os.path.join(_root, "pallas", "__init__.py")):
    __path__.append(_root)  # noqa: F821 (the package's own __path__)

from jax_fp8.backends import BackendUnavailableError
from jax_fp8.dense import dense
from jax_fp8.fused import blockwise_fp8_glu, blockwise_fp8_glu_p
from jax_fp8.grouped import (blockwise_fp8_masked_dot, blockwise_fp8_masked_dot_p,
                             blockwise_fp8_ragged_dot, blockwise_fp8_ragged_dot_p)
from jax_fp8.primitive import NotDifferentiableError, blockwise_fp8_dot, blockwise_fp8_dot_p
from jax_fp8.quantize import (dequantize_128x128, dequantize_1x128, quantize_128x128,
                              quantize_128x128_with_transpose, quantize_1x128,
                              quantize_1x128_with_transpose)

# jax_fp8.nn (a Flax NNX layer) is imported on demand only: flax is an optional extra.

__version__ = "0.1.0"
__all__ = [
    "BackendUnavailableError", "NotDifferentiableError", "blockwise_fp8_dot",
    "blockwise_fp8_dot_p", "blockwise_fp8_glu", "blockwise_fp8_glu_p",
    "blockwise_fp8_masked_dot", "blockwise_fp8_masked_dot_p", "blockwise_fp8_ragged_dot",
    "blockwise_fp8_ragged_dot_p", "dense",
    "dequantize_128x128", "dequantize_1x128", "quantize_128x128",
    "quantize_128x128_with_transpose", "quantize_1x128", "quantize_1x128_with_transpose",
]
