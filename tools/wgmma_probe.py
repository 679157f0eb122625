"""The ceiling of a K step's shape: how fast consumer warpgroups run the Hopper
kernel's K step (a 64 x N x 128 FP8 WGMMA from SMEM, its wait, the promotion's FFMA
into a carried float32 sum) with nothing else in the kernel, alone and beside a
warpgroup streaming TMA copies into other SMEM at the rate of that tile's ring fill
((rows + cols) x 128 bytes a K step). On the GPU machine (--lower: CPU, CUDA
lowering only).

    python3 tools/wgmma_probe.py --cases=3x128,2x160,2x128x2 [--steps=4000]
    python3 tools/wgmma_probe.py --cases=2x128x2 --a_in_registers
    python3 tools/wgmma_probe.py --cases=2x160 --stages=5 [--scales]

With --stages=S the operands come through a ring of S slots instead (the kernel's
ProducerConsumerPipeline: a producer warpgroup's TMA copies of each step's A and B,
the consumers' full waits and releases; K blocks cycle over 56, as K = 7168), and
with --scales each slot also brings its K block's a-scales, which the promotion
multiplies in (the 1x128 x 128x128 recipe's row factor), with --b_scales each step
reads two b scales from GMEM and each 32-column piece takes its block's (a wide
tile's, 128 x 160): the ladder from the bare WGMMAs to the kernel's K loop.

A case is WxN[xC]: W consumer warpgroups, each a 64-row chunk row of C chunks of N
columns (a tile of 64 W x N C); 3x128 is the 192 x 128 tile of three consumers,
2x128x2 the 128 x 256 tile of two. Prints TFLOP/s alone and with the ring's fill
(and the fill's bytes per second); benchmarks/RESULTS.md 2026-11-29 has a table.
Timing: the median of 7 calls' wall time after a warm-up (a call runs ~2 ms on
132 CTAs), every output checked for NaN. Even with the ring and scales, not the
kernel's K loop: no tile scheduler, no epilogue, the kernel's carried descriptors
and step-top overlap left out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

WRITER_ROWS = 320  # one writer copy: 320 x 128 FP8 (40 KB)
WRITER_SLOTS = 4   # copies in flight
RING_K_BLOCKS = 56  # the ring's K blocks cycle over a K of 7168


def parse_case(text: str) -> tuple[int, int, int]:
  """'2x128x2' -> (warpgroups 2, columns 128, chunks 2); chunks default to 1."""
  parts = text.lower().split("x")
  if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"a case is WxN[xC] of positive integers, got {text!r}")
  w, n, c = (int(p) for p in parts + ["1"] * (3 - len(parts)))
  if not 1 <= w <= 3 or n % 8 or n > 256:
    raise ValueError(f"{text!r}: 1-3 warpgroups, N a multiple of 8 up to 256")
  return w, n, c


def fill_copies(w: int, n: int, chunks: int, steps: int) -> int:
  """Writer copies that carry the ring fill of steps K steps of this tile."""
  tile_bytes = (64 * w + n * chunks) * 128
  return max(WRITER_SLOTS, steps * tile_bytes // (WRITER_ROWS * 128))


# setmaxnreg counts: the consumers take what the 40-register producer / writer leaves.
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = {1: 232, 2: 232, 3: 152}


def _launch(body, w: int, rows: int, cols: int, sms: int):
  """body as a jitted kernel of sms CTAs of w consumer warpgroups and one more,
  returning every CTA's [rows, cols] float32 sums."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return jax.jit(plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((sms, rows, cols), jnp.float32),
      grid=(sms,), grid_names=("sm",), num_threads=w + 1, thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=False)))


def _block(a, b_ref, n: int):
  """One K block's [64, n] WGMMA sum of A (a ref or registers) . b_ref^T, waited for."""
  import jax.numpy as jnp
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def mma(acc):
    plgpu.wgmma(acc, a, b_ref.T)
    return acc[...]
  return pl.run_scoped(mma, plgpu.ACC((64, n), jnp.float32))


def build(w: int, n: int, chunks: int, steps: int, copies: int, a_in_registers: bool,
          sms: int = 132, stages: int = 0, scales: bool = False, b_scales: bool = False):
  """(jitted kernel, argument avals): w consumers of `steps` K steps, a writer
  warpgroup of `copies` TMA copies (0: none); with stages, a producer of a ring of
  that many slots instead (scales: a-scales in it too; b_scales: two 128-row blocks'
  b scales read from GMEM a step, each 32-column piece taking its block's)."""
  if stages:
    return _build_ring(w, n, chunks, steps, stages, scales, a_in_registers, sms, b_scales)
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax_fp8.pallas.common import K_BLOCK, tiled

  f8 = jnp.float8_e4m3fn

  def body(a_gmem, b_gmem, w_gmem, out_gmem):
    def scope(a_smem, b_smem, w_smem, ready, written):
      wg = lax.axis_index("wg")

      @pl.when(wg == w)
      def _writer():
        plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, ready)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, ready)
        if copies:
          for s in range(WRITER_SLOTS):
            plgpu.copy_gmem_to_smem(w_gmem, w_smem.at[s], written.at[s])

          def refill(i, carry):
            s = lax.rem(i, WRITER_SLOTS)
            plgpu.barrier_wait(written.at[s])
            plgpu.copy_gmem_to_smem(w_gmem, w_smem.at[s], written.at[s])
            return carry
          lax.fori_loop(0, copies - WRITER_SLOTS, refill, 0)
          for s in range(WRITER_SLOTS):
            plgpu.barrier_wait(written.at[s])

      @pl.when(wg < w)
      def _consumer():
        plgpu.set_max_registers(CONSUMER_REGISTERS[w], action="increase")
        plgpu.barrier_wait(ready)
        a_rows = a_smem.at[pl.ds(wg * 64, 64)]

        def step(i, sums):
          a = plgpu.load(a_rows, layout=plgpu.Layout.WGMMA_8BIT) if a_in_registers else a_rows
          return tuple(sums[c] + _block(a, b_smem.at[pl.ds(c * n, n)], n) * 1.0001
                       for c in range(chunks))
        zero = plgpu.layout_cast(jnp.zeros((64, n), jnp.float32), plgpu.Layout.WGMMA)
        sums = lax.fori_loop(0, steps, step, (zero,) * chunks)
        for c in range(chunks):
          out_gmem[lax.axis_index("sm"), pl.ds(wg * 64, 64), pl.ds(c * n, n)] = sums[c]

    pl.run_scoped(
        scope,
        plgpu.SMEM((64 * w, K_BLOCK), f8, transforms=tiled(f8, K_BLOCK)),
        plgpu.SMEM((n * chunks, K_BLOCK), f8, transforms=tiled(f8, K_BLOCK)),
        plgpu.SMEM((WRITER_SLOTS, WRITER_ROWS, K_BLOCK), f8, transforms=tiled(f8, K_BLOCK)),
        plgpu.Barrier(num_arrivals=2),  # A's and B's copies
        plgpu.Barrier(num_arrivals=1, num_barriers=WRITER_SLOTS),
        collective_axes="wg")

  avals = (jax.ShapeDtypeStruct((64 * w, K_BLOCK), f8),
           jax.ShapeDtypeStruct((n * chunks, K_BLOCK), f8),
           jax.ShapeDtypeStruct((WRITER_ROWS, K_BLOCK), f8))
  return _launch(body, w, 64 * w, n * chunks, sms), avals


def _build_ring(w, n, chunks, steps, stages, scales, a_in_registers, sms, b_scales=False):
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax_fp8.pallas.common import K_BLOCK, tiled
  from jax_fp8.pallas.pipeline import ProducerConsumerPipeline

  f8 = jnp.float8_e4m3fn
  rows, cols = 64 * w, n * chunks
  piece = 32 if b_scales else n  # a wide tile's pieces: one b scale each

  def body(a_gmem, b_gmem, s_gmem, bs_gmem, out_gmem):
    def scope(a_ring, b_ring, s_ring, full, empty):
      pipe = ProducerConsumerPipeline(full, empty, stages)
      # Where this CTA's columns cross a 128-row block of b (as a wide tile's do).
      boundary = 128 - lax.rem(lax.axis_index("sm") * 32, 128)
      wg = lax.axis_index("wg")

      @pl.when(wg == w)
      def _producer():
        plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
        with pipe.producer(steps) as produce:
          def load(i, carry):
            with produce(i) as st:
              kb = lax.rem(i, RING_K_BLOCKS)
              bar = pipe.producer_mbar(st)
              if scales:  # the consumers' generic reads of the slot before the TMA
                plgpu.commit_smem()
                plgpu.copy_gmem_to_smem(s_gmem.at[pl.ds(kb, 1)], s_ring.at[st.index], bar)
              plgpu.copy_gmem_to_smem(a_gmem.at[:, pl.ds(kb * K_BLOCK, K_BLOCK)],
                                      a_ring.at[st.index], bar)
              plgpu.copy_gmem_to_smem(b_gmem.at[:, pl.ds(kb * K_BLOCK, K_BLOCK)],
                                      b_ring.at[st.index], bar)
            return carry
          lax.fori_loop(0, steps, load, 0)

      @pl.when(wg < w)
      def _consumer():
        plgpu.set_max_registers(CONSUMER_REGISTERS[w], action="increase")

        def step(i, carry):
          sums, slot = carry
          with pipe.consume_slot(slot):
            a_rows = a_ring.at[slot, pl.ds(wg * 64, 64)]
            a = (plgpu.load(a_rows, layout=plgpu.Layout.WGMMA_8BIT) if a_in_registers
                 else a_rows)
            factor = None
            if scales:
              factor = plgpu.load(s_ring.at[slot, 0, pl.ds(wg * 64, 64)],
                                  layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
            if b_scales:
              kb = lax.rem(i, RING_K_BLOCKS)
              b0, b1 = bs_gmem[kb, 0], bs_gmem[kb, 1]
            out = []
            for c in range(chunks):
              block = _block(a, b_ring.at[slot, pl.ds(c * n, n)], n)
              for q in range(0, n, piece):
                part = block if piece == n else block[:, q:q + piece]
                if b_scales:
                  b = jnp.where(c * n + q < boundary, b0, b1)
                else:
                  b = jnp.float32(1.0001)
                if scales:
                  f = lax.broadcast_in_dim(factor * b, part.shape, [0])
                else:
                  f = jnp.broadcast_to(b, part.shape)
                out.append(sums[len(out)] + part * f)
          return tuple(out), pipe.next_index(slot)
        zero = plgpu.layout_cast(jnp.zeros((64, piece), jnp.float32), plgpu.Layout.WGMMA)
        sums, _ = lax.fori_loop(0, steps, step,
                                ((zero,) * (chunks * n // piece), jnp.int32(0)))
        for j, part in enumerate(sums):
          out_gmem[lax.axis_index("sm"), pl.ds(wg * 64, 64), pl.ds(j * piece, piece)] = part

    pl.run_scoped(
        scope,
        plgpu.SMEM((stages, rows, K_BLOCK), f8, transforms=tiled(f8, K_BLOCK)),
        plgpu.SMEM((stages, cols, K_BLOCK), f8, transforms=tiled(f8, K_BLOCK)),
        plgpu.SMEM((stages, 1, rows), jnp.float32),
        **ProducerConsumerPipeline.barriers(stages, full_arrivals=2 + scales,
                                            empty_arrivals=w),
        collective_axes="wg")

  avals = (jax.ShapeDtypeStruct((rows, RING_K_BLOCKS * K_BLOCK), f8),
           jax.ShapeDtypeStruct((cols, RING_K_BLOCKS * K_BLOCK), f8),
           jax.ShapeDtypeStruct((RING_K_BLOCKS, rows), jnp.float32),
           jax.ShapeDtypeStruct((RING_K_BLOCKS, 2), jnp.float32))
  return _launch(body, w, rows, cols, sms), avals


def time_case(w, n, chunks, steps, with_fill, a_in_registers, lower_only=False,
              stages=0, scales=False, b_scales=False):
  """(TFLOP/s, fill bytes/s) of one case; (None, None) with lower_only (CPU).
  With stages the ring brings the operands (with_fill ignored: the fill is real)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  copies = fill_copies(w, n, chunks, steps) if with_fill and not stages else 0
  # SMEM bytes written a CTA: the ring's fill, or the writer's copies.
  written = steps * (64 * w + n * chunks) * 128 if stages else copies * WRITER_ROWS * 128
  f, avals = build(w, n, chunks, steps, copies, a_in_registers,
                   stages=stages, scales=scales, b_scales=b_scales)
  if lower_only:
    f.trace(*avals).lower(lowering_platforms=("cuda",))
    return None, None
  rng = np.random.default_rng(0)
  ops = [jnp.asarray(rng.integers(-3, 4, a.shape).astype(np.float32)).astype(a.dtype)
         if a.dtype != jnp.float32 else jnp.exp2(jnp.asarray(rng.integers(-2, 3, a.shape),
                                                             jnp.float32))
         for a in avals]
  out = f(*ops)
  if bool(jnp.isnan(out).any()):
    raise AssertionError(f"{w}x{n}x{chunks}: NaN in the sums")
  times = []
  for _ in range(7):
    start = time.perf_counter()
    jax.block_until_ready(f(*ops))
    times.append(time.perf_counter() - start)
  t = float(np.median(times))
  sms = out.shape[0]
  flops = sms * w * 64 * n * chunks * 128 * 2 * steps
  return flops / t / 1e12, written * sms / t


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--cases", default="3x128,3x96,2x128,2x160,2x192,2x128x2")
  p.add_argument("--steps", type=int, default=4000)
  p.add_argument("--a_in_registers", action="store_true",
                 help="A loaded from SMEM into registers each step, the WGMMA's A from them")
  p.add_argument("--stages", type=int, default=0,
                 help="bring A and B through a ring of this many slots (0: resident)")
  p.add_argument("--scales", action="store_true",
                 help="with --stages: each slot's a-scales too, multiplied in the promotion")
  p.add_argument("--b_scales", action="store_true",
                 help="with --stages: two b-scale blocks from GMEM a step, one per 32-column "
                      "piece (a wide tile's, as 128 x 160)")
  p.add_argument("--lower", action="store_true", help="CUDA lowering only (any machine)")
  args = p.parse_args(argv)
  if (args.scales or args.b_scales) and not args.stages:
    p.error("--scales and --b_scales need --stages")
  if args.b_scales and any(parse_case(c)[1] % 32 for c in args.cases.split(",")):
    p.error("--b_scales takes 32-column pieces: N a multiple of 32")
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  for case in args.cases.split(","):
    w, n, chunks = parse_case(case)
    tile = f"{64 * w} x {n * chunks}"
    for with_fill in (False,) if args.stages else (False, True):
      tflops, fill = time_case(w, n, chunks, args.steps, with_fill, args.a_in_registers,
                               lower_only=args.lower, stages=args.stages,
                               scales=args.scales, b_scales=args.b_scales)
      what = f"{case} ({tile}{', A in registers' if args.a_in_registers else ''})" + (
          " + ring fill" if with_fill else "") + (
          f" ring of {args.stages}{' + a-scales' if args.scales else ''}"
          f"{' + GMEM b-scales' if args.b_scales else ''}" if args.stages else "")
      if args.lower:
        print(f"{what:44s} lowered", flush=True)
      else:
        print(f"{what:44s} {tflops:7.1f} TFLOP/s  fill {fill / 1e12:5.2f} TB/s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
