"""Synchronisation pieces shared by the warp-specialised kernels (Hopper and Blackwell).

The vocabulary follows the design seeds (Modular's SM100 blockwise-FP8 matmul):

- `ProducerConsumerPipeline`: a ring of `num_stages` SMEM (or TMEM) stages with
  one "full" barrier (producer -> consumer: data ready) and one "empty" barrier
  (consumer -> producer: stage free) per stage. The producer works inside
  `with pipe.producer(total_steps) as produce:` and `with produce(step) as st:`
  per stage; consumers use `with pipe.consume(step) as st:` (or, in a loop
  over consecutive steps, `pipe.consume_slot(index)` with the slot index
  carried by `next_index`). Stage index and phase advance together with `step`.
- `EpiLoadPipeline`: the epilogue-load warp's ring for the residual C tile.
- `MmaContext`: the MMA warp's view of the TMEM accumulator stages (Blackwell).
- `EpilogueKContext`: the epilogue's per-K-block view (Blackwell): waits for the
  TMEM stage and the input stage, releases BOTH in one step.
- `PrefetchRing`: a warpgroup's own 2-slot ring for streaming c (Hopper).
- `OutputStores`: the epilogue's store sequence through SMEM slots with TMA.

Phases. Mosaic GPU keeps the parity of every barrier per thread and flips it on
each `barrier_wait`, so a thread must wait for a barrier's completions one by
one, in order. `step` is the running count of stages that thread has handled
(over all tiles of a persistent CTA); `Stage.index = step % num_stages` and
`Stage.phase = (step // num_stages) % 2`.

Barrier arrive counts in Pallas (Lane semantics) count warpgroups, not threads:
`plgpu.Barrier(num_arrivals=1)` expects one warpgroup's arrival. Barriers that
order the tensor core (`orders_tensor_core=True`) count single arrivals (one
`tcgen05_commit_arrive`, or one elected thread of an arriving warpgroup). A
`plgpu.ClusterBarrier` collects the arrivals of every CTA of the cluster: the
ring of a kernel whose TMA copies multicast into the peer CTA's SMEM must have
its "empty" barriers of that kind, so that a slot is refilled only when the
consumers of both CTAs are done with it.

Phases. The ring's waits and a producer's stage are named scopes
("empty_wait", "produce", "full_wait"): with Mosaic GPU's on-device profiler on
(pallas/hopper.profiled), each warpgroup records when it enters and leaves them
(tools/kernel_timeline.py). Without the profiler a name changes no code.

Closing. GPU interpret mode checks, when a barrier is freed, that every thread
that waits on it observed every phase that completed. A producer waits for
"empty" only from its second round on, so the last `num_stages` releases of a
ring are never observed in its loop: leaving `producer(...)` waits for them
(this also guarantees that no consumer still reads a stage when the kernel ends).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jax_fp8.pallas import barrier_probe


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of a ring: its running step, slot index and phase (parity)."""
  step: Any
  index: Any
  phase: Any


def _stage(step, num_stages: int) -> Stage:
  step = jnp.asarray(step, jnp.int32)
  return Stage(step=step, index=lax.rem(step, jnp.int32(num_stages)),
               phase=lax.rem(lax.div(step, jnp.int32(num_stages)), jnp.int32(2)))


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
               empty_orders_tensor_core: bool = False,
               cluster_axes: tuple[str, ...] = ()) -> dict:
    """Scratch types for the (full, empty) barrier arrays of a ring. With
    cluster_axes, "empty" collects the consumers' arrivals of every CTA of the
    cluster (for multicast producers)."""
    if cluster_axes:
      empty = plgpu.ClusterBarrier(collective_axes=cluster_axes, num_arrivals=empty_arrivals,
                                   num_barriers=num_stages)
    else:
      empty = plgpu.Barrier(num_arrivals=empty_arrivals, num_barriers=num_stages,
                            orders_tensor_core=empty_orders_tensor_core)
    return dict(
        full=plgpu.Barrier(num_arrivals=full_arrivals, num_barriers=num_stages,
                           orders_tensor_core=full_orders_tensor_core),
        empty=empty)

  def stage(self, step) -> Stage:
    return _stage(step, self.num_stages)

  # -- producer side ----------------------------------------------------------
  @contextlib.contextmanager
  def producer(self, total_steps):
    """The producer's side of the ring, for `total_steps` stages in all.

        with pipe.producer(total) as produce:
          ... with produce(step) as st: copy_gmem_to_smem(..., pipe.producer_mbar(st))

    `produce(step)` waits until the consumers freed the slot (from the second
    round on). Leaving the context waits for the consumers' release of the
    last min(num_stages, total_steps) stages, which the loop never waited for.
    """
    yield self._produce
    self.wait_last_releases(total_steps)

  def wait_last_releases(self, total_steps):
    """Waits for the consumers' release of the last min(num_stages, total_steps)
    stages (what closing `producer` does)."""
    total_steps = jnp.asarray(total_steps, jnp.int32)
    for i in range(self.num_stages):
      step = total_steps - self.num_stages + i

      @pl.when(step >= 0)
      def _():
        plgpu.barrier_wait(self.empty.at[lax.rem(step, jnp.int32(self.num_stages))])

  @contextlib.contextmanager
  def _produce(self, step):
    st = self.stage(step)

    with jax.named_scope("empty_wait"):
      @pl.when(st.step >= self.num_stages)
      def _():
        plgpu.barrier_wait(self.empty.at[st.index])
    with jax.named_scope("produce"):
      yield st

  def producer_mbar(self, st: Stage):
    """The barrier the producer's TMA copies (or MMA commit) complete."""
    return self.full.at[st.index]

  # -- consumer side ----------------------------------------------------------
  def wait_producer(self, st: Stage, ready=None):
    """Waits until the slot is full; ready: see consume_slot."""
    with jax.named_scope("full_wait"):
      if ready is None:
        plgpu.barrier_wait(self.full.at[st.index])
      else:
        barrier_probe.wait_unless(self.full.at[st.index], ready)

  def consumer_mbar(self, st: Stage):
    """The barrier a consumer arrives on (or hands to tcgen05_mma) to free the slot."""
    return self.empty.at[st.index]

  def release(self, st: Stage):
    plgpu.barrier_arrive(self.empty.at[st.index])

  def consume(self, step, *, release: bool = True):
    """Enter: wait until the slot is full. Exit: release it (unless release=False,
    when the caller releases it another way, e.g. through tcgen05_mma's barrier)."""
    return self._consume(self.stage(step), release)

  # A loop over consecutive steps can carry the slot index instead of its step:
  # the index then costs a compare and a select per step instead of a division
  # by num_stages (a waiting thread's barrier parity is kept by Mosaic itself).
  def consume_slot(self, index, ready=None):
    """consume() of the step whose slot is `index` (from stage(step).index or
    next_index); ready: what full_ready(index) returned since the slot's last
    wait (the wait is then skipped where it was True)."""
    return self._consume(Stage(step=None, index=index, phase=None), True, ready)

  def full_ready(self, index):
    """Whether slot `index`'s next fill has landed, tested without blocking
    (pallas/barrier_probe.py): a consumer asks ahead of its next step's wait."""
    return barrier_probe.ready(self.full.at[index])

  @contextlib.contextmanager
  def _consume(self, st: Stage, release: bool, ready=None):
    self.wait_producer(st, ready)
    yield st
    if release:
      self.release(st)

  def next_index(self, index):
    """The slot index of the step after the one in slot `index`."""
    nxt = index + 1
    return jnp.where(nxt == self.num_stages, jnp.int32(0), nxt)


class EpiLoadPipeline(ProducerConsumerPipeline):
  """Epilogue-load warp -> epilogue warpgroup ring for the residual C tile.

  2 x num_stages barriers: full (one TMA transaction per stage) and empty (one
  arrival of the whole epilogue warpgroup).
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


@dataclasses.dataclass
class MmaContext:
  """The MMA warp's side of the TMEM accumulator ring (the "output pipeline").

  tmem: a TMEM ref of shape (rows, num_stages * stage_cols); stage t is the
  column range [t * stage_cols, (t + 1) * stage_cols).
  tmem_pipe: full = "MMA of this stage done" (tcgen05_commit_arrive), empty =
  "epilogue has read the stage" (ordered with the tensor core).

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
    self._producer = self.tmem_pipe.producer(self.total_steps)
    self._produce = self._producer.__enter__()
    return self

  def __exit__(self, *exc):
    return self._producer.__exit__(*exc)

  def stage_ref(self, index):
    return self.tmem.at[:, pl.ds(index * self.stage_cols, self.stage_cols)]

  @contextlib.contextmanager
  def per_k_stage(self, step):
    """Enter: wait for a free TMEM stage; yields (stage, its TMEM ref).
    Exit: tcgen05_commit_arrive, which completes the stage's full barrier once
    every MMA issued into it has finished."""
    with self._produce(step) as st:
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


@dataclasses.dataclass(frozen=True)
class PrefetchRing:
  """A warpgroup's own ring of SMEM slots for streaming pieces of c by TMA.

  smem: (slots, rows, cols); barriers[first_barrier + slot]: one barrier of one
  TMA arrival per slot. `start(i, src)` issues piece i's copy into slot i % slots; `wait(i)` returns
  that slot once it landed. Piece i + slots reuses the slot: start it only
  after piece i was read and the reads fenced (OutputStores.store's
  commit_smem does that), as the epilogue's order guarantees.
  """
  smem: Any
  barriers: Any
  first_barrier: Any = 0

  @property
  def slots(self) -> int:
    return self.smem.shape[0]

  def start(self, i: int, src):
    slot = i % self.slots
    plgpu.copy_gmem_to_smem(src, self.smem.at[slot], self.barriers.at[self.first_barrier + slot])

  def wait(self, i: int):
    slot = i % self.slots
    plgpu.barrier_wait(self.barriers.at[self.first_barrier + slot])
    return self.smem.at[slot]


@dataclasses.dataclass(frozen=True)
class PartialSums:
  """Warpgroups that split a tile's K loop hand their float32 sums to the first,
  which adds them before its epilogue, tile after tile.

  smem: (others, parts, rows, cols) float32, a slot per other warpgroup; full: one
  barrier of `others` arrivals ("every sum is there"); free: one barrier of one
  arrival ("the first has read them"). Each phase of `free` is waited for: by
  the next tile's hand_over, and after the last tile by `finish`.
  """
  smem: Any
  full: Any
  free: Any

  def wait_full(self):
    plgpu.barrier_wait(self.full)

  def wait_free(self):
    plgpu.barrier_wait(self.free)

  def hand_over(self, warpgroup, parts, handed_before):
    """Warpgroup `warpgroup` (1, 2, ...: slot warpgroup - 1) stores its parts once
    the first has read its last ones (where it handed over before), and signals."""
    pl.when(handed_before)(self.wait_free)
    for p, part in enumerate(parts):
      self.smem[warpgroup - 1, p] = part
    plgpu.barrier_arrive(self.full)

  def add_to(self, parts):
    """parts plus every other warpgroup's sums; frees their slots."""
    self.wait_full()
    total = list(parts)
    for w in range(self.smem.shape[0]):
      for p in range(len(total)):
        total[p] = total[p] + plgpu.load(self.smem.at[w, p], layout=plgpu.Layout.WGMMA,
                                         optimized=False)
    plgpu.barrier_arrive(self.free)
    return tuple(total)

  def finish(self, handed_over):
    """After a warpgroup's last hand_over (if any): waits until it was read."""
    pl.when(handed_over)(self.wait_free)


@dataclasses.dataclass(frozen=True)
class OutputStores:
  """The epilogue's stores: value -> SMEM slot -> TMA -> GMEM, piece by piece.

  smem: (slots, rows, cols) in the output dtype. With 2 slots, piece i's TMA
  store runs while piece i + 1 is computed; before a slot is rewritten, the
  store that last read it must have finished reading. `finish()` waits for
  every store's reads before the kernel (or the SMEM) goes away.

  rows_smem: (copies, rows + shift, cols) without transforms, for `store_rows` (a
  piece of which only some rows are stored; common.rows_buffer_shape), else None.
  """
  smem: Any
  rows_smem: Any = None

  def store(self, i: int, value, dst):
    slots = self.smem.shape[0]
    slot = i % slots
    plgpu.wait_smem_to_gmem(slots - 1, wait_read_only=True)
    self.smem[slot] = value.astype(self.smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(self.smem.at[slot], dst)

  def store_rows(self, i: int, value, dst, lo, hi, in_bounds=True):
    """Stores rows [lo, hi) of the piece (clamped to it): dst(start, rows) is
    the GMEM window of the piece's rows [start, start + rows). in_bounds: False
    where the piece's columns lie wholly past the output's: part of one is then
    not stored. (A one-row box from the unswizzled rows_smem is contiguous, and
    Mosaic issues a contiguous store as a plain bulk copy bounded only by the
    array's end: on the H200 such boxes of 32 bf16 columns past N wrote zeros
    into the next row's first columns. The kernels pad the output's columns to
    whole pieces, so no piece is partly past them. A whole piece still takes
    `store`, a swizzled tensor copy bounded per dimension, whose slots' waits
    count every piece's store.)

    A whole piece takes `store`. Part of one goes through rows_smem (its
    untiled rows can be sliced anywhere) in TMA boxes of 2^j rows, one per bit
    of the row count (TMA boxes have static sizes). A box from piece row s is
    copied from the copy of the piece where that row starts an aligned address
    (copy j holds it j rows down: j = -s mod copies; common.rows_buffer_shape).
    Stores of other pieces may be in flight meanwhile: `store`'s wait keeps a
    slot's last store the newest but one, and this waits for every store before
    reusing rows_smem.
    """
    rows = self.smem.shape[1]
    copies = self.rows_smem.shape[0]
    lo, hi = jnp.maximum(lo, 0), jnp.minimum(hi, rows)

    @pl.when((lo == 0) & (hi == rows))
    def _():
      self.store(i, value, dst(0, rows))

    partial = (hi > lo) & ((lo > 0) | (hi < rows))
    if in_bounds is not True:  # (a constant True would still trace an `and`)
      partial = partial & in_bounds

    @pl.when(partial)
    def _():
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      self.rows_smem[0, pl.ds(0, rows)] = value.astype(self.rows_smem.dtype)
      plgpu.commit_smem()
      if copies > 1:
        # The shifted copies from the first in plain 16-byte vectors: a store in
        # the WGMMA layout addresses its destination as if 128-byte aligned.
        dtype = jnp.dtype(self.rows_smem.dtype)
        layout = plgpu.Layout.WG_STRIDED((rows, self.rows_smem.shape[2]),
                                         vec_size=16 // dtype.itemsize)
        piece = plgpu.load(self.rows_smem.at[0, pl.ds(0, rows)], layout=layout,
                           optimized=False)
        for j in range(1, copies):
          self.rows_smem[j, pl.ds(j, rows)] = piece
        plgpu.commit_smem()
      count, start = hi - lo, lo
      box = 1 << (rows.bit_length() - 1)
      while box:
        @pl.when(count & box != 0)
        def _(box=box, start=start):
          j = 0 if copies == 1 else lax.rem(copies - lax.rem(start, copies), copies)
          plgpu.copy_smem_to_gmem(self.rows_smem.at[j, pl.ds(start + j, box)], dst(start, box))
        start = start + (count & box)
        box //= 2

  @staticmethod
  def piece_in_bounds(col0, out_cols: int, tile_n: int):
    """store_rows' in_bounds of a piece whose columns start at col0 in an output
    of out_cols columns cut into tiles of tile_n: True (no test, the kernel's
    jaxpr unchanged) where the output's columns are whole tiles, so that every
    piece lies inside them (the test there slowed the ragged 128 x 256 K loop,
    0.954x in one alternated run on the H200), else whether col0 is inside."""
    return True if out_cols % tile_n == 0 else col0 < out_cols

  @staticmethod
  def finish():
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
