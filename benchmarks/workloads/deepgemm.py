"""DeepGEMM (deepseek-ai/DeepGEMM 2.6.1, `import deep_gemm`) as a peer, where it is built.

DeepGEMM is not a dependency and its code is not in this repository: it is built
on the GPU machine (issue 22 says how) and found by `import deep_gemm`. Where it
does not import, each contender is reported unavailable with the reason.

Its calls, as its own tests make them (API of 2.6.1):
- dense 1D2D:  fp8_gemm_nt((a [M,K], sfa [M,K/128]), (b [N,K], sfb [N/128,K/128]), d [M,N] bf16)
- wgrad 1D1D:  fp8_gemm_nt((a, sfa [M,K/128]), (b, sfb [N,K/128]), d f32, c=d, recipe=(1,1,128))
  (on Hopper the 1D1D kernel always accumulates: d += a b^T, here into zeros)
- contiguous:  m_grouped_fp8_gemm_nt_contiguous((a [M',K], sfa), (b [G,N,K], sfb [G,N/128,K/128]),
               d [M',N] bf16, layout [M'] int32: each row's group, -1 for padding) with every
               group padded to the alignment it asks for (get_mk_alignment_for_contiguous_layout)
- masked:      m_grouped_fp8_gemm_nt_masked((a [G,M,K], sfa), (b, sfb), d [G,M,N] bf16,
               masked_m [G] int32, expected_m); rows >= masked_m[g] are left unwritten
Float32 scales of the activations are handed over already in the MN-major,
TMA-aligned layout its kernels read (get_mn_major_tma_aligned_tensor, outside the
timed call), as cuBLAS gets its M-major scales: the timed call is the GEMM.
"""
from __future__ import annotations

from harness import torch_glue
from harness.registry import Unavailable


def module(env):
  """deep_gemm, where it can run here; else Unavailable saying why."""
  if not env.on_gpu:
    raise Unavailable("needs an NVIDIA GPU (DeepGEMM's CUDA kernels)")
  if env.target_compute_capability[0] != 9:
    raise Unavailable("wired for Hopper's float32 scales (DeepGEMM wants UE8M0 scales on "
                      "other GPUs)")
  torch_glue.cuda_torch()
  try:
    import deep_gemm
  except Exception as e:  # noqa: BLE001 (not built, or built against another torch)
    raise Unavailable(f"deep_gemm is not importable ({type(e).__name__}: {e}); DeepGEMM "
                      "2.6.1 is built on the GPU machine (issue 22)") from e
  return deep_gemm


def _function(dg, name):
  fn = getattr(dg, name, None)
  if fn is None:
    raise Unavailable(f"deep_gemm {getattr(dg, '__version__', '?')} has no {name}")
  return fn


def mn_major_scales(dg, sf):
  """Per-row float32 scales in the layout DeepGEMM's kernels read (else as given, and
  DeepGEMM transposes them inside the timed call)."""
  fn = getattr(dg, "get_mn_major_tma_aligned_tensor", None)
  return sf if fn is None else fn(sf)


def dense(env, out_dtype_name: str):
  """(fn, prepare) for the 1D2D GEMM of the dense benchmark's input sets."""
  dg = module(env)
  if out_dtype_name != "bfloat16":
    raise Unavailable("DeepGEMM's Hopper 1D2D GEMM writes bfloat16 only")
  gemm = _function(dg, "fp8_gemm_nt")
  torch = torch_glue.cuda_torch()

  def prepare(s):
    a, b = torch_glue.to_torch(s.a), torch_glue.to_torch(s.b)
    sa = mn_major_scales(dg, torch_glue.to_torch(s.a_scale))
    sb = torch_glue.to_torch(s.b_scale).contiguous()
    d = torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
    return a, sa, b, sb, d

  def fn(a, sa, b, sb, d):
    gemm((a, sa), (b, sb), d)
    return d

  return fn, prepare


def wgrad(env):
  """(fn, prepare) for the 1D1D GEMM (per-row scales on both operands, float32 d += a b^T)."""
  dg = module(env)
  gemm = _function(dg, "fp8_gemm_nt")
  torch = torch_glue.cuda_torch()

  def prepare(s):
    a, b = torch_glue.to_torch(s.a), torch_glue.to_torch(s.b)
    sa = mn_major_scales(dg, torch_glue.to_torch(s.a_scale))
    sb = mn_major_scales(dg, torch_glue.to_torch(s.b_scale))
    d = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)
    return a, sa, b, sb, d

  def fn(a, sa, b, sb, d):
    gemm((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128))
    return d

  return fn, prepare


def contiguous(env, group_sizes):
  """(fn, prepare, result) for the m-grouped contiguous GEMM; `result` takes the real
  rows out of DeepGEMM's padded layout (not timed)."""
  dg = module(env)
  gemm = _function(dg, "m_grouped_fp8_gemm_nt_contiguous")
  torch = torch_glue.cuda_torch()
  theoretical = getattr(dg, "get_theoretical_mk_alignment_for_contiguous_layout", None)
  if theoretical is not None:
    dg.set_mk_alignment_for_contiguous_layout(theoretical())
  align = int(dg.get_mk_alignment_for_contiguous_layout())
  sizes = [max(0, int(g)) for g in group_sizes]
  padded = [-(-g // align) * align for g in sizes]
  layout, real_rows, start = [], [], 0
  for g, (size, pad) in enumerate(zip(sizes, padded)):
    layout += [g] * size + [-1] * (pad - size)
    real_rows += list(range(start, start + size))
    start += pad

  def prepare(s):
    dev = torch.device("cuda")
    rows = torch.tensor(real_rows, dtype=torch.long, device=dev)
    a_real, sa_real = torch_glue.to_torch(s.a), torch_glue.to_torch(s.a_scale)
    # Padding rows: zero values (scale 1); FP8 moves as bytes (no FP8 index_put in torch).
    a = torch.zeros((start, a_real.shape[1]), dtype=torch.uint8, device=dev)
    a[rows] = a_real.view(torch.uint8)[:len(real_rows)]
    a = a.view(a_real.dtype)
    sa = torch.ones((start, sa_real.shape[1]), dtype=torch.float32, device=dev)
    sa[rows] = sa_real[:len(real_rows)]
    b = torch_glue.to_torch(s.b)
    sb = torch_glue.to_torch(s.b_scale).contiguous()
    d = torch.empty((start, b.shape[1]), dtype=torch.bfloat16, device=dev)
    m_layout = torch.tensor(layout, dtype=torch.int32, device=dev)
    return a, mn_major_scales(dg, sa), b, sb, d, m_layout

  def fn(a, sa, b, sb, d, m_layout):
    gemm((a, sa), (b, sb), d, m_layout)
    return d

  def result(d):
    rows = torch.tensor(real_rows, dtype=torch.long, device=d.device)
    return d.index_select(0, rows)

  return fn, prepare, result


def masked(env, expected_m: int):
  """(fn, prepare, result) for the m-grouped masked GEMM; `result` zeroes the rows
  past each group's count, which DeepGEMM leaves unwritten (not timed)."""
  dg = module(env)
  gemm = _function(dg, "m_grouped_fp8_gemm_nt_masked")
  torch = torch_glue.cuda_torch()

  def prepare(s):
    a, b = torch_glue.to_torch(s.a), torch_glue.to_torch(s.b)
    sa = mn_major_scales(dg, torch_glue.to_torch(s.a_scale))
    sb = torch_glue.to_torch(s.b_scale).contiguous()
    d = torch.empty((a.shape[0], a.shape[1], b.shape[1]), dtype=torch.bfloat16,
                    device=a.device)
    m = torch_glue.to_torch(s.masked_m).to(torch.int32).contiguous()
    return a, sa, b, sb, d, m

  def fn(a, sa, b, sb, d, m):
    gemm((a, sa), (b, sb), d, m, expected_m)
    return d

  def result(d, masked_m_host):
    rows = torch.arange(d.shape[1], device=d.device)
    counts = torch.tensor(masked_m_host, device=d.device)
    keep = (rows[None, :] < counts[:, None])[..., None]
    # where, not d * keep: an unwritten row may hold NaN, and NaN * 0 is NaN.
    return torch.where(keep, d, torch.zeros((), dtype=d.dtype, device=d.device))

  return fn, prepare, result
