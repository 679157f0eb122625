"""The grouped GEMMs and the training op sharded over several devices (issue 23).

On a machine with >= 2 GPUs, all of them take part (2, 4 or 8: the most it
has): expert, data and tensor parallelism over real GPUs, NCCL collectives,
DeepSeek-V3-like shapes, the Pallas kernels. Elsewhere two of the CPU
devices (tests/conftest.py makes 8) run the same logic on small shapes with
the reference backend, so CI exercises, and can fail, every assertion here.
backend="auto" throughout.

Each case compares the sharded result
- with the same call on ONE device (device 0, unsharded): bitwise where no
  reduction crosses devices (the same arithmetic per element), else within
  the float32 bound (a sum over devices changes the reduction order);
- with the float64 reference (testing.reference_*_f64, dense_reference_f64)
  within the project's bounds (float32 2.5e-4 on GPU tensor cores, 1e-5 on the
  CPU; bfloat16 4e-3);
- and counts the compiled HLO's collectives: those the sharding rules promise
  (jax_fp8/grouped_sharding.py) for the grouped ops, none for the quantisers
  split in whole 128-groups (jax_fp8/quantize_sharding.py); for jax_fp8.dense,
  per kind no more than a bfloat16 `x @ kernel` forward and backward compiled
  with the same shardings needs.

The quantisers take the fused Pallas kernels on Hopper/Blackwell GPUs; on the
CPU the jnp quantisers stand in for them (testing.jnp_quantize_kernels: the
same bits), so CI runs the kernels' partitioning here too.

Every check of a case runs and prints its result (pytest -rP shows them for
passed tests); a case fails at the end listing each check that did not hold.
"""
from __future__ import annotations

import contextlib
import functools
import math
import re
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_fp8
from jax_fp8 import testing
from sharding_util import COLLECTIVES, collectives

F32, BF16 = jnp.float32, jnp.bfloat16
CPU_DEVICES = 2  # on a machine without 2 GPUs: the CPU devices this file uses


def _gpus():
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


def _devices():
  """The GPUs if there are >= 2 (2, 4 or 8 of them: the largest such count, so
  that the 8 experts, the rows and the 128-column blocks split evenly), else
  CPU_DEVICES CPU devices."""
  gpus = _gpus()
  if len(gpus) >= 2:
    return gpus[:max(n for n in (2, 4, 8) if n <= len(gpus))]
  return jax.devices("cpu")[:CPU_DEVICES]


DEVICES = _devices()
ON_GPU = DEVICES[0].platform == "gpu"
pytestmark = pytest.mark.skipif(len(DEVICES) < 2, reason="needs >= 2 GPUs or 2 CPU devices")

# Relative Frobenius bounds: float32 outputs of the WGMMA kernels sum a 128-deep
# K block with ~14 bits before the float32 promotion (README, "Accuracy on
# hardware"); the CPU reference and interpret mode keep 1e-5.
BOUND = {np.dtype(F32): 2.5e-4 if ON_GPU else testing.TOLERANCE[np.dtype(F32)],
         np.dtype(BF16): testing.TOLERANCE[np.dtype(BF16)]}


# ---- shapes ---------------------------------------------------------------------------
# GPU: DeepSeek-V3-like (masked: the expert's gate+up projection 7168 -> 2 x 2048 for
# 256 tokens per expert; ragged: its down projection 2048 -> 7168 over 4096 routed
# rows; dense: a 7168 -> 2048 layer over 4096 tokens). CPU: small, for CI.
# Group sizes: empty, one row, one short of and one past a 128-row tile; the ragged
# groups end short of M (rows past the sum are 0) and straddle every shard
# boundary of M over 2, 4 and 8 devices (GPU) or 2 (CPU).
MASKED_M = (0, 256, 1, 127, 129, 200, 3, 255)
if ON_GPU:
  MASKED = dict(m=256, n=4096, k=7168)
  RAGGED = dict(m=4096, n=7168, k=2048, sizes=(0, 1, 127, 129, 1500, 900, 800, 339))
  DENSE = dict(tokens=4096, k=7168, n=2048)
  FUSED = dict(m=4096, n=4096, k=7168)   # the GLU: F = n / 2 gate and up rows each
else:
  MASKED = dict(m=256, n=256, k=384)
  RAGGED = dict(m=512, n=256, k=256, sizes=(0, 1, 127, 129, 100, 60, 40, 20))
  DENSE = dict(tokens=512, k=256, n=512)
  FUSED = dict(m=256, n=512, k=256)


# ---- checks ---------------------------------------------------------------------------

def collective_lines(hlo: str) -> list[str]:
  """The collective instructions, shortened: what moved where (for the log)."""
  pattern = re.compile(rf"\s(?:{'|'.join(COLLECTIVES)})(?:-start)?\(")
  return [line.strip().split(", metadata=")[0][:240] for line in hlo.splitlines()
          if pattern.search(line)]


def _f32(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x).astype(F32))


class Checks:
  """Soft assertions for one case: every check runs and prints a line; done()
  fails listing the checks that did not hold (one run on the device must show
  them all, not stop at the first)."""

  def __init__(self, case: str):
    self.case, self.failed = case, []

  def run(self, what: str, fn, *args, **kwargs):
    try:
      detail = fn(*args, **kwargs)
    except AssertionError as e:
      self.failed.append(f"{what}: {e}")
      print(f"[{self.case}] FAILED {what}: {e}")
    else:
      print(f"[{self.case}] ok {what}" + (f": {detail}" if detail else ""))

  def note(self, line: str):
    print(f"[{self.case}] {line}")

  def done(self):
    if self.failed:
      raise AssertionError(f"{self.case}: {len(self.failed)} check(s) failed:\n  "
                           + "\n  ".join(self.failed))


def close_to_reference(out, ref: np.ndarray, dtype) -> str:
  """Within the bound of dtype against a float64 reference (NaN never passes)."""
  bound = BOUND[np.dtype(dtype)]
  err = testing.assert_close(out, ref, dtype, tol=bound)
  return f"relative error {err:.2e} (bound {bound:.1e})"


def same_as_one_device(out, one, dtype, *, bitwise: bool) -> str:
  """Equal to the one-device result: bitwise (where no sum crosses devices),
  else within the bound of dtype. NaN never passes either."""
  if np.dtype(out.dtype) != np.dtype(one.dtype) or out.shape != one.shape:
    raise AssertionError(f"{out.dtype}{list(out.shape)} vs one device's "
                         f"{one.dtype}{list(one.shape)}")
  got, want = _f32(out), _f32(one)
  differ = int(np.sum(~(got == want)))  # NaN counts as differing
  bound = BOUND[np.dtype(dtype)]
  err = testing.rel_error(got, want.astype(np.float64))
  summary = (f"{differ} of {got.size} entries differ, relative error {err:.2e}" if differ
             else "bitwise equal")
  if bitwise and differ:
    idx = tuple(int(i) for i in np.argwhere(~(got == want))[0])
    raise AssertionError(f"expected bitwise equality: {summary}; first at {idx}: "
                         f"{got[idx]!r} vs {want[idx]!r}")
  if not err <= bound:
    raise AssertionError(f"{summary} > {bound:.1e}")
  return summary + ("" if bitwise else f" (bound {bound:.1e}: the sum crosses devices)")


def collectives_are(hlo: str, expect: dict[str, int]) -> str:
  got = collectives(hlo)
  if got != expect:
    raise AssertionError(f"{got} != {expect} promised; the collectives:\n    "
                         + "\n    ".join(collective_lines(hlo)))
  return str(got)


def collectives_at_most(hlo: str, baseline_hlo: str) -> str:
  """Per kind, no more collectives than the baseline's."""
  got, base = collectives(hlo), collectives(baseline_hlo)
  if not base:
    raise AssertionError("the baseline has no collectives: the counter finds nothing to "
                         "compare with (its HLO format changed?)")
  extra = {op: n for op, n in got.items() if n > base.get(op, 0)}
  if extra:
    raise AssertionError(f"{got} but the bf16 matmul needs {base}; ours:\n    "
                         + "\n    ".join(collective_lines(hlo)) + "\n  bf16's:\n    "
                         + "\n    ".join(collective_lines(baseline_hlo)))
  return f"{got or '{}'} (bf16 with the same shardings: {base})"


def no_replication_warning(messages: list[str]) -> str:
  ours = [m for m in messages if "blockwise_fp8_" in m or "replicating" in m]
  if ours:
    raise AssertionError(f"a split was not honoured: {ours}")
  return ""


# ---- running ----------------------------------------------------------------------------

def _mesh(shape, names):
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                       devices=DEVICES[:math.prod(shape)])


def on_one_device(fn, *args):
  """fn(*args) jit-compiled on device 0 alone (the reference for the sharded runs)."""
  args = [jax.device_put(a, DEVICES[0]) for a in args]
  t0 = time.perf_counter()
  out = jax.block_until_ready(jax.jit(fn)(*args))
  print(f"one device ({DEVICES[0]}): compiled and ran in {time.perf_counter() - t0:.1f} s")
  return out


def sharded(fn, mesh, in_specs, out_specs, *args):
  """fn(*args) jit-compiled with these shardings: (outputs, compiled HLO text, warnings)."""
  shard = lambda spec: NamedSharding(mesh, spec)
  out_shardings = jax.tree.map(shard, out_specs, is_leaf=lambda s: isinstance(s, P))
  f = jax.jit(fn, in_shardings=tuple(map(shard, in_specs)), out_shardings=out_shardings)
  args = [jax.device_put(a, shard(s)) for a, s in zip(args, in_specs)]
  t0 = time.perf_counter()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    compiled = f.lower(*args).compile()
  t1 = time.perf_counter()
  out = jax.block_until_ready(compiled(*args))
  print(f"mesh {dict(mesh.shape)}: compiled in {t1 - t0:.1f} s, "
        f"ran in {time.perf_counter() - t1:.2f} s")
  return out, compiled.as_text(), [str(w.message) for w in caught]


# ---- masked: expert parallelism over G ------------------------------------------------

def _masked_fn(*xs):
  return jax_fp8.blockwise_fp8_masked_dot(*xs, out_dtype=F32, backend="auto")


@functools.cache
def _masked_operands():
  return testing.random_masked_operands(23, MASKED["m"], MASKED["n"], MASKED["k"], MASKED_M)


def test_masked_dot_sharded_over_experts():
  """Each device its experts (a, its scales, b, its scales and masked_m split over
  G): no communication, and every element computed as on one device."""
  ops = _masked_operands()
  checks = Checks(f"masked G={len(MASKED_M)} {MASKED} over {len(DEVICES)} devices")
  ref = testing.reference_masked_f64(*ops.args())
  one = on_one_device(_masked_fn, *ops.args())
  checks.run("one device vs float64", close_to_reference, one, ref, F32)
  mesh = _mesh((len(DEVICES),), ("expert",))
  out, hlo, messages = sharded(_masked_fn, mesh, (P("expert"),) * 5, P("expert"), *ops.args())
  checks.run("sharded vs float64", close_to_reference, out, ref, F32)
  checks.run("sharded vs one device", same_as_one_device, out, one, F32, bitwise=True)
  checks.run("collectives", collectives_are, hlo, {})
  checks.run("no replication warning", no_replication_warning, messages)
  checks.done()


# ---- ragged: rows (M) or experts (G) --------------------------------------------------

def _ragged_fn(*xs):
  return jax_fp8.blockwise_fp8_ragged_dot(*xs, out_dtype=BF16, backend="auto")


@functools.cache
def _ragged_operands():
  return testing.random_ragged_operands(29, RAGGED["m"], RAGGED["n"], RAGGED["k"],
                                        RAGGED["sizes"])


@functools.cache
def _ragged_one_device():
  ops = _ragged_operands()
  return on_one_device(_ragged_fn, *ops.args()), testing.reference_ragged_f64(*ops.args())


# rule: specs of (a, a_scale, b, b_scale, group_sizes), output spec, the collectives
# grouped_sharding.py promises. M: each device its rows, the groups' intersections
# with them. G: a replicated, each device the rows of its experts (0 elsewhere),
# one psum, exact in bfloat16 (a row is non-zero on one device only): bitwise.
RAGGED_RULES = {
    "M": ((P("x"), P("x"), P(), P(), P()), P("x"), {}),
    "G": ((P(), P(), P("x"), P("x"), P()), P(), {"all-reduce": 1}),
}


@pytest.mark.parametrize("rule", list(RAGGED_RULES))
def test_ragged_dot_sharded(rule):
  in_specs, out_spec, expect = RAGGED_RULES[rule]
  ops = _ragged_operands()
  checks = Checks(f"ragged {rule} {RAGGED} over {len(DEVICES)} devices")
  one, ref = _ragged_one_device()
  checks.run("one device vs float64", close_to_reference, one, ref, BF16)
  mesh = _mesh((len(DEVICES),), ("x",))
  out, hlo, messages = sharded(_ragged_fn, mesh, in_specs, out_spec, *ops.args())
  checks.run("sharded vs float64", close_to_reference, out, ref, BF16)
  checks.run("sharded vs one device", same_as_one_device, out, one, BF16, bitwise=True)
  checks.run("collectives", collectives_are, hlo, expect)
  checks.run("no replication warning", no_replication_warning, messages)
  checks.done()


# ---- quantisers: the fused kernels shard by shard ---------------------------------------

def _kernel_path():
  """The quantisers' kernel path: the Pallas kernels on GPUs, their stand-in on the CPU."""
  return contextlib.nullcontext() if ON_GPU else testing.jnp_quantize_kernels()


QUANTIZERS = ("quantize_1x128", "quantize_1x128_with_transpose", "quantize_128x128",
              "quantize_128x128_with_transpose")


@pytest.mark.parametrize("split", ["rows", "columns"])
@pytest.mark.parametrize("op", QUANTIZERS)
def test_quantizer_sharded(op, split):
  """x [tokens, K] split over all devices in whole 128-groups (rows or columns):
  each device quantises its shard (no communication), bitwise as on one device;
  the transposed outputs come transposed-sharded."""
  x = _dense_data()[0].astype(BF16)
  fn = lambda x: getattr(jax_fp8, op)(x)   # backend="auto"
  checks = Checks(f"{op} {x.shape} split by {split} over {len(DEVICES)} devices")
  with _kernel_path():
    one = on_one_device(fn, x)
    mesh = _mesh((len(DEVICES),), ("x",))
    spec = P("x", None) if split == "rows" else P(None, "x")
    transposed = P(*reversed(tuple(spec)))
    out_specs = ((spec,) * 2 + (transposed,) * 2)[:len(one)]
    out, hlo, messages = sharded(fn, mesh, (spec,), out_specs, x)
  for name, o, w in zip(("q", "s", "q_t", "s_t"), out, one):
    checks.run(f"sharded {name} vs one device", same_as_one_device, o, w, F32, bitwise=True)
  checks.run("collectives", collectives_are, hlo, {})
  checks.run("no replication warning", no_replication_warning, messages)
  checks.done()


# ---- dense: forward and backward, data and tensor parallel ------------------------------

def _fwd_bwd(x, kernel, dy):
  y, vjp = jax.vjp(jax_fp8.dense, x, kernel)
  return (y, *vjp(dy))


def _bf16_fwd_bwd(x, kernel, dy):
  y, vjp = jax.vjp(jnp.matmul, x, kernel)
  return (y, *vjp(dy))


@functools.cache
def _dense_data():
  """x [T, K], kernel [K, N], dy [T, N] in float32: normal values, blocks of 128
  tokens of x and dy and columns of the kernel scaled over 2^-4 .. 2^4 so the
  quantisers' scales span binades (a token or column paired with another's scale
  shows). Whole 128-token blocks, not single tokens: a column group along the
  tokens (the wgrad's) holding values 2^8 apart, summed with cancellation, is
  beyond what FP8 tensor cores hold to 2.5e-4 (H200, 4096 tokens: 2.65e-4 on
  one device, so not a sharding error)."""
  t, k, n = DENSE["tokens"], DENSE["k"], DENSE["n"]
  rng = np.random.default_rng(31)
  spread = lambda *shape: np.exp2(rng.uniform(-4, 4, shape)).astype(np.float32)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  token_blocks = lambda: np.repeat(spread(-(-t // 128), 1), 128, axis=0)[:t]
  x = normal(t, k) * token_blocks()
  kernel = normal(k, n) * spread(1, n) / np.float32(np.sqrt(k))
  dy = normal(t, n) * token_blocks()
  return tuple(map(jnp.asarray, (x, kernel, dy)))


@functools.cache
def _dense_one_device():
  x, kernel, dy = _dense_data()
  # The recipe simulated in float64 with jax_fp8's quantisers (their last bits are
  # the quantiser tests' business): the wiring of the three GEMMs.
  ref = testing.dense_reference_f64(x, kernel, dy, testing.quantize_jnp)
  return on_one_device(_fwd_bwd, x, kernel, dy), ref


def _dense_layouts(n_devices):
  """(name, mesh shape (data, tensor)): on 2 devices data and tensor parallel
  separately, on more both at once."""
  if n_devices == 2:
    return [("data", (2, 1)), ("tensor", (1, 2))]
  return [("data+tensor", (2, n_devices // 2))]


@pytest.mark.parametrize("layout,mesh_shape", _dense_layouts(len(DEVICES)),
                         ids=[name for name, _ in _dense_layouts(len(DEVICES))])
def test_dense_forward_and_backward_sharded(layout, mesh_shape):
  """Tokens over "data", the kernel's N over "tensor". y = x @ kernel contracts
  over the unsharded K: bitwise. dgrad contracts over N (a sum across the
  tensor axis), wgrad over the tokens (across the data axis): bitwise only where
  that axis has one device."""
  x, kernel, dy = _dense_data()
  data, tensor = mesh_shape
  checks = Checks(f"dense {layout} {DENSE} on a {mesh_shape} mesh")
  one, ref = _dense_one_device()
  names = ("y", "dx", "dkernel")
  for name, o, r in zip(names, one, ref):
    checks.run(f"one device {name} vs float64", close_to_reference, o, r, F32)
  mesh = _mesh(mesh_shape, ("data", "tensor"))
  in_specs = (P("data", None), P(None, "tensor"), P("data", "tensor"))
  out_specs = (P("data", "tensor"), P("data", None), P(None, "tensor"))
  with _kernel_path():
    out, hlo, messages = sharded(_fwd_bwd, mesh, in_specs, out_specs, x, kernel, dy)
  bitwise = {"y": True, "dx": tensor == 1, "dkernel": data == 1}
  for name, o, r, w in zip(names, out, ref, one):
    checks.run(f"sharded {name} vs float64", close_to_reference, o, r, F32)
    checks.run(f"sharded {name} vs one device", same_as_one_device, o, w, F32,
               bitwise=bitwise[name])
  # The baseline: bfloat16 x @ kernel, forward and backward, the same shardings
  # (compiled only).
  shard = lambda spec: NamedSharding(mesh, spec)
  avals = [jax.ShapeDtypeStruct(v.shape, BF16, sharding=shard(s))
           for v, s in zip((x, kernel, dy), in_specs)]
  baseline = jax.jit(_bf16_fwd_bwd, out_shardings=tuple(map(shard, out_specs)))
  baseline_hlo = baseline.lower(*avals).compile().as_text()
  checks.run("collectives", collectives_at_most, hlo, baseline_hlo)
  checks.run("no replication warning", no_replication_warning, messages)
  checks.done()


# ---- the fused epilogues: FP8 output over N, the GLU over tokens ------------------------

FP8 = jnp.float8_e4m3fn
FUSED_CASES = {
    # name: (fn, in specs of (a, a_scale, b, b_scale), out spec)
    "dot_fp8_columns": (lambda *xs: jax_fp8.blockwise_fp8_dot(*xs, out_dtype=FP8, backend="auto"),
                        (P(), P(), P("d"), P("d")), P(None, "d")),
    "glu_fp8_rows": (lambda *xs: jax_fp8.blockwise_fp8_glu(*xs, out_dtype=FP8, backend="auto"),
                     (P("d"), P("d"), P(), P()), P("d")),
}


@pytest.mark.parametrize("name", list(FUSED_CASES))
def test_fused_sharded(name):
  """jax_fp8/fused_sharding.py: the FP8-output dot's N in whole 128-column
  groups, the GLU's tokens: each device its part, nothing moved, every element
  (and every scale) as on one device."""
  fn, in_specs, out_spec = FUSED_CASES[name]
  ops = testing.random_operands(sum(map(ord, name)), FUSED["m"], FUSED["n"], FUSED["k"])
  args = ops.args()[:4]
  checks = Checks(f"{name} {FUSED} over {len(DEVICES)} devices")
  one = on_one_device(fn, *args)
  mesh = _mesh((len(DEVICES),), ("d",))
  out, hlo, messages = sharded(fn, mesh, in_specs, (out_spec, out_spec), *args)
  for what, o, w in zip(("q", "scale"), out, one):
    checks.run(f"sharded {what} vs one device", same_as_one_device, o, w, F32, bitwise=True)
  checks.run("collectives", collectives_are, hlo, {})
  checks.run("no replication warning", no_replication_warning, messages)
  checks.done()
