// Blockwise-scaled FP8 matmul (DeepSeek-V3 style) as an XLA FFI custom call.
//
//   out[m, n] = sum_kb (sum_{k in kb} a[m, k] * b[n, k]) * a_scale[m, kb] * b_scale[n / 128, kb]
//               (+ beta * c[m, n])
//
// a: [M, K] e4m3, b: [N, K] e4m3 (both K-major), a_scale: [M, ceil(K/128)] f32,
// b_scale: [ceil(N/128), ceil(K/128)] f32, c: [M, N] f32 (optional), out: [M, N] bf16 or f32.
//
// Design (portable to sm_89+, so it uses mma.sync rather than wgmma/tcgen05):
// - One CTA computes a tile_m x tile_n = 128 x 128 output tile with 8 warps (2 x 4), each warp
//   a 64 x 32 sub-tile made of 4 x 4 m16n8k32 e4m3 MMAs.
// - k_block = 128 = one scale group: every pipeline stage holds exactly one K block of A and B,
//   so the promotion (two-level accumulation) happens once per stage: the block's MMAs
//   accumulate into a fresh f32 fragment, which is then scaled by a_scale[row] * b_scale and
//   added into the f32 accumulator on the CUDA cores. This keeps FP8 tensor-core accumulation
//   to 128-deep sums.
// - Operands stream through a `stages`-deep cp.async ring in shared memory. Rows are 128 bytes;
//   the 16-byte chunk index is XOR-swizzled with (row & 7) so that ldmatrix (8 rows at one
//   chunk column) and cp.async (whole rows) are both bank-conflict free.
// - Edges: rows past M / N and columns past K are zero-filled (cp.async src-size 0), so a
//   partial last K block adds nothing; stores are guarded. When K % 16 != 0 (or a pointer is not
//   16-byte aligned) the 16-byte cp.async is not legal and a guarded byte-wise loader is used.
// - Split-K (grid.y > 1, for grids smaller than the GPU): each split writes an f32 partial tile
//   into a workspace; a second kernel sums the splits, adds beta * c and casts.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_fp8 {
namespace {

constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kBlockK = 128;  // = the scale group; one K block per pipeline stage.
constexpr int kWarpsM = 2;
constexpr int kWarpsN = 4;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWarpTileM = kTileM / kWarpsM;  // 64
constexpr int kWarpTileN = kTileN / kWarpsN;  // 32
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 32;
constexpr int kFragsM = kWarpTileM / kMmaM;  // 4
constexpr int kFragsN = kWarpTileN / kMmaN;  // 4
constexpr int kOperandBytes = kTileM * kBlockK;  // one operand tile of one stage (A or B)
constexpr int kStageBytes = 2 * kOperandBytes;
constexpr int kChunksPerRow = kBlockK / 16;
constexpr int kChunksPerThread = kOperandBytes / 16 / kThreads;  // 4
constexpr int kMaxStages = 4;
// Scales of one stage, in their own ring after the operand stages: a_scale of the tile's
// 128 rows, then b_scale (padded to 16 bytes).
constexpr int kScaleFloats = kTileM + 4;
constexpr int kScaleStageBytes = kScaleFloats * 4;

constexpr int smem_bytes_for(int stages) { return stages * (kStageBytes + kScaleStageBytes); }

static_assert(kTileM == kTileN, "the loader assumes square A and B stage tiles");
static_assert(kTileN == 128, "one b_scale per CTA and K block needs tile_n == 128");
static_assert(kFragsN % 2 == 0, "B fragments are loaded two n8 tiles per ldmatrix.x4");

struct Params {
  const uint8_t* a;        // [m, k]
  const float* a_scale;    // [m, k_blocks]
  const uint8_t* b;        // [n, k]
  const float* b_scale;    // [ceil(n/128), k_blocks]
  const float* c;          // [m, n] or nullptr
  void* out;               // [m, n] OutT (splits == 1)
  float* partial;          // [splits, m, n] f32 (splits > 1)
  int m, n, k, k_blocks;
  int blocks_per_split;    // K blocks per grid.y slice
  int stages;              // cp.async ring depth
  int group_m;             // M tiles per raster group (L2 reuse of B)
  float beta;
};

// ---- PTX wrappers -------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; bytes past src_bytes (0 or 16 here) are zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// 4-byte async copy (scales); zero-filled when src_bytes == 0.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `pending` committed groups are still in flight (needs an immediate).
__device__ __forceinline__ void cp_async_wait(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
  }
}

__device__ __forceinline__ void st_shared_v4(uint32_t dst, uint32_t x, uint32_t y, uint32_t z,
                                             uint32_t w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(x), "r"(y), "r"(z),
               "r"(w)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                            uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// d += a * b for one m16n8k32 tile, e4m3 inputs, f32 accumulation.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled 128-byte-row tile.
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kBlockK + ((chunk ^ (row & 7)) << 4));
}

// ---- Loads of one stage ---------------------------------------------------------------------

// Copies rows [0, 128) x columns [k0, k0 + 128) of a row-major [rows_valid.., k] fp8 matrix
// (starting at `src`, row stride k) into the swizzled tile at `dst`, zero-filling rows past
// rows_valid and columns past k. kVec: 16-byte cp.async (needs k % 16 == 0 and a 16-byte aligned
// src); else guarded byte loads with ordinary shared stores.
template <bool kVec>
__device__ __forceinline__ void load_operand(uint32_t dst, const uint8_t* src, int rows_valid,
                                             int k, int k0, int tid) {
  // Thread tid copies chunk tid % 8 of rows tid / 8 + 32 * i. 32 is a multiple of the swizzle
  // period 8, so all of a thread's chunks share one swizzled column.
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kRowsPerPass % 8 == 0, "the swizzle must repeat every pass");
  const int row = tid / kChunksPerRow;
  const int chunk = tid % kChunksPerRow;
  const int col = k0 + chunk * 16;
  const uint32_t d = dst + swizzled(row, chunk);
  const uint8_t* p = src + static_cast<size_t>(row) * k;
  const size_t step = static_cast<size_t>(kRowsPerPass) * k;
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i, p += step) {
    const bool row_ok = row + i * kRowsPerPass < rows_valid;
    const uint32_t di = d + i * kRowsPerPass * kBlockK;
    if constexpr (kVec) {
      const bool ok = row_ok && col < k;
      cp_async_16(di, ok ? p + col : src, ok ? 16 : 0);
    } else {
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (row_ok) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (col + j < k) w[j >> 2] |= static_cast<uint32_t>(p[col + j]) << (8 * (j & 3));
        }
      }
      st_shared_v4(di, w[0], w[1], w[2], w[3]);
    }
  }
}

// ---- Output stores --------------------------------------------------------------------------

template <typename OutT>
__device__ __forceinline__ OutT cast_out(float x);
template <>
__device__ __forceinline__ float cast_out<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 cast_out<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Stores the pair (row, col), (row, col + 1); col is even. `pair_ok`: both columns are in
// range and the pair is aligned for one vector access (n even).
template <typename OutT>
__device__ __forceinline__ void store_pair(OutT* out, size_t offset, float v0, float v1,
                                           bool pair_ok, bool second_ok) {
  if (pair_ok) {
    if constexpr (sizeof(OutT) == 4) {
      *reinterpret_cast<float2*>(out + offset) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(out + offset) = __floats2bfloat162_rn(v0, v1);
    }
  } else {
    out[offset] = cast_out<OutT>(v0);
    if (second_ok) out[offset + 1] = cast_out<OutT>(v1);
  }
}

// ---- The GEMM kernel ------------------------------------------------------------------------

template <typename OutT, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) blockwise_fp8_gemm(const Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;

  // Grouped raster: consecutive CTAs walk group_m M tiles before moving along N, so the
  // B tiles they share stay in L2.
  const int tiles_m = (p.m + kTileM - 1) / kTileM;
  const int tiles_n = (p.n + kTileN - 1) / kTileN;
  const int per_group = p.group_m * tiles_n;
  const int pid = blockIdx.x;
  const int first_m = (pid / per_group) * p.group_m;
  const int group_rows = min(tiles_m - first_m, p.group_m);
  const int tile_m = first_m + (pid % per_group) % group_rows;
  const int tile_n = (pid % per_group) / group_rows;

  const int split = blockIdx.y;
  const int kb_begin = split * p.blocks_per_split;
  const int kb_end = min(p.k_blocks, kb_begin + p.blocks_per_split);
  const int num_kb = kb_end - kb_begin;

  const int row0 = tile_m * kTileM;
  const int col0 = tile_n * kTileN;
  const uint8_t* a_tile = p.a + static_cast<size_t>(row0) * p.k;
  const uint8_t* b_tile = p.b + static_cast<size_t>(col0) * p.k;
  const int a_rows = p.m - row0;
  const int b_rows = p.n - col0;
  const uint32_t smem0 = smem_addr(smem);

  const float* scale_smem =
      reinterpret_cast<const float*>(smem + p.stages * kStageBytes);  // [stages][kScaleFloats]
  const uint32_t scale_smem0 = smem0 + p.stages * kStageBytes;

  auto load_stage = [&](int slot, int kb) {
    const uint32_t base = smem0 + slot * kStageBytes;
    load_operand<kVec>(base, a_tile, a_rows, p.k, kb * kBlockK, tid);
    load_operand<kVec>(base + kOperandBytes, b_tile, b_rows, p.k, kb * kBlockK, tid);
    // Threads 0..127 fetch a_scale of row tid, thread 128 the tile's b_scale.
    const uint32_t sbase = scale_smem0 + slot * kScaleStageBytes;
    if (tid < kTileM) {
      const bool ok = tid < a_rows;
      const float* src = p.a_scale + (ok ? static_cast<size_t>(row0 + tid) * p.k_blocks + kb : 0);
      cp_async_4(sbase + tid * 4, src, ok ? 4 : 0);
    } else if (tid == kTileM) {
      cp_async_4(sbase + kTileM * 4, p.b_scale + static_cast<size_t>(tile_n) * p.k_blocks + kb, 4);
    }
  };

  // Prologue: fill stages - 1 slots. One commit per slot, even when empty, keeps the
  // group count in step with the slot index.
  for (int s = 0; s < p.stages - 1; ++s) {
    if (s < num_kb) load_stage(s, kb_begin + s);
    cp_async_commit();
  }

  const int group = lane / 4;   // MMA fragment row within 8
  const int quad = lane % 4;    // MMA fragment column pair

  // ldmatrix lane addresses (byte offsets in a stage before the swizzle, which depends on
  // the K step). A: lanes 0-7 rows 0-7 / k 0-15, 8-15 rows 8-15, 16-23 rows 0-7 / k 16-31,
  // 24-31 rows 8-15 / k 16-31 -> registers a0..a3 of m16n8k32. B (two n8 tiles per x4):
  // lanes 0-7 n 0-7 / k 0-15, 8-15 n 0-7 / k 16-31, 16-23 n 8-15 / k 0-15, 24-31 n 8-15 / k 16-31.
  const int a_ld_row = warp_m * kWarpTileM + (lane % 8) + ((lane / 8) % 2) * 8;
  const int a_ld_chunk = lane / 16;
  const int b_ld_row = warp_n * kWarpTileN + (lane % 8) + (lane / 16) * 8;
  const int b_ld_chunk = (lane / 8) % 2;

  float acc[kFragsM][kFragsN][4];
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  for (int it = 0; it < num_kb; ++it) {
    cp_async_wait(p.stages - 2);  // this thread's copies for slot `it` have landed
    __syncthreads();              // everyone's have; and everyone is done with slot it - 1

    // Refill the slot consumed in the previous iteration.
    const int next = it + p.stages - 1;
    if (next < num_kb) load_stage(next % p.stages, kb_begin + next);
    cp_async_commit();

    const uint32_t a_stage = smem0 + (it % p.stages) * kStageBytes;
    const uint32_t b_stage = a_stage + kOperandBytes;

    // One K block on the tensor cores, into a fresh fragment.
    float blk[kFragsM][kFragsN][4];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) blk[i][j][r] = 0.0f;

    // Not unrolled on purpose: unrolled, ptxas hoists every K step's fragments and spills
    // (acc + blk already hold 128 registers); rolled it stays at ~252 with no spills.
#pragma unroll 1
    for (int ks = 0; ks < kBlockK / kMmaK; ++ks) {
      uint32_t af[kFragsM][4];
      uint32_t bf[kFragsN][2];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
        const int row = a_ld_row + i * kMmaM;
        ldmatrix_x4(a_stage + swizzled(row, ks * 2 + a_ld_chunk), af[i][0], af[i][1], af[i][2],
                    af[i][3]);
      }
#pragma unroll
      for (int j = 0; j < kFragsN; j += 2) {
        const int row = b_ld_row + j * kMmaN;
        ldmatrix_x4(b_stage + swizzled(row, ks * 2 + b_ld_chunk), bf[j][0], bf[j][1],
                    bf[j + 1][0], bf[j + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) mma_e4m3(blk[i][j], af[i], bf[j]);
    }

    // Promotion: acc += blk * a_scale[row] * b_scale, in f32 on the CUDA cores.
    const float* scales = scale_smem + (it % p.stages) * kScaleFloats;
    const float sb = scales[kTileM];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = scales[warp_m * kWarpTileM + i * kMmaM + h * 8 + group] * sb;
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          acc[i][j][2 * h] = fmaf(blk[i][j][2 * h], s, acc[i][j][2 * h]);
          acc[i][j][2 * h + 1] = fmaf(blk[i][j][2 * h + 1], s, acc[i][j][2 * h + 1]);
        }
      }
    }
  }
  cp_async_wait(0);  // no copy may outlive the CTA's shared memory

  // Epilogue straight from registers: fragment (i, j) holds rows group / group + 8 and
  // columns 2 * quad, 2 * quad + 1 of its 16 x 8 tile.
  const bool even_n = (p.n % 2) == 0;
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + warp_m * kWarpTileM + i * kMmaM + h * 8 + group;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int col = col0 + warp_n * kWarpTileN + j * kMmaN + 2 * quad;
        if (col >= p.n) continue;
        const bool second_ok = col + 1 < p.n;
        const bool pair_ok = second_ok && even_n;
        const size_t off = static_cast<size_t>(row) * p.n + col;
        float v0 = acc[i][j][2 * h];
        float v1 = acc[i][j][2 * h + 1];
        if (gridDim.y > 1) {
          float* part = p.partial + static_cast<size_t>(split) * p.m * p.n;
          store_pair<float>(part, off, v0, v1, pair_ok, second_ok);
        } else {
          if (p.c != nullptr) {
            if (pair_ok) {
              const float2 cv = *reinterpret_cast<const float2*>(p.c + off);
              v0 = fmaf(p.beta, cv.x, v0);
              v1 = fmaf(p.beta, cv.y, v1);
            } else {
              v0 = fmaf(p.beta, p.c[off], v0);
              if (second_ok) v1 = fmaf(p.beta, p.c[off + 1], v1);
            }
          }
          store_pair<OutT>(static_cast<OutT*>(p.out), off, v0, v1, pair_ok, second_ok);
        }
      }
    }
  }
}

// Sums the split-K partials, adds beta * c and casts.
template <typename OutT>
__global__ void __launch_bounds__(256) reduce_splits(const float* __restrict__ partial,
                                                     int splits, size_t count,
                                                     const float* __restrict__ c, float beta,
                                                     OutT* __restrict__ out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += partial[s * count + i];
    if (c != nullptr) v = fmaf(beta, c[i], v);
    out[i] = cast_out<OutT>(v);
  }
}

// ---- Host side ------------------------------------------------------------------------------

ffi::Error cuda_error(cudaError_t err, const char* what) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_fp8 blockwise_fp8_dot: ") + what + ": " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

ffi::Error invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("jax_fp8 blockwise_fp8_dot: " + what);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename OutT, bool kVec>
ffi::Error launch_gemm(cudaStream_t stream, const Params& p, int splits) {
  auto kernel = blockwise_fp8_gemm<OutT, kVec>;
  const int smem_bytes = smem_bytes_for(p.stages);
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return cuda_error(err, "cudaFuncSetAttribute");
  const int tiles = ((p.m + kTileM - 1) / kTileM) * ((p.n + kTileN - 1) / kTileN);
  kernel<<<dim3(tiles, splits), kThreads, smem_bytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error(err, "GEMM kernel launch");
  return ffi::Error::Success();
}

template <typename OutT>
ffi::Error run(cudaStream_t stream, Params p, int splits, bool vec) {
  ffi::Error e = vec ? launch_gemm<OutT, true>(stream, p, splits)
                     : launch_gemm<OutT, false>(stream, p, splits);
  if (e.failure() || splits == 1) return e;
  const size_t count = static_cast<size_t>(p.m) * p.n;
  const size_t blocks = (count + 255) / 256;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  reduce_splits<OutT><<<grid, 256, 0, stream>>>(p.partial, splits, count, p.c, p.beta,
                                                static_cast<OutT*>(p.out));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error(err, "split-K reduction launch");
  return ffi::Error::Success();
}

bool dims_are(const ffi::AnyBuffer& buf, int64_t d0, int64_t d1) {
  const auto dims = buf.dimensions();
  return dims.size() == 2 && dims[0] == d0 && dims[1] == d1;
}

ffi::Error blockwise_fp8_dot_impl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_scale,
                                  ffi::AnyBuffer b, ffi::AnyBuffer b_scale, ffi::AnyBuffer c,
                                  ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> workspace, float beta,
                                  int32_t has_c, int32_t splits, int32_t group_m,
                                  int32_t poison) {
  if (a.element_type() != ffi::F8E4M3FN || b.element_type() != ffi::F8E4M3FN)
    return invalid("a and b must be float8_e4m3fn");
  if (a_scale.element_type() != ffi::F32 || b_scale.element_type() != ffi::F32)
    return invalid("a_scale and b_scale must be float32");
  if (c.element_type() != ffi::F32) return invalid("c must be float32 (cast it before the call)");
  if (workspace->element_type() != ffi::F32) return invalid("the workspace must be float32");
  const ffi::DataType out_type = out->element_type();
  if (out_type != ffi::BF16 && out_type != ffi::F32)
    return invalid("the output must be bfloat16 or float32");
  if (a.dimensions().size() != 2 || b.dimensions().size() != 2)
    return invalid("a must be [M, K] and b [N, K]");
  const int64_t m = a.dimensions()[0], k = a.dimensions()[1], n = b.dimensions()[0];
  if (b.dimensions()[1] != k) return invalid("a and b must have the same K");
  if (m < 1 || n < 1 || k < 1) return invalid("M, N and K must be >= 1");
  if (m > INT32_MAX / 2 || n > INT32_MAX / 2 || k > INT32_MAX / 2)
    return invalid("M, N and K must fit in 31 bits");
  const int64_t kb = (k + kBlockK - 1) / kBlockK;
  const int64_t nb = (n + kTileN - 1) / kTileN;
  if (!dims_are(a_scale, m, kb)) return invalid("a_scale must be [M, ceil(K/128)]");
  if (!dims_are(b_scale, nb, kb)) return invalid("b_scale must be [ceil(N/128), ceil(K/128)]");
  if (has_c && !dims_are(c, m, n)) return invalid("c must be [M, N]");
  if (!dims_are(*out, m, n)) return invalid("the output must be [M, N]");
  if (splits < 1 || splits > kb) return invalid("splits must be in [1, ceil(K/128)]");
  if (group_m < 1) return invalid("group_m must be >= 1");
  if (splits > 1 && workspace->element_count() < static_cast<size_t>(splits) * m * n)
    return invalid("the workspace must hold splits * M * N float32 values");

  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_error(err, "cudaGetDevice");
  int smem_optin = 0;
  err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return cuda_error(err, "cudaDeviceGetAttribute");
  int stages = kMaxStages;
  while (stages > 2 && smem_bytes_for(stages) > smem_optin) --stages;
  if (smem_bytes_for(stages) > smem_optin) return invalid("the GPU has too little shared memory for two stages");

  Params p;
  p.a = static_cast<const uint8_t*>(a.untyped_data());
  p.a_scale = static_cast<const float*>(a_scale.untyped_data());
  p.b = static_cast<const uint8_t*>(b.untyped_data());
  p.b_scale = static_cast<const float*>(b_scale.untyped_data());
  p.c = has_c ? static_cast<const float*>(c.untyped_data()) : nullptr;
  p.out = out->untyped_data();
  p.partial = static_cast<float*>(workspace->untyped_data());
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.k_blocks = static_cast<int>(kb);
  // Even split of the K blocks; recompute the count so no slice is empty.
  p.blocks_per_split = static_cast<int>((kb + splits - 1) / splits);
  splits = static_cast<int32_t>((kb + p.blocks_per_split - 1) / p.blocks_per_split);
  p.stages = stages;
  p.group_m = group_m;
  p.beta = beta;
  if (poison) {
    // Tests: all-ones bytes are NaN in f32 and bf16, so an element the kernels miss shows.
    err = cudaMemsetAsync(p.out, 0xFF, out->size_bytes(), stream);
    if (err != cudaSuccess) return cuda_error(err, "cudaMemsetAsync (poison)");
  }
  // 16-byte cp.async needs 16-byte aligned rows.
  const bool vec = k % 16 == 0 && aligned16(p.a) && aligned16(p.b);
  return out_type == ffi::BF16 ? run<__nv_bfloat16>(stream, p, splits, vec)
                               : run<float>(stream, p, splits, vec);
}

}  // namespace
}  // namespace jax_fp8

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxFp8BlockwiseFp8Dot, jax_fp8::blockwise_fp8_dot_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // a_scale
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // b_scale
                                  .Arg<ffi::AnyBuffer>()  // c (dummy when has_c == 0)
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // split-K workspace
                                  .Attr<float>("beta")
                                  .Attr<int32_t>("has_c")
                                  .Attr<int32_t>("splits")
                                  .Attr<int32_t>("group_m")
                                  .Attr<int32_t>("poison"));  // NaN-fill out first (tests)
