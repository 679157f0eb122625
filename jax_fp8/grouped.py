"""The grouped (MoE) GEMMs as JAX primitives: validation, abstract evaluation,
per-platform lowering through `jax_fp8.backends`, and batching.

- `blockwise_fp8_ragged_dot`: contiguous layout. Rows of `a` [M, K] lie in
  groups, in order from row 0; group g's rows are multiplied by expert b[g].
- `blockwise_fp8_masked_dot`: masked (decode) layout. a [G, M, K] holds M rows
  per group, of which the first masked_m[g] are real.

Both follow the dense op's per-K-block contract (jax_fp8.blockwise_fp8_dot) row
by row with the row's own expert. group_sizes / masked_m are operands (device
arrays): the work follows them on the device, with no host sync and no
recompilation when they change. Values outside the contract are defined rather
than checked on the device: a negative group size counts as 0, groups are cut
at row M, masked_m is clamped to [0, M]; rows outside every group (past the sum,
or at and past masked_m[g]) are 0. Host values (numpy arrays, lists) are checked
instead: a bad one raises ValueError.

The backends see normalised sizes (`normalized_group_sizes`,
`normalized_masked_m`), so a kernel may rely on 0 <= size, sum <= M and
0 <= masked_m <= M. Sharding rules: jax_fp8.grouped_sharding.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dispatch
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_fp8 import backends
from jax_fp8 import checks
from jax_fp8 import grouped_sharding
from jax_fp8 import sharding
from jax_fp8.grouped_sharding import MASKED, RAGGED  # the backends' op names
from jax_fp8.pallas import device
from jax_fp8.primitive import OUT_DTYPES
from jax_fp8.blocks import num_blocks
from jax_fp8.reference import ragged_group_bounds

# The ragged layout's running row count is an int32 that saturates at M.
MAX_ROWS = 2**30


# ---- validation ------------------------------------------------------------------------

def _shape(x):
  return tuple(x.shape)


def _check_dtypes(a, a_scale, b, b_scale, sizes, sizes_name, out_dtype, backend):
  checks.operand_dtypes(a, a_scale, b, b_scale)
  if np.dtype(sizes.dtype) != np.dtype(jnp.int32):
    raise TypeError(f"{sizes_name} must be int32, got {sizes.dtype}")
  checks.out_dtype(out_dtype, OUT_DTYPES, "bfloat16 or float32")
  checks.backend(backend)


def _check_experts(b, b_scale, k, sizes, sizes_name, a_name):
  """b [G, N, K], b_scale [G, ceil(N/128), ceil(K/128)], sizes [G]; returns (G, N)."""
  if len(_shape(b)) != 3:
    raise ValueError(f"b must be 3-D [G, N, K] (one [N, K] weight per group), "
                     f"got shape {_shape(b)}")
  g, n, kb_ = _shape(b)
  if kb_ != k:
    raise ValueError(f"K mismatch: {a_name} has K={k} but b is {_shape(b)} (K={kb_}); "
                     "b must be [G, N, K] with the same K as a")
  if g < 1:
    raise ValueError(f"b must hold at least one group, got shape {_shape(b)}")
  want = (g, num_blocks(n), num_blocks(k))
  if _shape(b_scale) != want:
    raise ValueError(f"b_scale must have shape (G, ceil(N/128), ceil(K/128)) = {want} "
                     f"(one scale per 128x128 block of each group's b), got {_shape(b_scale)}")
  if _shape(sizes) != (g,):
    raise ValueError(f"{sizes_name} must be 1-D of length G = {g} (b.shape[0]), "
                     f"got shape {_shape(sizes)}")
  return g, n


def validate_ragged(a, a_scale, b, b_scale, group_sizes, *, out_dtype, backend):
  """Checks every static property against the contract; returns (m, n, k, g).

  Works on arrays and abstract values alike. Raises TypeError (dtypes) or
  ValueError (shapes) whose message names the argument and the rule.
  """
  _check_dtypes(a, a_scale, b, b_scale, group_sizes, "group_sizes", out_dtype, backend)
  if len(_shape(a)) != 2:
    raise ValueError(f"a must be 2-D [M, K] (the rows of all groups, one after another), "
                     f"got shape {_shape(a)}; vmap for a batch of ragged problems")
  m, k = _shape(a)
  if k < 1:
    raise ValueError(f"K must be >= 1, got a of shape {_shape(a)}")
  if m >= MAX_ROWS:
    raise ValueError(f"M must be < 2**30, got a of shape {_shape(a)}")
  want = (m, num_blocks(k))
  if _shape(a_scale) != want:
    raise ValueError(f"a_scale must have shape (M, ceil(K/128)) = {want} "
                     f"(one scale per row per 128-wide K group), got {_shape(a_scale)}")
  g, n = _check_experts(b, b_scale, k, group_sizes, "group_sizes", "a [M, K]")
  return m, n, k, g


def validate_masked(a, a_scale, b, b_scale, masked_m, *, out_dtype, backend):
  """Checks every static property against the contract; returns (g, m, n, k)."""
  _check_dtypes(a, a_scale, b, b_scale, masked_m, "masked_m", out_dtype, backend)
  if len(_shape(a)) != 3:
    raise ValueError(f"a must be 3-D [G, M, K] (M rows per group), got shape {_shape(a)}; "
                     "vmap for a batch")
  g, m, k = _shape(a)
  if k < 1:
    raise ValueError(f"K must be >= 1, got a of shape {_shape(a)}")
  want = (g, m, num_blocks(k))
  if _shape(a_scale) != want:
    raise ValueError(f"a_scale must have shape (G, M, ceil(K/128)) = {want} "
                     f"(one scale per row per 128-wide K group), got {_shape(a_scale)}")
  gb, n = _check_experts(b, b_scale, k, masked_m, "masked_m", "a [G, M, K]")
  if gb != g:
    raise ValueError(f"a and b must hold the same number of groups G: a is {_shape(a)}, "
                     f"b is {_shape(b)}")
  return g, m, n, k


def _check_expected_m(expected_m, m):
  """expected_m is None or a static int in [1, M] (a tiling hint: a traced value
  cannot choose a kernel)."""
  if expected_m is None:
    return
  if isinstance(expected_m, (bool, np.bool_)) or not isinstance(expected_m, (int, np.integer)):
    raise TypeError("expected_m must be None or a Python int (a static hint of the rows a "
                    f"group is expected to hold), got {type(expected_m).__name__}")
  if not 1 <= expected_m <= max(m, 1):
    raise ValueError(f"expected_m must be in [1, M] = [1, {m}] (M: the rows per group of a), "
                     f"got {expected_m}")


def _host_sizes(sizes, name):
  """The int32 array of a host-side (numpy, list) `sizes`, else None (device arrays and
  tracers are not read: that would be a host sync)."""
  if isinstance(sizes, (jax.Array, jax.core.Tracer)):
    return None
  host = np.asarray(sizes)
  if host.dtype == object or not np.issubdtype(host.dtype, np.integer):
    raise TypeError(f"{name} must be int32, got {host.dtype}")
  return host


def _int32_like(host, sizes):
  """What validation sees of `sizes`: host values count as int32 (they are converted
  once checked)."""
  return sizes if host is None else jax.ShapeDtypeStruct(host.shape, jnp.int32)


def _check_host_group_sizes(host, m):
  if np.any(host < 0):
    raise ValueError(f"group_sizes must be >= 0, got {host.tolist()} (on the device a "
                     "negative size counts as 0; host values are checked)")
  total = int(host.astype(object).sum())
  if total > m:
    raise ValueError(f"group_sizes must sum to at most M = {m} (the rows of a), got sum "
                     f"{total} (on the device the groups are cut at row M; host values are "
                     "checked)")


def _check_host_masked_m(host, m):
  if np.any(host < 0) or np.any(host > m):
    raise ValueError(f"masked_m must be in [0, M] = [0, {m}], got {host.tolist()} (on the "
                     "device it is clamped; host values are checked)")


# ---- what the backends get --------------------------------------------------------------

def normalized_group_sizes(group_sizes, m: int) -> jax.Array:
  """The sizes the backends see: each >= 0, summing to at most M (negative sizes as
  0, groups cut at row M); the same groups as group_sizes under the contract."""
  starts, ends = ragged_group_bounds(group_sizes, m)
  return ends - starts


def normalized_masked_m(masked_m, m: int) -> jax.Array:
  """masked_m clamped to [0, M]."""
  return jnp.clip(masked_m, 0, m)


def _problem(a, b):
  """The backends' problem description of one call: M rows (per group for the masked
  layout), N, K and G."""
  g, n, k = b.shape
  m = a.shape[-2]
  return dict(m=m, n=n, k=k, groups=g)


def _call_backend(kernel, op, out_dtype, a, a_scale, b, b_scale, sizes, **hints):
  """hints: the masked op's expected_m, passed where set (a tiling hint; every
  backend's masked_dot takes it)."""
  m = a.shape[-2]
  norm = normalized_group_sizes if op == RAGGED else normalized_masked_m
  hints = {key: value for key, value in hints.items() if value is not None}
  return kernel(a, a_scale, b, b_scale, norm(sizes, m), out_dtype=out_dtype, **hints)


# ---- the primitives ------------------------------------------------------------------------

def _make_primitive(name):
  prim = Primitive(name)
  prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
  # A multi-device lowering partitions through custom_partitioning, which needs
  # the device assignment and mesh at lowering time (jax_fp8.grouped_sharding).
  dispatch.prim_requires_devices_during_lowering.add(prim)
  return prim


blockwise_fp8_ragged_dot_p = _make_primitive("blockwise_fp8_ragged_dot")
blockwise_fp8_masked_dot_p = _make_primitive("blockwise_fp8_masked_dot")
PRIMITIVES = {RAGGED: blockwise_fp8_ragged_dot_p, MASKED: blockwise_fp8_masked_dot_p}


def _aval(shape, dtype, out_sharding):
  if out_sharding is None:
    return jax.core.ShapedArray(shape, dtype)
  # Explicit mesh axes: the output's sharding (jax_fp8.grouped_sharding).
  return jax.core.ShapedArray(shape, dtype, sharding=out_sharding)


def _ragged_abstract_eval(a, a_scale, b, b_scale, group_sizes, *, out_dtype, backend):
  m, n, _, _ = validate_ragged(a, a_scale, b, b_scale, group_sizes, out_dtype=out_dtype,
                               backend=backend)
  out_sharding = grouped_sharding.out_sharding(RAGGED, (a, a_scale, b, b_scale, group_sizes))
  return _aval((m, n), out_dtype, out_sharding)


def _masked_abstract_eval(a, a_scale, b, b_scale, masked_m, *, out_dtype, backend,
                          expected_m=None):
  g, m, n, _ = validate_masked(a, a_scale, b, b_scale, masked_m, out_dtype=out_dtype,
                               backend=backend)
  out_sharding = grouped_sharding.out_sharding(MASKED, (a, a_scale, b, b_scale, masked_m))
  return _aval((g, m, n), out_dtype, out_sharding)


blockwise_fp8_ragged_dot_p.def_abstract_eval(_ragged_abstract_eval)
blockwise_fp8_masked_dot_p.def_abstract_eval(_masked_abstract_eval)


def _lowering(ctx, *args, out_dtype, backend, op, platform, **hints):
  if sharding.wants_partitioning(ctx):
    # Several devices: partition by the rules of jax_fp8.grouped_sharding; each
    # shard lowers back here in a one-device (manual) context (no recursion).
    return grouped_sharding.lower(ctx, PRIMITIVES[op], op, *args, out_dtype=out_dtype,
                                  backend=backend, **hints)
  _, kernel = backends.select(platform, backend, op, out_dtype=out_dtype, has_c=False,
                              **_problem(ctx.avals_in[0], ctx.avals_in[2]))
  impl = functools.partial(_call_backend, kernel, op, out_dtype, **hints)
  return sharding.lower_locally(ctx, impl, *args)


for _op, _prim in PRIMITIVES.items():
  for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_prim, functools.partial(_lowering, op=_op, platform=_platform),
                           platform=_platform)


# ---- batching ------------------------------------------------------------------------------

def _map_over_batch(prim, params, args, dims):
  """One call per batch element (lax.map); unbatched operands are shared, not copied."""
  batched = [i for i, d in enumerate(dims) if d is not None]
  xs = tuple(jnp.moveaxis(args[i], dims[i], 0) for i in batched)

  def one(xs):
    full = list(args)
    for i, x in zip(batched, xs):
      full[i] = x
    return prim.bind(*full, **params)
  return lax.map(one, xs), 0


def _ragged_batching_rule(args, dims, *, out_dtype, backend):
  # A batch of ragged problems does not fold into one: each element's groups
  # start at its own row 0 and leave their own rows past the sum, which one
  # ragged layout cannot express without an extra zero expert per element.
  # So one call per element (sequential; vmap a batch of problems that is small
  # next to the work of one).
  return _map_over_batch(blockwise_fp8_ragged_dot_p, dict(out_dtype=out_dtype, backend=backend),
                         args, dims)


def _masked_batching_rule(args, dims, *, out_dtype, backend, expected_m=None):
  params = dict(out_dtype=out_dtype, backend=backend, expected_m=expected_m)
  if dims[2] is None:
    # Shared experts: folding the batch into G would copy every expert's
    # weights once per batch element; one call per element instead.
    return _map_over_batch(blockwise_fp8_masked_dot_p, params, args, dims)
  # Batched experts: the batch folds into the group axis, G' = B * G, one call.
  size = args[2].shape[dims[2]]
  groups = args[2].shape[1 if dims[2] == 0 else 0]   # b: [G, N, K] around the batch dim

  def folded(x, d):
    x = jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
    return x.reshape(size * x.shape[1], *x.shape[2:])
  out = blockwise_fp8_masked_dot_p.bind(*map(folded, args, dims), **params)
  return out.reshape(size, groups, *out.shape[1:]), 0


batching.primitive_batchers[blockwise_fp8_ragged_dot_p] = _ragged_batching_rule
batching.primitive_batchers[blockwise_fp8_masked_dot_p] = _masked_batching_rule


# ---- public API -----------------------------------------------------------------------------

def _arrays(*xs):
  return tuple(jnp.asarray(x) if not hasattr(x, "dtype") else x for x in xs)


def _bind(op, a, a_scale, b, b_scale, sizes, *, out_dtype, backend, **hints):
  if backend in backends.PALLAS and device.interpret_mode_active():
    # GPU interpret mode turns a Pallas kernel into ordered io_callbacks, whose
    # effect tokens a primitive's lowering cannot thread: call the kernel
    # directly (the CPU/CI path of the Pallas kernels; jit still applies).
    _, kernel = backends.select("cpu", backend, op, out_dtype=out_dtype, has_c=False,
                                **_problem(a, b))
    return _call_backend(kernel, op, out_dtype, a, a_scale, b, b_scale, sizes, **hints)
  return PRIMITIVES[op].bind(a, a_scale, b, b_scale, sizes, out_dtype=out_dtype,
                             backend=backend, **hints)


def blockwise_fp8_ragged_dot(a, a_scale, b, b_scale, group_sizes, *, out_dtype=jnp.bfloat16,
                             backend: str = "auto") -> jax.Array:
  """Blockwise-scaled FP8 grouped matmul, contiguous (ragged) layout.

  Args:
    a: float8_e4m3fn [M, K]: the rows of every group, one group after another.
    a_scale: float32 [M, ceil(K/128)], one scale per row per 1x128 group.
    b: float8_e4m3fn [G, N, K]: one weight [N, K] per group (expert).
    b_scale: float32 [G, ceil(N/128), ceil(K/128)], one scale per 128x128 block.
    group_sizes: int32 [G]: rows per group, a device array (numpy arrays and
      lists are checked on the host and converted). Group g owns rows
      [start_g, start_g + group_sizes[g]), start_0 = 0, start_{g+1} = the end of
      g. Values are not checked on the device: a negative size counts as 0 and
      the groups are cut at row M.
    out_dtype: jnp.bfloat16 or jnp.float32.
    backend: "auto", "reference", "pallas_sm90" or "pallas_sm100".

  Returns:
    [M, N] out_dtype: row r of group g is the dense op's contract for a[r] and
    b[g] (sum over K blocks of the block sum times a_scale * b_scale, in
    float32); rows past the last group are 0.
  """
  a, a_scale, b, b_scale = _arrays(a, a_scale, b, b_scale)
  host = _host_sizes(group_sizes, "group_sizes")
  m, _, _, _ = validate_ragged(a, a_scale, b, b_scale, _int32_like(host, group_sizes),
                               out_dtype=out_dtype, backend=backend)
  if host is not None:
    _check_host_group_sizes(host, m)
    group_sizes = jnp.asarray(host, jnp.int32)
  return _bind(RAGGED, a, a_scale, b, b_scale, group_sizes, out_dtype=np.dtype(out_dtype),
               backend=backend)


def blockwise_fp8_masked_dot(a, a_scale, b, b_scale, masked_m, *, out_dtype=jnp.bfloat16,
                             backend: str = "auto", expected_m: int | None = None) -> jax.Array:
  """Blockwise-scaled FP8 grouped matmul, masked (decode) layout.

  Args:
    a: float8_e4m3fn [G, M, K]: M rows per group, the first masked_m[g] real.
    a_scale: float32 [G, M, ceil(K/128)].
    b: float8_e4m3fn [G, N, K]: one weight [N, K] per group (expert).
    b_scale: float32 [G, ceil(N/128), ceil(K/128)].
    masked_m: int32 [G] in [0, M]: real rows per group, a device array (numpy
      arrays and lists are checked on the host and converted). Not checked on the
      device: values are clamped to [0, M].
    out_dtype: jnp.bfloat16 or jnp.float32.
    backend: "auto", "reference", "pallas_sm90" or "pallas_sm100".
    expected_m: the rows a group is expected to hold, an int in [1, M], or
      None. A hint, as DeepGEMM's masked GEMM takes one: the Hopper kernel
      then picks its tiles for fills of about 0.7x to 1.3x expected_m instead
      of fills of half of M to all of it (M is a capacity, often far above
      what a group holds). It changes no result, and a new value compiles
      anew, so pass a constant of the model (e.g. tokens x top-k / experts),
      not this batch's counts. Other backends ignore it.

  Returns:
    [G, M, N] out_dtype: out[g, r] is the dense op's contract for a[g, r] and
    b[g] for r < masked_m[g], and 0 for the other rows (whatever a holds there).
  """
  a, a_scale, b, b_scale = _arrays(a, a_scale, b, b_scale)
  host = _host_sizes(masked_m, "masked_m")
  _, m, _, _ = validate_masked(a, a_scale, b, b_scale, _int32_like(host, masked_m),
                               out_dtype=out_dtype, backend=backend)
  _check_expected_m(expected_m, m)
  if host is not None:
    _check_host_masked_m(host, m)
    masked_m = jnp.asarray(host, jnp.int32)
  return _bind(MASKED, a, a_scale, b, b_scale, masked_m, out_dtype=np.dtype(out_dtype),
               backend=backend, expected_m=None if expected_m is None else int(expected_m))
