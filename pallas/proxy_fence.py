"""A proxy fence one warp can issue: this thread's generic-proxy SMEM accesses
ordered before its later async-proxy ones (`fence.proxy.async.shared::cta`).

A producer that refills a ring slot whose scales the consumers read with plain
loads (generic proxy) must fence before its TMA (async proxy) overwrites them;
it has observed the reads' completion through the slot's "empty" barrier.
Pallas's `commit_smem` is that fence followed by a warpgroup barrier and has no
rule for code under `plgpu.warp_map` (one producer warp, the others idle), so
this is a primitive of our own, lowered with Mosaic GPU's NVVM fence (JAX
internals, as of the jax this project pins). GPU interpret mode, which has no
rule for it, runs Pallas's `commit_smem` instead (modelled per thread there).
"""
from __future__ import annotations

from jax._src import core as jax_core
from jax._src.lib.mlir.dialects import nvvm
from jax._src.pallas.mosaic_gpu import core as gpu_core
from jax._src.pallas.mosaic_gpu import lowering
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import device

async_proxy_fence_p = jax_core.Primitive("jax_fp8_async_proxy_fence")
async_proxy_fence_p.multiple_results = True


def async_proxy_fence() -> None:
  """This thread's SMEM reads and writes ordered before its next TMA (no barrier)."""
  if device.interpret_mode_active():
    plgpu.commit_smem()
    return
  async_proxy_fence_p.bind()


@async_proxy_fence_p.def_effectful_abstract_eval
def _abstract_eval():
  return (), {gpu_core._memory_effect}


def _lowering(ctx):
  del ctx
  nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)
  return ()


# Code of one warp only (warpgroup code has Pallas's commit_smem).
for _lower in (mgpu.LoweringSemantics.Lane, mgpu.LoweringSemantics.Warpgroup):
  lowering.register_lowering_rule(async_proxy_fence_p, _lower,
                                  gpu_core.PrimitiveSemantics.Warp)(_lowering)
