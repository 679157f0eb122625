"""Reusable synchronisation pieces for warp-specialised Pallas Mosaic GPU kernels.

The vocabulary follows the design seeds (Modular's SM100 blockwise-FP8 matmul):

- `ProducerConsumerPipeline`: a ring of `num_stages` SMEM (or TMEM) stages with
  one "full" barrier (producer -> consumer: data ready) and one "empty" barrier
  (consumer -> producer: stage free) per stage. `produce(step)` / `consume(step)`
  are context managers; the stage index and phase advance together with `step`.
- `EpiLoadPipeline`: the epilogue-load warp's ring for the residual C tile
  (2 x num_stages barriers: full with one TMA transaction, empty with one
  arrival of the whole epilogue warpgroup = 128 hardware thread arrivals).
- `MmaContext`: the MMA warp's view of the TMEM accumulator stages; per K block
  `per_k_stage(step)` hands out a fresh TMEM stage and signals it with
  `tcgen05_commit_arrive` on exit; leaving the context waits until the epilogue
  has released every TMEM stage, so TMEM can be deallocated safely.
- `EpilogueKContext`: the epilogue's per-K-block view; `per_k_stage(step)`
  waits for the TMEM stage (and the A-scale stage) and, on exit, releases BOTH
  the TMEM stage and the input stage in one step.

Phases. Mosaic GPU keeps the parity of every barrier per thread and flips it on
each `barrier_wait`, so a thread must wait for a barrier's completions one by
one, in order. `step` is the running count of stages that thread has handled
(over all tiles of a persistent CTA); `Stage.index = step % num_stages` and
`Stage.phase = (step // num_stages) % 2` are the parity that wait observes.

Barrier arrive counts in Pallas (Lane semantics) count warpgroups, not threads:
`plgpu.Barrier(num_arrivals=1)` is an mbarrier expecting 128 thread arrivals,
and a warp's `barrier_arrive` contributes 4 x 32 of them. Barriers that order
the tensor core (`orders_tensor_core=True`) count single arrivals (one
`tcgen05_commit_arrive`, or one elected thread of an arriving warpgroup).

Draining. GPU interpret mode checks, when a barrier is freed, that every thread
that waits on it observed every phase that completed. A producer waits for
"empty" only from its second round on, so the last `num_stages` releases of a
ring are never observed in the loop: `drain_producer(total_steps)` waits for
them before the producer leaves (this also guarantees that no consumer still
reads a stage when the kernel ends).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of a ring: its running step, slot index and phase (parity)."""
  step: Any
  index: Any
  phase: Any


def _stage(step, num_stages: int) -> Stage:
  step = jnp.asarray(step, jnp.int32)
  return Stage(step=step, index=lax.rem(step, num_stages),
               phase=lax.rem(lax.div(step, num_stages), 2))


@dataclasses.dataclass(frozen=True)
class ProducerConsumerPipeline:
  """A `num_stages`-deep ring with full/empty barriers (each of shape (num_stages,)).

  full:  completed by the producer (TMA transactions, or `tcgen05_commit_arrive`).
  empty: completed by the consumer(s) when they are done with the stage.
  The arrive counts are set where the barriers are allocated (`barriers()`).
  """
  full: Any
  empty: Any
  num_stages: int

  @staticmethod
  def barriers(num_stages: int, *, full_arrivals: int = 1, empty_arrivals: int = 1,
               full_orders_tensor_core: bool = False,
               empty_orders_tensor_core: bool = False) -> dict:
    """Scratch types for the (full, empty) barrier arrays of a ring."""
    return dict(
        full=plgpu.Barrier(num_arrivals=full_arrivals, num_barriers=num_stages,
                           orders_tensor_core=full_orders_tensor_core),
        empty=plgpu.Barrier(num_arrivals=empty_arrivals, num_barriers=num_stages,
                            orders_tensor_core=empty_orders_tensor_core))

  def stage(self, step) -> Stage:
    return _stage(step, self.num_stages)

  # -- producer side ----------------------------------------------------------
  def wait_consumer(self, st: Stage):
    """Waits until the consumers freed the slot (not needed in the first round)."""
    @pl.when(st.step >= self.num_stages)
    def _():
      plgpu.barrier_wait(self.empty.at[st.index])

  def producer_mbar(self, st: Stage):
    """The barrier the producer's TMA copies (or MMA commit) complete."""
    return self.full.at[st.index]

  @contextlib.contextmanager
  def produce(self, step):
    """with pipe.produce(step) as st: copy_gmem_to_smem(..., pipe.producer_mbar(st)).

    Enter: wait for the slot to be free. Exit: nothing to signal; the TMA
    transactions (or the MMA commit) complete the full barrier.
    """
    st = self.stage(step)
    self.wait_consumer(st)
    yield st

  def drain_producer(self, total_steps):
    """Waits for the releases of the last min(num_stages, total_steps) steps.

    The producer never waited for them in its loop (it stopped producing);
    afterwards it has observed every phase of `empty` that completes.
    """
    total_steps = jnp.asarray(total_steps, jnp.int32)
    for i in range(self.num_stages):
      step = total_steps - self.num_stages + i

      @pl.when(step >= 0)
      def _():
        plgpu.barrier_wait(self.empty.at[lax.rem(step, self.num_stages)])

  # -- consumer side ----------------------------------------------------------
  def wait_producer(self, st: Stage):
    plgpu.barrier_wait(self.full.at[st.index])

  def consumer_mbar(self, st: Stage):
    """The barrier a consumer arrives on (or hands to tcgen05_mma) to free the slot."""
    return self.empty.at[st.index]

  def release(self, st: Stage):
    plgpu.barrier_arrive(self.empty.at[st.index])

  @contextlib.contextmanager
  def consume(self, step, *, release: bool = True):
    """Enter: wait until the slot is full. Exit: release it (unless release=False,
    when the caller releases it another way, e.g. through tcgen05_mma's barrier)."""
    st = self.stage(step)
    self.wait_producer(st)
    yield st
    if release:
      self.release(st)


class EpiLoadPipeline(ProducerConsumerPipeline):
  """Epilogue-load warp -> epilogue warpgroup ring for the residual C tile.

  2 x num_stages barriers: full (producer arrive count 1: a single TMA
  transaction per stage) and empty (consumer arrive count: the whole epilogue
  warpgroup, 128 threads; Pallas counts that as 1 warpgroup arrival).
  """

  @staticmethod
  def barriers(num_stages: int = 2) -> dict:
    return ProducerConsumerPipeline.barriers(num_stages, full_arrivals=1, empty_arrivals=1)

  @contextlib.contextmanager
  def consume(self, step, *, release: bool = True):
    """As ProducerConsumerPipeline.consume; before the release, fences the
    epilogue's generic-proxy reads of the slot against the next TMA write."""
    st = self.stage(step)
    self.wait_producer(st)
    yield st
    if release:
      plgpu.commit_smem()
      self.release(st)


@dataclasses.dataclass(frozen=True)
class MmaContext:
  """The MMA warp's side of the TMEM accumulator ring (the "output pipeline").

  tmem: a TMEM ref of shape (rows, num_stages * stage_cols); stage t is the
  column range [t * stage_cols, (t + 1) * stage_cols).
  tmem_pipe: full = "MMA of this stage done" (tcgen05_commit_arrive, arrive
  count 1), empty = "epilogue has read the stage" (arrive count 1, the epilogue
  warpgroup, ordered with the tensor core).

  Pallas allocates TMEM for the whole kernel and frees it at exit; this context
  owns its use: entering it hands out stages, leaving it (after `total_steps`
  stages) waits for the epilogue to release every stage still in flight, so
  that no TMEM is freed (or the kernel left) while the epilogue reads it.
  """
  tmem: Any
  tmem_pipe: ProducerConsumerPipeline
  stage_cols: int
  total_steps: Any

  @staticmethod
  def barriers(num_stages: int) -> dict:
    return ProducerConsumerPipeline.barriers(
        num_stages, full_arrivals=1, empty_arrivals=1,
        full_orders_tensor_core=True, empty_orders_tensor_core=True)

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *_):
    if exc_type is None:
      self.tmem_pipe.drain_producer(self.total_steps)
    return False

  def stage_ref(self, index):
    return self.tmem.at[:, pl.ds(index * self.stage_cols, self.stage_cols)]

  @contextlib.contextmanager
  def per_k_stage(self, step):
    """Enter: wait for a free TMEM stage; yields (stage, its TMEM ref).
    Exit: tcgen05_commit_arrive, which completes the stage's full barrier once
    every MMA issued into it has finished."""
    with self.tmem_pipe.produce(step) as st:
      yield st, self.stage_ref(st.index)
      plgpu.tcgen05_commit_arrive(self.tmem_pipe.producer_mbar(st))


@dataclasses.dataclass(frozen=True)
class EpilogueKStage:
  """What the epilogue sees for one K block: the TMEM stage and the input stage."""
  tmem: Any          # TMEM ref of this K block's partial sums
  tmem_stage: Stage
  input_stage: Stage


@dataclasses.dataclass(frozen=True)
class EpilogueKContext:
  """Per-K-block context of the epilogue warpgroup: two pipelines, one exit.

  Enter: wait until the MMA of this K block is done (TMEM stage full) and
  until its input stage landed (the A-scales live there). Exit: wait for the
  TMEM loads, fence the generic-proxy reads of the input stage, then release
  BOTH the TMEM stage (to the MMA warp) and the input stage (to the TMA warp).
  """
  mma: MmaContext
  inputs: ProducerConsumerPipeline

  @contextlib.contextmanager
  def per_k_stage(self, step):
    tst = self.mma.tmem_pipe.stage(step)
    ist = self.inputs.stage(step)
    self.mma.tmem_pipe.wait_producer(tst)
    self.inputs.wait_producer(ist)
    yield EpilogueKStage(tmem=self.mma.stage_ref(tst.index), tmem_stage=tst, input_stage=ist)
    plgpu.wait_load_tmem()   # TMEM reads done before the MMA warp overwrites the stage
    plgpu.commit_smem()      # A-scale reads ordered before the next TMA write to the slot
    self.mma.tmem_pipe.release(tst)
    self.inputs.release(ist)
