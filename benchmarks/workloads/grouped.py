"""MoE grouped GEMMs: jax_fp8's ragged (contiguous) and masked ops against their peers.

    ragged:  out[r] = a[r] . b[g(r)]^T  (blockwise-scaled), rows laid out group after group
    masked:  out[g, r] = a[g, r] . b[g]^T for r < masked_m[g], else 0

Cases (issue 20): DeepSeek-V3's expert GEMMs, N x K = 4096 x 7168 (gate/up) and
7168 x 2048 (down). Contiguous: 4 groups of ~8192 rows and 8 of ~4096, summing to
32768, with group sizes drawn at random either as multiples of 128 ("aligned") or
not ("unaligned"). Masked: 1 x ~1024, 2 x ~512, 4 x ~256 and the decode layout
32 x ~64 rows, each group's count drawn at random in [0.7, 1.3] x the nominal
rows, in a buffer of capacity M (a multiple of 128 above 1.3 x nominal). The
masked op and DeepGEMM are both told the nominal rows (expected_m; DeepGEMM 1.2x
it, as its own tests do).

TFLOP/s counts the real rows only (2 * rows * N * K, rows = sum of the group
sizes or of masked_m); GB/s counts the bytes the FP8 problem must move (real rows
of a, their scales and output, every group's b and scales), the same for every
contender. bf16 peers run on the dequantised data (dequantised outside the timed
call); their error against the float64 reference is reported without a bound.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_fp8
from jax_fp8 import backends
from jax_fp8 import testing
from harness import checks
from harness import report
from harness import runner
from harness.registry import Contender, Registry, Unavailable
from workloads import common
from workloads import deepgemm
from workloads import dense

BF16 = np.dtype(jnp.bfloat16)
EXPERT_NK = ((4096, 7168), (7168, 2048))
TOTAL_ROWS = 32768
CONTIGUOUS = tuple((g, TOTAL_ROWS // g, n, k, aligned) for g in (4, 8) for n, k in EXPERT_NK
                   for aligned in (True, False))
MASKED = ((1, 1024, 4096, 7168), (2, 512, 4096, 7168), (4, 256, 7168, 2048),
          (32, 64, 4096, 7168), (32, 64, 7168, 2048))
SMALL_CONTIGUOUS = ((3, 100, 256, 384, False), (2, 128, 256, 384, True))
SMALL_MASKED = ((2, 24, 256, 384), (4, 8, 128, 256))
GPU_BF16_BOUND = 4e-3  # bf16 output (tests' bound); the f32 accumulation error is far below


@dataclasses.dataclass
class Options(runner.Options):
  mgpu_config: tuple = (128, 128, 64, 4, 4)  # ragged_dot_mgpu's block_m, block_n, block_k,
                                             # max_concurrent_steps, grid_block_n


@dataclasses.dataclass(frozen=True)
class Groups:
  """A case's layout: group sizes (contiguous) or row counts (masked), fixed per case."""
  layout: str              # "contiguous" | "masked"
  n: int
  k: int
  rows: int                # contiguous: rows of a (= the sum of sizes); masked: capacity M
  counts: tuple            # group_sizes or masked_m
  nominal: int             # the nominal rows per group (DeepGEMM's expected_m hint)

  @property
  def groups(self) -> int:
    return len(self.counts)


def _contiguous_sizes(rng, groups, total, aligned) -> tuple:
  """Random sizes in about [0.7, 1.3] x total / groups, summing to total; aligned:
  multiples of 128 (but the last, where total is not one)."""
  unit = common.BLOCK if aligned else 1
  w = rng.uniform(0.7, 1.3, groups)
  units = np.floor(w / w.sum() * (total // unit)).astype(int)
  for i in rng.permutation(groups)[:total // unit - units.sum()]:
    units[i] += 1
  sizes = [int(u) * unit for u in units]
  sizes[-1] += total - sum(sizes)
  return tuple(sizes)


def _masked_counts(rng, groups, nominal, capacity) -> tuple:
  return tuple(int(min(capacity, nominal * rng.uniform(0.7, 1.3))) for _ in range(groups))


def contiguous_case(groups, rows_per_group, n, k, aligned, seed) -> runner.Case:
  total = groups * rows_per_group
  rng = np.random.default_rng([seed, groups, total, n, k, int(aligned)])
  g = Groups("contiguous", n, k, total, _contiguous_sizes(rng, groups, total, aligned),
             rows_per_group)
  label = (f"contig {groups}x{rows_per_group} {n}x{k} "
           + ("aligned" if aligned else "unaligned"))
  dims = {"layout": "contiguous", "groups": groups, "m": total, "n": n, "k": k,
          "aligned": aligned, "group_sizes": list(g.counts)}
  return _case(label, dims, g, contract="ragged")


def masked_case(groups, nominal, n, k, seed) -> runner.Case:
  capacity = -(-int(np.ceil(1.3 * nominal) + 1) // common.BLOCK) * common.BLOCK
  rng = np.random.default_rng([seed, groups, nominal, n, k])
  g = Groups("masked", n, k, capacity, _masked_counts(rng, groups, nominal, capacity), nominal)
  dims = {"layout": "masked", "groups": groups, "m": capacity, "n": n, "k": k,
          "expected_m": nominal, "masked_m": list(g.counts)}
  return _case(f"masked {groups}x{nominal} {n}x{k}", dims, g, contract="masked")


def _case(label, dims, g: Groups, contract) -> runner.Case:
  real = sum(max(0, c) for c in g.counts)
  kb, nb = common.blocks(g.k), common.blocks(g.n)
  weights = g.groups * (g.n * g.k + 4 * nb * kb)
  a_rows = g.rows * (g.groups if g.layout == "masked" else 1)
  return runner.Case(
      label=label, dims=dims, flops=2.0 * real * g.n * g.k,
      bytes=float(real * (g.k + 4 * kb + 2 * g.n) + weights),
      set_bytes=a_rows * (g.k + 4 * kb + 2 * g.n) + weights, contract=contract, params=g)


def cases(presets, seed) -> list[runner.Case]:
  out = []
  for preset in presets:
    if preset in ("deepseek_v3", "contiguous"):
      out += [contiguous_case(*c, seed) for c in CONTIGUOUS]
    if preset in ("deepseek_v3", "masked"):
      out += [masked_case(*c, seed) for c in MASKED]
    if preset == "small":
      out += [contiguous_case(*c, seed) for c in SMALL_CONTIGUOUS]
      out += [masked_case(*c, seed) for c in SMALL_MASKED]
  return out


# ---- input sets ---------------------------------------------------------------------

@dataclasses.dataclass
class InputSet:
  a: jax.Array         # [M, K] (contiguous) or [G, M, K] (masked) e4m3
  a_scale: jax.Array   # [..., M, ceil(K/128)] f32
  b: jax.Array         # [G, N, K] e4m3
  b_scale: jax.Array   # [G, ceil(N/128), ceil(K/128)] f32
  group_sizes: jax.Array | None = None  # [G] int32 (contiguous)
  masked_m: jax.Array | None = None     # [G] int32 (masked)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _make_set(key, a_shape, groups, nk):
  n, k = nk
  ka, kb_, ksa, ksb = jax.random.split(key, 4)
  return (common.random_fp8(ka, a_shape),
          common.random_scales(ksa, (*a_shape[:-1], common.blocks(k))),
          common.random_fp8(kb_, (groups, n, k)),
          common.random_scales(ksb, (groups, common.blocks(n), common.blocks(k))))


def make_sets(case, count, seed) -> list[InputSet]:
  g: Groups = case.params
  a_shape = (g.rows, g.k) if g.layout == "contiguous" else (g.groups, g.rows, g.k)
  base = common.case_key(seed, g.groups, g.rows, g.n, g.k, sum(g.counts))
  counts = jnp.asarray(g.counts, jnp.int32)
  sets = []
  for i in range(count):
    arrays = _make_set(jax.random.fold_in(base, i), a_shape, g.groups, (g.n, g.k))
    sets.append(InputSet(*arrays, **({"group_sizes": counts} if g.layout == "contiguous"
                                     else {"masked_m": counts})))
  return sets


def _counts(s: InputSet):
  return s.group_sizes if s.group_sizes is not None else s.masked_m


def _dequantised(s: InputSet):
  """(a, b) in bf16, the data every bf16 peer multiplies."""
  return (jax_fp8.dequantize_1x128(s.a, s.a_scale, jnp.bfloat16),
          common.dequantize_weights(s.b, s.b_scale))


def _mask_rows(out, masked_m):
  """Rows past each group's count set to 0 (a peer computes or leaves them as it likes)."""
  rows = jnp.arange(out.shape[1])[None, :, None]
  return jnp.where(rows < jnp.asarray(masked_m)[:, None, None], out, 0)


# ---- contenders ---------------------------------------------------------------------

REGISTRY = Registry()
_is_contiguous = lambda case: case.params.layout == "contiguous"  # noqa: E731
_is_masked = lambda case: case.params.layout == "masked"  # noqa: E731
_OPS = {"contiguous": ("blockwise_fp8_ragged_dot", "ragged_dot"),
        "masked": ("blockwise_fp8_masked_dot", "masked_dot")}


def _jax_fp8(name, case, opts, env) -> Contender:
  g: Groups = case.params
  api_name, op = _OPS[g.layout]
  fn_api = common.api(api_name, "issue 20")
  backend = common.pallas_backend(env) if name == "pallas" else name
  common.needs_gpu_or_interpret(backend, env, interpret=None)
  resolved = backend
  if backend == "auto":
    try:
      resolved, _ = backends.select(env.platform, "auto", op, m=g.rows, n=g.n, k=g.k,
                                    out_dtype=BF16, has_c=False, groups=g.groups)
    except Exception:  # noqa: BLE001 (the call itself reports what fails)
      resolved = None
  # The masked op is told the nominal rows per group, as DeepGEMM is (its expected_m).
  hint = {"expected_m": g.nominal} if g.layout == "masked" else {}
  fn = lambda a, sa, b, sb, counts: fn_api(  # noqa: E731
      a, sa, b, sb, counts, out_dtype=jnp.bfloat16, backend=backend, **hint)
  prepare = lambda s: (s.a, s.a_scale, s.b, s.b_scale, _counts(s))  # noqa: E731
  bound = GPU_BF16_BOUND if env.on_gpu else testing.TOLERANCE[BF16]
  # The reference's float32 dots: cuBLAS, without XLA's slow Triton autotuning (dense.py).
  options = dense.CUBLAS_ONLY if env.on_gpu and resolved == "reference" else None
  return Contender(fn, prepare, bound=bound, resolved=resolved, compiler_options=options)


for _name in ("reference", *backends.PALLAS):
  REGISTRY.add(_name, f"jax_fp8 backend {_name!r} (blockwise_fp8_ragged_dot / "
               "blockwise_fp8_masked_dot)", role="backend")(functools.partial(_jax_fp8, _name))
REGISTRY.add("pallas", "the Pallas kernel of this GPU's generation", role="backend",
             in_all=False)(functools.partial(_jax_fp8, "pallas"))
REGISTRY.add("auto", 'whatever backend="auto" selects', role="backend", in_all=False)(
    functools.partial(_jax_fp8, "auto"))


@REGISTRY.add("pallas_direct", "this GPU's Pallas kernel called as jax_fp8.backends.select "
              "returns it (the backend's 2-D ragged_dot / masked_dot): the kernels before "
              "the public ops exist", role="backend", in_all=False)
def _pallas_direct(case, opts, env) -> Contender:
  g: Groups = case.params
  backend = common.pallas_backend(env)
  common.needs_gpu_or_interpret(backend, env, interpret=None)
  try:
    name, kernel = backends.select(env.platform, backend, _OPS[g.layout][1], m=g.rows, n=g.n,
                                   k=g.k, out_dtype=BF16, has_c=False)
  except jax_fp8.BackendUnavailableError as e:
    raise Unavailable(str(e)) from e
  fn = lambda a, sa, b, sb, counts: kernel(a, sa, b, sb, counts,  # noqa: E731
                                           out_dtype=jnp.bfloat16)
  prepare = lambda s: (s.a, s.a_scale, s.b, s.b_scale, _counts(s))  # noqa: E731
  return Contender(fn, prepare, bound=GPU_BF16_BOUND, resolved=name)


@REGISTRY.add("ragged_dot_bf16", "jax.lax.ragged_dot in bf16 on the dequantised data (what JAX "
              "users run today)", applies=_is_contiguous)
def _ragged_dot(case, opts, env) -> Contender:
  def prepare(s):
    a, b = _dequantised(s)
    return a, jnp.swapaxes(b, 1, 2), s.group_sizes  # lax.ragged_dot takes b as [G, K, N]
  return Contender(lambda a, b, gs: jax.lax.ragged_dot(a, b, gs), prepare)


@REGISTRY.add("ragged_dot_mgpu_bf16", "JAX's Pallas Mosaic GPU ragged_dot kernel "
              "(jax.experimental.pallas.ops.gpu.ragged_dot_mgpu) in bf16, --mgpu_config",
              applies=_is_contiguous)
def _ragged_dot_mgpu(case, opts, env) -> Contender:
  g: Groups = case.params
  if not env.on_gpu or env.target_compute_capability[0] != 9:
    raise Unavailable("needs an NVIDIA Hopper GPU (a WGMMA kernel)")
  try:
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu
  except ImportError as e:
    raise Unavailable(f"jax.experimental.pallas.ops.gpu.ragged_dot_mgpu: {e}") from e
  config = dict(zip(("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n"),
                    opts.mgpu_config))
  if g.k % config["block_k"] or g.n % config["block_n"]:
    raise Unavailable(f"--mgpu_config block_n/block_k must divide N={g.n} and K={g.k}")

  def fn(a, b, gs):
    return ragged_dot_mgpu.ragged_dot(a, b, group_sizes=gs, transpose_rhs=True, **config)

  return Contender(fn, lambda s: (*_dequantised(s), s.group_sizes),
                   extra={"config": "x".join(str(v) for v in opts.mgpu_config)})


@REGISTRY.add("dense_per_group", "one jax_fp8.blockwise_fp8_dot (backend auto) per group; "
              "masked: over each group's whole capacity")
def _dense_per_group(case, opts, env) -> Contender:
  g: Groups = case.params
  bound = GPU_BF16_BOUND if env.on_gpu else testing.TOLERANCE[BF16]
  dot = functools.partial(jax_fp8.blockwise_fp8_dot, out_dtype=jnp.bfloat16)
  prepare = lambda s: (s.a, s.a_scale, s.b, s.b_scale)  # noqa: E731
  if g.layout == "masked":
    def fn(a, sa, b, sb):
      return jnp.stack([dot(a[i], sa[i], b[i], sb[i]) for i in range(g.groups)])
    return Contender(fn, prepare, bound=bound, result=lambda out: _mask_rows(out, g.counts))
  starts = np.concatenate([[0], np.cumsum(g.counts)]).astype(int)

  def fn(a, sa, b, sb):  # static group sizes: each group its own dense GEMM
    return jnp.concatenate([dot(a[s:e], sa[s:e], b[i], sb[i])
                            for i, (s, e) in enumerate(zip(starts[:-1], starts[1:]))])
  return Contender(fn, prepare, bound=bound)


@REGISTRY.add("bf16_batched", "a batched bf16 dot over every group's whole capacity (what "
              "JAX users run for the masked layout)", applies=_is_masked)
def _bf16_batched(case, opts, env) -> Contender:
  g: Groups = case.params
  fn = lambda a, b: jnp.einsum("gmk,gnk->gmn", a, b)  # noqa: E731
  return Contender(fn, _dequantised, result=lambda out: _mask_rows(out, g.counts))


@REGISTRY.add("deepgemm", "DeepGEMM's m_grouped_fp8_gemm_nt_contiguous / _masked (groups padded "
              "to its alignment), where `import deep_gemm` works", runtime="torch")
def _deepgemm(case, opts, env) -> Contender:
  g: Groups = case.params
  if g.layout == "contiguous":
    fn, prepare, result = deepgemm.contiguous(env, g.counts)
  else:
    fn, prepare, masked_result = deepgemm.masked(env, max(1, int(g.nominal * 1.2)))
    result = lambda d: masked_result(d, g.counts)  # noqa: E731
  return Contender(fn, prepare, bound=GPU_BF16_BOUND, result=result)


def default_backends(env) -> list[str]:
  if env.on_gpu:
    return list(REGISTRY.all()) + ["auto", "pallas_direct"]
  return ["reference", "ragged_dot_bf16", "dense_per_group", "bf16_batched"]


# ---- references ---------------------------------------------------------------------

def _f64(q, scale, n_axis_blocked):
  """q [..., R, K] e4m3 with 1x128 (row) or 128x128 (n_axis_blocked) scales -> float64."""
  r, k = q.shape[-2:]
  s = jnp.repeat(scale.astype(jnp.float64), common.BLOCK, axis=-1)[..., :k]
  if n_axis_blocked:
    s = jnp.repeat(s, common.BLOCK, axis=-2)[..., :r, :]
  return q.astype(jnp.float64) * s


def reference(contract, s: InputSet, g: Groups):
  """The contract in float64 on the device (call under jax.enable_x64), a group at a time
  (the float64 weights of all groups at once would take G x N x K x 8 bytes)."""
  weights = lambda i: _f64(s.b[i], s.b_scale[i], True)  # noqa: E731
  if contract == "masked":
    out = jnp.stack([_f64(s.a[i], s.a_scale[i], False) @ weights(i).T
                     for i in range(g.groups)])
    return _mask_rows(out, g.counts)
  parts, start = [], 0
  for i, size in enumerate(g.counts):
    size = min(max(0, size), g.rows - start)
    rows = slice(start, start + size)
    parts.append(_f64(s.a[rows], s.a_scale[rows], False) @ weights(i).T)
    start += size
  parts.append(jnp.zeros((g.rows - start, g.n), jnp.float64))
  return jnp.concatenate(parts)


def intro(opts, env) -> list[str]:
  return ["measured: one call of jax_fp8.blockwise_fp8_ragged_dot (contiguous groups) or "
          "blockwise_fp8_masked_dot (masked groups) per case, and of each peer on the same "
          "data; TFLOP/s counts real rows only, GB/s the bytes the FP8 problem must move"]


def workload(opts) -> runner.Workload:
  return runner.Workload(
      name="grouped", registry=REGISTRY, make_sets=make_sets,
      references=lambda: checks.DeviceReferences(
          lambda contract, s, case: reference(contract, s, case.params)),
      title="blockwise FP8 grouped GEMM",
      layout=report.Layout("case", (30, 22, 9, 8, 8), gbs=True),
      ratio_peers=("ragged_dot_bf16", "ragged_dot_mgpu_bf16", "bf16_batched", "deepgemm"),
      metadata=lambda o: {"out_dtype": "bfloat16"}, intro=intro)
