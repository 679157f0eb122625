#!/usr/bin/env python3
"""Bandwidth of jax_fp8's quantisers against the device's copy bandwidth.

For each shape [R, C] (activations [T, K] for the 1x128 quantisers, weights
[N, K] for quantize_128x128) it reports GB/s = (bytes read + bytes written) /
time: read R*C input elements, write R*C FP8 values per FP8 output and the
float32 scales. The peer is a plain copy of the same input (x * s, s a runtime
scalar so that XLA cannot drop it: R*C elements read and written, one XLA
kernel), the bandwidth a memory-bound elementwise kernel can reach; "of_copy"
= quantiser GB/s / copy GB/s; "vs_xla" = the XLA version's time / the Pallas
kernel's (speed-up of the fused kernel).

Ops (--ops, comma list; default all):
  copy                                   the peer above
  quantize_1x128, quantize_128x128       the jnp versions (XLA fusions)
  quantize_1x128_with_transpose          jnp: quantize_1x128(x) and quantize_1x128(x.T)
  pallas_quantize_1x128                  the Pallas kernels (pallas/quantize.py); a GPU
  pallas_quantize_1x128_with_transpose   only (CPU: reported unavailable)
  pallas_quantize_128x128
  pallas_quantize_128x128_with_transpose (q, s, q_t, s_t of a weight from one read)

Timing is benchmarks/harness/timing.py's, as for every benchmark: on a GPU, the kernel time
CUPTI records (jax.experimental.mosaic.gpu.profiler.measure, all kernels of one
call), warm, input sets rotated past the L2, median of --iters; on the CPU,
wall-clock median with block_until_ready (CPU numbers).

  python benchmarks/quantize.py                        # auto: GPU or CPU shapes
  python benchmarks/quantize.py --shapes=4096x7168,7168x16384 --json_out=q.json
  python benchmarks/quantize.py --ops=copy,quantize_1x128_with_transpose,\
      pallas_quantize_1x128_with_transpose --shapes=8192x7168
"""
from __future__ import annotations

import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness/ beside us

import harness  # noqa: E402,F401  (puts the repository root on sys.path)
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_fp8  # noqa: E402
from harness import cli  # noqa: E402
from harness import env as envs  # noqa: E402
from harness import timing  # noqa: E402
from workloads import common  # noqa: E402

FLAGS = flags.FLAGS
# DeepSeek-V3 activations [tokens, features] and a weight [N, K].
GPU_SHAPES = "4096x7168,8192x7168,16384x2048,4096x18432,7168x16384"
CPU_SHAPES = "256x1024,1024x2048"
XLA_OPS = ("quantize_1x128", "quantize_1x128_with_transpose", "quantize_128x128")
PALLAS_OPS = ("pallas_quantize_1x128", "pallas_quantize_1x128_with_transpose",
              "pallas_quantize_128x128", "pallas_quantize_128x128_with_transpose")
OPS = ("copy",) + XLA_OPS + PALLAS_OPS


def define_flags():
  flags.DEFINE_string("shapes", "auto", f"comma list of RxC; auto: {GPU_SHAPES} on a GPU, "
                      f"{CPU_SHAPES} on the CPU")
  flags.DEFINE_enum("in_dtype", "bfloat16", ["bfloat16", "float32"], "input dtype")
  flags.DEFINE_bool("power_of_two_scales", False, "UE8M0-style power-of-two scales")
  flags.DEFINE_integer("iters", 20, "timed iterations (the median is reported)")
  flags.DEFINE_integer("warmup", 2, "untimed warm-up iterations")
  flags.DEFINE_integer("rotate_mb", 256, "rotate input sets covering at least this many MB")
  flags.DEFINE_integer("max_sets", 8, "at most this many input sets")
  flags.DEFINE_string("json_out", None, "write the results as JSON here")
  flags.DEFINE_string("ops", "all", f"comma list of ops ({', '.join(OPS)}) or all; copy is "
                      "always timed first (of_copy needs it)")


def parse_shapes(spec, on_gpu):
  if spec == "auto":
    spec = GPU_SHAPES if on_gpu else CPU_SHAPES
  shapes = [cli.parse_dims(item, 2, "shapes", "RxC with two positive integers")
            for item in cli.split_list(spec)]
  if not shapes:
    raise cli.UsageError("--shapes is empty")
  return shapes


def parse_ops(spec):
  if spec == "all":
    return OPS
  ops = tuple(o.strip() for o in spec.split(",") if o.strip())
  for o in ops:
    if o not in OPS:
      raise cli.UsageError(f"--ops: unknown op {o!r} (known: {', '.join(OPS)})")
  return ("copy",) + tuple(o for o in ops if o != "copy")


def op_fn(op, pow2):
  if op == "copy":
    return lambda x, s: x * s
  if op.startswith("pallas_"):
    from jax_fp8.pallas import quantize as pallas_quantize  # a GPU (or interpret mode) only
    name = op[len("pallas_"):]
    if name == "quantize_128x128_with_transpose":
      return functools.partial(pallas_quantize.quantize_128x128, power_of_two_scales=pow2,
                               with_transpose=True)
    return functools.partial(getattr(pallas_quantize, name), power_of_two_scales=pow2)
  rowwise = functools.partial(jax_fp8.quantize_1x128, power_of_two_scales=pow2, backend="jnp")
  if op == "quantize_1x128":
    return rowwise
  if op == "quantize_1x128_with_transpose":
    return lambda x: (*rowwise(x), *rowwise(x.T))
  return functools.partial(jax_fp8.quantize_128x128, power_of_two_scales=pow2, backend="jnp")


def op_bytes(op, r, c, in_bytes):
  """Bytes read + written: the input once, each FP8 output, each float32 scale array."""
  if op == "copy":
    return 2 * r * c * in_bytes
  op = op[len("pallas_"):] if op.startswith("pallas_") else op
  nr, nc = common.blocks(r), common.blocks(c)
  if op == "quantize_1x128":
    return r * c * in_bytes + r * c + 4 * r * nc
  if op == "quantize_1x128_with_transpose":
    return r * c * in_bytes + 2 * r * c + 4 * (r * nc + c * nr)
  if op == "quantize_128x128":
    return r * c * in_bytes + r * c + 4 * nr * nc
  return r * c * in_bytes + 2 * r * c + 8 * nr * nc  # 128x128 with its transpose


def run(shapes, in_dtype, pow2, iters, warmup, rotate_mb, max_sets, env, log=print,
        ops=OPS, on_shape_done=lambda out: None):
  """Times `ops` at each shape; on_shape_done(results so far) after each shape."""
  on_gpu = env.on_gpu
  in_bytes = np.dtype(in_dtype).itemsize
  log(f"device: {env.description()}")
  log("method: " + ("GPU kernel time through CUPTI (mosaic.gpu.profiler.measure)" if on_gpu
                    else "CPU wall clock (CPU numbers)")
      + f", median of {iters}, input sets rotated (>= {rotate_mb} MB, at most {max_sets}); "
      "GB/s = (bytes read + written) / time")
  head = f"{'shape RxC':<14}{'op':<40}{'ms':>10}{'GB/s':>10}{'of_copy':>9}{'vs_xla':>8}"
  log(head)
  log("-" * len(head))
  results = []

  def summary(complete):
    return {"device": env.description(), "platform": "gpu" if on_gpu else "cpu",
            "jax_version": jax.__version__, "power_of_two_scales": pow2,
            "in_dtype": np.dtype(in_dtype).name, "complete": complete,
            "method": ("cupti kernel time" if on_gpu else "cpu wall clock")
            + f", median of {iters}, rotating input sets", "results": results}

  for (r, c) in shapes:
    nsets = timing.num_sets(2 * r * c * in_bytes, rotate_mb, max_sets)
    keys = jax.random.split(jax.random.key(r * 7919 + c), nsets)
    xs = [(jax.random.normal(kk, (r, c), jnp.float32) * 3).astype(in_dtype) for kk in keys]
    copy_gbs, xla_ms = None, {}
    for op in ops:
      row = {"rows": r, "cols": c, "op": op, "in_dtype": np.dtype(in_dtype).name,
             "input_sets": nsets, "bytes": op_bytes(op, r, c, in_bytes)}
      if op.startswith("pallas_") and not on_gpu:
        row["error"] = "the Pallas kernels need a GPU (tests run them in GPU interpret mode)"
        log(f"{f'{r}x{c}':<14}{op:<40}  unavailable: {row['error']}")
        results.append(row)
        continue
      fn = op_fn(op, pow2)
      args = [(x, jnp.asarray(1.5, in_dtype)) if op == "copy" else (x,) for x in xs]
      try:
        if on_gpu:
          ms, kernels, _ = timing.time_jax_gpu(fn, args, iters, warmup,
                                               out_bytes=r * c * in_bytes)
          row["kernels"] = kernels
        else:
          ms, _ = timing.time_cpu(fn, args, iters, warmup)
        row["ms"] = ms
        row["gbs"] = row["bytes"] / (ms * 1e-3) / 1e9
        if op == "copy":
          copy_gbs = row["gbs"]
        row["of_copy"] = row["gbs"] / copy_gbs if copy_gbs else None
        if op in XLA_OPS:
          xla_ms[op] = ms
        xla = xla_ms.get(op[len("pallas_"):])
        row["vs_xla"] = xla / ms if op.startswith("pallas_") and xla else None
        of = "-" if row["of_copy"] is None else f"{row['of_copy']:.2f}"
        vs = "-" if row["vs_xla"] is None else f"{row['vs_xla']:.2f}"
        log(f"{f'{r}x{c}':<14}{op:<40}{ms:>10.4f}{row['gbs']:>10.1f}{of:>9}{vs:>8}")
      except Exception as e:  # noqa: BLE001 (reported, not fatal)
        row["error"] = timing.short_error(e)
        log(f"{f'{r}x{c}':<14}{op:<40}  unavailable: {row['error']}")
      results.append(row)
    del xs
    on_shape_done(summary(complete=False))
  return summary(complete=True)


def _main():
  env = envs.detect()
  shapes = parse_shapes(FLAGS.shapes, env.on_gpu)
  if not env.on_gpu:
    print("no GPU found: CPU numbers")
  ops = parse_ops(FLAGS.ops)

  def write(out):
    if FLAGS.json_out:  # after every shape: a run cut short keeps what it measured
      with open(FLAGS.json_out, "w") as f:
        json.dump(out, f, indent=1)

  write(run(shapes, np.dtype(FLAGS.in_dtype), FLAGS.power_of_two_scales, max(1, FLAGS.iters),
            max(0, FLAGS.warmup), FLAGS.rotate_mb, max(1, FLAGS.max_sets), env, log=cli.log,
            ops=ops, on_shape_done=write))
  if FLAGS.json_out:
    print(f"wrote {FLAGS.json_out}")
  return 0


def main(argv):
  return cli.run_main(_main, argv)


if __name__ == "__main__":
  define_flags()
  app.run(main)
