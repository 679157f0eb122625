"""Is an output right? Relative Frobenius errors against float64 references.

A workload computes its references one of two ways:
- `HostReferences`: numpy on the host CPU in a background thread, started when a
  case's inputs exist and joined after its JAX timings (nothing lands on the GPU
  while CUPTI records). For the dense benchmark (jax_fp8.testing.reference_f64).
- `DeviceReferences`: float64 jnp on the default device, computed at once, before
  the case is timed (fast on a GPU; for the grouped, training and MLP workloads,
  whose references are several large matmuls).
Both keep a reference by (case key, contract); `host` gives a numpy copy for the
torch peers, which are timed (and checked) after every JAX timing.
"""
from __future__ import annotations

import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _rel_error_f64(out, ref):
  """||out - ref||_F / ||ref||_F in float64, NaN if out has a non-finite value
  (call under jax.enable_x64)."""
  o = out.astype(jnp.float64)
  denom = jnp.linalg.norm(ref)
  err = jnp.linalg.norm(o - ref) / jnp.where(denom > 0, denom, 1.0)
  return jnp.where(jnp.all(jnp.isfinite(o)), err, jnp.nan)


def rel_error(out, ref) -> float:
  """The relative Frobenius error of out (any float dtype) against a float64 ref;
  a pytree of outputs gives the largest error of its leaves (NaN wins)."""
  outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
  if len(outs) != len(refs):
    raise AssertionError(f"{len(outs)} outputs for {len(refs)} references")
  worst = 0.0
  for o, r in zip(outs, refs):
    if tuple(o.shape) != tuple(r.shape):
      raise AssertionError(f"shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    with jax.enable_x64(True):
      err = float(_rel_error_f64(o, r))
    if not np.isfinite(err):
      return float("nan")
    worst = max(worst, err)
  return worst


def verdict(err: float, bound: float | None) -> str:
  """ok | FAIL (why); without a bound only a non-finite output fails."""
  if bound is None:
    return "ok" if np.isfinite(err) else "FAIL (NaN)"
  return "ok" if err <= bound else f"FAIL (> {bound:.1e})"


def to_device_f64(tree):
  with jax.enable_x64(True):
    return jax.tree.map(jnp.asarray, tree)


class HostReferences:
  """References computed with numpy on the host in a background thread.

  compute(contract, host_set, case) -> np.ndarray; to_host(input_set) -> host_set.
  """

  def __init__(self, compute, to_host):
    self._compute, self._to_host = compute, to_host
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._cpu = jax.devices("cpu")[0]
    self._futures, self._device = {}, {}

  def submit(self, case, input_set, contracts):
    host = self._to_host(input_set)
    for contract in contracts:
      self._futures[(case.label, contract)] = self._pool.submit(self._run, contract, host, case)

  def _run(self, contract, host, case):
    # On the host CPU device: no kernel may land on the GPU while CUPTI records.
    with jax.default_device(self._cpu):
      return self._compute(contract, host, case)

  def wait(self, key):
    for (k, _), future in list(self._futures.items()):
      if k == key:
        future.result()

  def host(self, key, contract):
    return self._futures[(key, contract)].result()

  def device(self, key, contract):
    """The reference as float64 on the default device (uploaded once)."""
    if (key, contract) not in self._device:
      self._device[(key, contract)] = to_device_f64(self.host(key, contract))
    return self._device[(key, contract)]

  def drop(self, key):
    for k in [k for k in self._futures if k[0] == key]:
      del self._futures[k]
    for k in [k for k in self._device if k[0] == key]:
      del self._device[k]

  def close(self):
    self._pool.shutdown(wait=False, cancel_futures=True)


class DeviceReferences:
  """References computed in float64 on the default device when submitted.

  compute(contract, input_set, case) -> array or pytree, called under jax.enable_x64.
  """

  def __init__(self, compute):
    self._compute = compute
    self._refs = {}

  def submit(self, case, input_set, contracts):
    with jax.enable_x64(True):
      for contract in contracts:
        self._refs[(case.label, contract)] = jax.block_until_ready(
            self._compute(contract, input_set, case))

  def wait(self, key):
    del key  # computed when submitted

  def host(self, key, contract):
    return jax.tree.map(np.asarray, self._refs[(key, contract)])

  def device(self, key, contract):
    return self._refs[(key, contract)]

  def drop(self, key):
    for k in [k for k in self._refs if k[0] == key]:
      del self._refs[k]

  def close(self):
    self._refs.clear()
