"""jax_fp8.ffi: the blockwise FP8 matmul as a CUDA C++ kernel behind an XLA FFI custom call.

The portable fallback of jax_fp8 (any GPU with FP8 tensor cores, compute capability >= 8.9):
`blockwise_fp8.cu` (shipped beside this file) uses `mma.sync` m16n8k32 e4m3 MMAs with a
cp.async shared-memory pipeline and promotes every 128-deep K block into an f32 accumulator.
Built for sm_90a it also holds a Hopper kernel (TMA producer warpgroup, two WGMMA consumer
warpgroups, persistent grid) that the handler picks on a compute capability 9.0 GPU when
K % 16 == 0 and a, b are 16-byte aligned; `JAX_FP8_FFI_DISABLE_WGMMA=1` in the environment
forces the mma.sync kernel. See the .cu file for both designs.

- `build(arch, out_dir)` compiles the source with nvcc into a shared library, cached on disk.
- At the first GPU use the library is built for the attached GPU's own architecture, loaded
  with ctypes and registered as the XLA FFI target `jax_fp8_blockwise_fp8_dot`.
- `unsupported_reason` / `blockwise_fp8_dot` are the backend interface of jax_fp8.backends.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import glob
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np

from jax_fp8.pallas import device

SOURCE = pathlib.Path(__file__).with_name("blockwise_fp8.cu")
TARGET_NAME = "jax_fp8_blockwise_fp8_dot"
SYMBOL = "JaxFp8BlockwiseFp8Dot"  # the handler exported by the .cu file
# Where nvcc is looked for after $CUDA_HOME and $PATH (tests may empty this).
DEFAULT_CUDA_HOMES = ("/usr/local/cuda",)

NVCC_HELP = ("install the CUDA toolkit (and put its bin/ on PATH or set CUDA_HOME), or "
             "`pip install nvidia-cuda-nvcc-cu12` (CUDA 12) / `pip install nvidia-cuda-nvcc` (CUDA 13)")


@dataclasses.dataclass(frozen=True)
class Config:
  """The kernel's shape (compiled into the .cu file) and its run-time knobs."""
  tile_m: int = 128          # output rows per CTA (fixed in the .cu file)
  tile_n: int = 128          # output columns per CTA = the b_scale block (fixed)
  k_block: int = 128         # K per pipeline stage = the scale group (fixed)
  group_m: int = 8           # M tiles per raster group, for L2 reuse of B tiles
  min_blocks_per_split: int = 4  # split-K only gives each split at least this many K blocks


CONFIG = Config()


class NvccNotFoundError(RuntimeError):
  """No nvcc could be found; the message says how to get one."""


class BuildError(RuntimeError):
  """nvcc failed; the message holds its output."""


# ---- Building ---------------------------------------------------------------------------------

def _wheel_nvcc_candidates() -> list[str]:
  """nvcc inside the nvidia-cuda-nvcc(-cu12) wheels, if installed."""
  try:
    import nvidia  # namespace package of NVIDIA's CUDA wheels
  except ImportError:
    return []
  found = []
  for root in getattr(nvidia, "__path__", []):
    found += sorted(glob.glob(os.path.join(root, "*", "bin", "nvcc")))
    found += sorted(glob.glob(os.path.join(root, "bin", "nvcc")))
  return found


def find_nvcc() -> str:
  """Path of nvcc: $CUDA_HOME/bin, then $PATH, then the nvidia-cuda-nvcc wheel, then
  DEFAULT_CUDA_HOMES. Raises NvccNotFoundError saying how to get one."""
  candidates = []
  for var in ("CUDA_HOME", "CUDA_PATH"):
    if os.environ.get(var):
      candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
  on_path = shutil.which("nvcc")
  if on_path:
    candidates.append(on_path)
  candidates += _wheel_nvcc_candidates()
  candidates += [os.path.join(home, "bin", "nvcc") for home in DEFAULT_CUDA_HOMES]
  for path in candidates:
    if os.path.isfile(path) and os.access(path, os.X_OK):
      return path
  raise NvccNotFoundError(
      "jax_fp8.ffi needs nvcc (the CUDA compiler) to build its kernel, and none was found in "
      f"$CUDA_HOME/bin, on PATH, in the nvidia-cuda-nvcc wheel or in {DEFAULT_CUDA_HOMES}: "
      + NVCC_HELP)


@functools.cache
def _nvcc_version(nvcc: str) -> str:
  return subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                        check=True).stdout.strip()


def arch_for_compute_capability(cc) -> str:
  """'9.0' / (9, 0) -> 'sm_90a'; '10.0' -> 'sm_100a'; '8.9' -> 'sm_89'.

  From Hopper on, the arch-specific ('a') target is used: the cubin is for exactly this GPU.
  """
  if isinstance(cc, str):
    major, minor = (int(x) for x in cc.split("."))
  else:
    major, minor = (int(x) for x in cc)
  if (major, minor) < (8, 9):
    raise ValueError(f"FP8 tensor cores need compute capability >= 8.9, got {major}.{minor}")
  return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _gencode(arch: str) -> str:
  if not arch.startswith("sm_") or not arch[3:].rstrip("af").isdigit():
    raise ValueError(f"arch must look like 'sm_89', 'sm_90a' or 'sm_100a', got {arch!r}")
  return f"-gencode=arch=compute_{arch[3:]},code={arch}"


def arch_defines(arch: str) -> list[str]:
  """-D flags that switch on arch-specific kernels: sm_90a gets the TMA + WGMMA kernel."""
  return ["-DJAX_FP8_SM90A"] if arch == "sm_90a" else []


def nvcc_command(nvcc: str, arch: str, output: str) -> list[str]:
  """The nvcc command line that builds the shipped source into `output`."""
  return [
      nvcc, _gencode(arch), *arch_defines(arch), "-std=c++17", "-O3", "-shared",
      "-Xcompiler", "-fPIC",
      "-lineinfo",  # source lines for compute-sanitizer reports; no run-time cost
      # XLA's FFI headers are not ours: -isystem keeps their warnings out of the log.
      "-isystem", jax.ffi.include_dir(),
      "-Xcompiler", "-Wall", "-Xcompiler", "-Wextra",
      # Register use and spills go to the build log, spills as warnings.
      "-Xptxas", "-v", "-Xptxas", "-warn-spills", "-Xptxas", "-warn-lmem-usage",
      str(SOURCE), "-o", output,
  ]


def cache_dir() -> pathlib.Path:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "jax_fp8"


_build_lock = threading.Lock()


def build(arch: str = "sm_90a", out_dir: str | os.PathLike | None = None) -> str:
  """Compiles the shipped CUDA source for `arch` and returns the shared library's path.

  The library is cached in `out_dir` (default: $XDG_CACHE_HOME/jax_fp8 or ~/.cache/jax_fp8)
  under a name keyed by the source's hash, the arch, the nvcc version and the FFI headers'
  jax version; an existing one is reused. nvcc's output is written beside it (`.log`).
  Raises NvccNotFoundError without nvcc, BuildError when nvcc fails.
  """
  _gencode(arch)  # validates arch
  nvcc = find_nvcc()
  key = hashlib.sha256()
  key.update(SOURCE.read_bytes())
  for part in (arch, _nvcc_version(nvcc), jax.__version__,
               " ".join(nvcc_command("nvcc", arch, "out")[1:])):
    key.update(b"\0" + part.encode())
  out = pathlib.Path(out_dir) if out_dir is not None else cache_dir()
  lib = out / f"blockwise_fp8-{arch}-{key.hexdigest()[:20]}.so"
  with _build_lock:
    if lib.is_file():
      return str(lib)
    out.mkdir(parents=True, exist_ok=True)
    # Build under a temporary name, then rename: concurrent builders never see half a file.
    fd, tmp = tempfile.mkstemp(prefix=lib.stem + ".", suffix=".tmp.so", dir=out)
    os.close(fd)
    try:
      proc = subprocess.run(nvcc_command(nvcc, arch, tmp), capture_output=True, text=True)
      log = proc.stdout + proc.stderr
      if proc.returncode != 0:
        raise BuildError(f"nvcc failed to build {SOURCE.name} for {arch} "
                         f"(exit {proc.returncode}):\n{log}")
      pathlib.Path(str(lib) + ".log").write_text(log)
      os.replace(tmp, lib)
    finally:
      if os.path.exists(tmp):
        os.unlink(tmp)
  return str(lib)


def build_log(library: str) -> str:
  """nvcc's output (warnings, register use, spills) of the build that made `library`."""
  return pathlib.Path(library + ".log").read_text()


# ---- Loading and registration -----------------------------------------------------------------

def _device_arch() -> str | None:
  """The arch of the first CUDA device, or None without one."""
  cc = device.compute_capability()
  return None if cc is None else arch_for_compute_capability(f"{cc[0]}.{cc[1]}")


_libraries: list[ctypes.CDLL] = []  # keeps the loaded library alive


_load_lock = threading.Lock()


@functools.cache
def _load() -> tuple[str | None, str | None]:
  """Builds, loads and registers the kernel once: (library path, None) or (None, reason)."""
  with _load_lock:  # functools.cache alone could let two threads register twice
    return _load_locked()


def _load_locked() -> tuple[str | None, str | None]:
  try:
    arch = _device_arch()
  except ValueError as e:
    return None, str(e)
  if arch is None:
    return None, "no CUDA GPU is visible to jax"
  try:
    path = build(arch)
  except NvccNotFoundError as e:
    return None, str(e)
  except (BuildError, OSError, subprocess.SubprocessError) as e:
    return None, f"building the FFI kernel for {arch} failed: {e}"
  try:
    lib = ctypes.CDLL(path)
    handler = getattr(lib, SYMBOL)
  except (OSError, AttributeError) as e:
    return None, f"loading the FFI kernel {path} failed: {e}"
  _libraries.append(lib)
  jax.ffi.register_ffi_target(TARGET_NAME, jax.ffi.pycapsule(handler), platform="CUDA")
  return path, None


# ---- The backend interface --------------------------------------------------------------------

_MAX_DIM = 2**30  # the kernel indexes rows, columns and K with 32-bit ints


def unsupported_reason(op: str, m: int, n: int, k: int, *, out_dtype, has_c: bool = False,
                       **problem) -> str | None:
  """None if the FFI kernel can run this call on the attached GPU, else why not.

  Builds the kernel on the first call (cached on disk and per process), so a missing nvcc or
  a failed build makes "auto" skip this backend.
  """
  del op  # the module's ops are what it supports (jax_fp8.backends checks)
  del has_c  # any c works: it is cast to float32 before the call
  if problem.get("b_scale_rows", 128) != 128:
    return ("per-row b scales (b_scale_block=(1, 128)) are not implemented in the CUDA FFI "
            "kernel (128x128 b scales only)")
  if np.dtype(out_dtype) not in (np.dtype(jnp.bfloat16), np.dtype(jnp.float32)):
    return f"out_dtype must be bfloat16 or float32, got {out_dtype}"
  if max(m, n, k) >= _MAX_DIM:
    return f"M, N and K must be < 2**30, got M={m}, N={n}, K={k}"
  _, reason = _load()
  return reason


def num_splits(m: int, n: int, k: int, num_sms: int, config: Config = CONFIG) -> int:
  """K splits so that a grid smaller than the GPU fills more of it (1 = no split)."""
  tiles = -(-m // config.tile_m) * -(-n // config.tile_n)
  k_blocks = -(-k // config.k_block)
  if 2 * tiles > num_sms:
    return 1
  by_work = max(1, k_blocks // config.min_blocks_per_split)
  return max(1, min(num_sms // tiles, by_work))


_poison = threading.local()


@contextlib.contextmanager
def poisoned_outputs():
  """Within: calls traced fill their output with NaN before the kernel runs (tests only:
  an output element the kernel fails to write then shows up as NaN)."""
  old = getattr(_poison, "on", False)
  _poison.on = True
  try:
    yield
  finally:
    _poison.on = old


def ffi_call(a, a_scale, b, b_scale, c, *, beta: float, out_dtype, splits: int,
             config: Config = CONFIG):
  """The custom call itself (no build or registration; lowering it needs no GPU)."""
  m, _ = a.shape
  n = b.shape[0]
  has_c = c is not None
  c32 = c.astype(jnp.float32) if has_c else jnp.zeros((1,), jnp.float32)
  workspace = (splits * m * n,) if splits > 1 else (1,)
  call = jax.ffi.ffi_call(
      TARGET_NAME,
      (jax.ShapeDtypeStruct((m, n), out_dtype), jax.ShapeDtypeStruct(workspace, jnp.float32)),
      vmap_method="sequential")
  out, _ = call(a, a_scale, b, b_scale, c32, beta=np.float32(beta),
                has_c=np.int32(has_c), splits=np.int32(splits),
                group_m=np.int32(config.group_m),
                poison=np.int32(getattr(_poison, "on", False)))
  return out


def blockwise_fp8_dot(a, a_scale, b, b_scale, c, *, beta: float, out_dtype):
  """out = blockwise-scaled a @ b.T (+ beta * c) on the GPU, through the FFI kernel.

  a: [M, K] e4m3, a_scale: [M, ceil(K/128)] f32, b: [N, K] e4m3,
  b_scale: [ceil(N/128), ceil(K/128)] f32, c: None or [M, N] (any float dtype).
  """
  _, reason = _load()
  if reason is not None:
    raise RuntimeError(f"the jax_fp8 FFI kernel is unavailable: {reason}")
  m, k = a.shape
  n = b.shape[0]
  return ffi_call(a, a_scale, b, b_scale, c, beta=beta, out_dtype=np.dtype(out_dtype),
                  splits=num_splits(m, n, k, device.num_sms(default=132)))
