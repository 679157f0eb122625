"""torch for the peers that only torch can call (cuBLAS blockwise FP8, DeepGEMM).

Arrays go between JAX and torch through DLPack on the device (through the host
where DLPack fails); FP8 travels as uint8 bits, since DLPack has no e4m3 type.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from harness.registry import Unavailable

FP8 = np.dtype(jnp.float8_e4m3fn)


def cuda_torch():
  """The torch module, if it imports and sees a CUDA device; else Unavailable saying why."""
  try:
    import torch
  except Exception as e:  # noqa: BLE001 (ImportError or a broken install)
    raise Unavailable(f"torch is not importable ({type(e).__name__}: {e})") from e
  if not torch.cuda.is_available():
    raise Unavailable(f"torch {torch.__version__} sees no CUDA device")
  return torch


def to_torch(x):
  """A JAX array as a new torch CUDA tensor of the same dtype (e4m3 included)."""
  torch = cuda_torch()
  if np.dtype(x.dtype) == FP8:
    u8 = lax.bitcast_convert_type(x, jnp.uint8)
    try:
      t = torch.from_dlpack(u8)
    except Exception:  # noqa: BLE001 (no DLPack: through the host)
      t = torch.from_numpy(np.asarray(u8)).cuda()
    return t.view(torch.float8_e4m3fn).clone()
  try:
    return torch.from_dlpack(x).clone()
  except Exception:  # noqa: BLE001
    return torch.from_numpy(np.asarray(x)).cuda()


def to_jax(t):
  """A torch tensor as a JAX array (bf16 and f32 through DLPack, else through the host).

  Waits for torch's work first: DLPack hands JAX the buffer without ordering it after
  the torch kernels still writing it (a result's gather, e.g. DeepGEMM's contiguous
  rows taken out of its padded layout, would be read half written)."""
  cuda_torch().cuda.synchronize()
  try:
    return jax.dlpack.from_dlpack(t.contiguous())
  except Exception:  # noqa: BLE001 (through the host)
    return jnp.asarray(t.float().cpu().numpy())
