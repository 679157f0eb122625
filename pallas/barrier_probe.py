"""A ring barrier's phase tested without blocking, and a wait skipped where the
test found it complete.

A consumer warpgroup's K step ends with its last promotion, the slot's release
and the next slot's wait. Pallas's `barrier_wait` is Mosaic's try-wait loop: the
warpgroup stops at it for the barrier check's round trip even where the phase
completed long before (the ring is full at large M). `ready(barrier)` issues the
check early, as a non-blocking `mbarrier.test_wait` whose result is read only at
the next step's top; `wait_unless(barrier, ready)` then waits only where that
test failed. Both use the barrier's parity as Mosaic keeps it (a per-thread bit
per barrier): `ready` reads it, `wait_unless` flips it, as every wait does.

Pallas has neither: they are primitives of our own, lowered with Mosaic GPU's
barrier objects (JAX internals, as of the jax this project pins). In GPU
interpret mode, which has no rule for them, `ready` is False and `wait_unless`
is Pallas's wait.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax._src import core as jax_core
from jax._src import tree_util
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, memref, nvvm
from jax._src.pallas.mosaic_gpu import core as gpu_core
from jax._src.pallas.mosaic_gpu import lowering
from jax._src.pallas.mosaic_gpu import primitives as gpu_primitives
from jax._src.state import primitives as state_primitives
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import device

_SEMANTICS = (mgpu.LoweringSemantics.Lane, mgpu.LoweringSemantics.Warpgroup)

ready_p = jax_core.Primitive("jax_fp8_barrier_ready")
wait_unless_p = jax_core.Primitive("jax_fp8_barrier_wait_unless")
wait_unless_p.multiple_results = True


def ready(barrier):
  """Whether the phase that the next wait on `barrier` waits for has completed
  (a bool, non-blocking; memory is then ordered as after that wait)."""
  if device.interpret_mode_active():
    return jnp.bool_(False)
  barrier, flat, treedef = _split(barrier, "ready")
  return ready_p.bind(barrier, *flat, transforms_treedef=treedef)


def wait_unless(barrier, is_ready) -> None:
  """The wait on `barrier`, skipped (its parity flipped all the same) where
  `is_ready`, which `ready(barrier)` returned since the last wait on it."""
  if device.interpret_mode_active():
    plgpu.barrier_wait(barrier)
    return
  barrier, flat, treedef = _split(barrier, "wait_unless")
  wait_unless_p.bind(barrier, jnp.asarray(is_ready, jnp.bool_), *flat,
                     transforms_treedef=treedef)


def _split(barrier, name):
  barrier, transforms = state_primitives.get_ref_and_transforms(barrier, None, name)
  flat, treedef = tree_util.tree_flatten(transforms)
  return barrier, flat, treedef


@ready_p.def_effectful_abstract_eval
def _ready_abstract_eval(barrier, *flat_transforms, transforms_treedef):
  del barrier, flat_transforms, transforms_treedef
  return jax_core.ShapedArray((), jnp.bool_), {gpu_core._memory_effect}


@wait_unless_p.def_effectful_abstract_eval
def _wait_unless_abstract_eval(barrier, is_ready, *flat_transforms, transforms_treedef):
  del barrier, is_ready, flat_transforms, transforms_treedef
  return (), {gpu_core._memory_effect}


def _barrier_ref(ctx, barrier, flat_transforms, transforms_treedef):
  """Mosaic's BarrierRef of the (indexed) barrier, as Pallas's wait finds it
  (under Warpgroup semantics, inside a DialectBarrierRef)."""
  transforms = transforms_treedef.unflatten(flat_transforms)
  base = gpu_primitives._get_barrier_base_index(ctx.avals_in[0], transforms)
  if base is not None:
    barrier = barrier[base]
  return getattr(barrier, "barrier_ref", barrier)


def _i32(v):
  return arith.extui(ir.IntegerType.get_signless(32), v)


def _ready_lowering(ctx, barrier, *flat_transforms, transforms_treedef):
  barrier = _barrier_ref(ctx, barrier, flat_transforms, transforms_treedef)
  parity, _ = barrier.update_parities(memref.load(barrier.phases, []))
  return nvvm.mbarrier_test_wait(barrier.get_ptr(), _i32(parity))


def _wait_unless_lowering(ctx, barrier, is_ready, *flat_transforms, transforms_treedef):
  barrier = _barrier_ref(ctx, barrier, flat_transforms, transforms_treedef)
  parity, flipped = barrier.update_parities(memref.load(barrier.phases, []))
  memref.store(flipped, barrier.phases, [])
  is_ready = lowering._ensure_ir_value(is_ready, jnp.bool_)
  with mgpu_utils.when(arith.xori(is_ready, mgpu_utils.c(1, is_ready.type))):
    barrier.wait_parity(parity)
  return ()


for _semantics in _SEMANTICS:
  lowering.register_lowering_rule(ready_p, _semantics)(_ready_lowering)
  lowering.register_lowering_rule(wait_unless_p, _semantics)(_wait_unless_lowering)
