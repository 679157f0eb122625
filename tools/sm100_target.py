"""A compile-only sm_100a target on a machine with another CUDA GPU (the tools' shared part).

`replicated_sharding()` returns a sharding on a one-device compile-only
topology of compute capability 10.0 (the host GPU's target config with its
major version changed) and points Mosaic GPU at that architecture. Arrays typed
with it lower and compile for sm_100a (Mosaic GPU -> PTX -> ptxas); nothing runs.
It patches two private hooks: use it in a process of its own.
"""
from __future__ import annotations

import re


def replicated_sharding():
  import jax
  import numpy as np
  from jax._src.lib import _jax
  from jax.experimental import topologies
  import jax.experimental.mosaic.gpu.utils as mgpu_utils

  if jax.default_backend() != "gpu":
    raise SystemExit(f"needs a machine with a CUDA GPU (it compiles for sm_100a there); "
                     f"this one has {jax.default_backend()!r}")
  target = _jax.get_topology_for_devices(jax.devices()).target_config
  text = target.decode() if isinstance(target, bytes) else target
  text10, count = re.subn(r"(cuda_compute_capability\s*\{\s*major:\s*)\d+", r"\g<1>10", text,
                          count=1)
  if not count:
    raise SystemExit("the GPU's target config has no cuda_compute_capability to change")
  topo = topologies.get_topology_desc(
      platform="cuda", target_config=text10 if isinstance(target, str) else text10.encode(),
      topology="1x1x1")
  mesh = jax.sharding.Mesh(np.array(topo.devices[:1]), ("x",))
  mgpu_utils._infer_arch = lambda: (10, 0)  # Mosaic would ask the host GPU (9.0)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
