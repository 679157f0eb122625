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
//
// Built for sm_90a (nvcc_command defines JAX_FP8_SM90A), the library also holds a Hopper kernel
// (TMA + WGMMA, namespace hopper below) that the handler prefers on compute capability 9.0
// devices whenever TMA can address the operands; the mma.sync kernel covers everything else.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(JAX_FP8_SM90A)
#include <cuda.h>  // CUtensorMap and its enums only: the driver is reached through the runtime
#endif

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

// ---- Hopper (sm_90a): TMA + WGMMA ------------------------------------------------------------
//
// Built only into the sm_90a library (nvcc_command defines JAX_FP8_SM90A there); the host picks
// it on a compute capability 9.0 device when the TMA preconditions hold (K % 16 == 0, 16-byte
// aligned a and b), else the mma.sync kernel above runs.
//
// - Persistent grid (one CTA per SM) walking (tile, split) work units in the grouped raster.
// - Warpgroup 2 is the producer: one thread issues TMA loads of the A and B tiles of one K block
//   (128 x 128 bytes each, SWIZZLE_128B) per stage of a `stages`-deep ring, with a full barrier
//   (TMA transaction bytes) and an empty barrier (one arrive per consumer warp) per stage.
// - Warpgroups 0 and 1 are consumers, 64 rows x 128 columns each: per K block, four
//   m64n128k32 e4m3 WGMMAs into a fresh f32 fragment (the first with scale-d = 0), then the
//   promotion acc += blk * a_scale[row] * b_scale on the CUDA cores (two-level accumulation,
//   as in the mma.sync kernel). The stage is released as soon as the WGMMAs have completed,
//   before the promotion, so the producer refills it while the CUDA cores work.
// - TMA zero-fills rows past M / N and columns past K, so partial tiles and a partial last
//   K block add nothing.
// - Epilogue: each consumer warp rewrites its 16 x 128 accumulator slice through a small
//   shared staging buffer into 16-byte row pieces, adds beta * c and stores them coalesced
//   (guarded scalar stores at the ragged N edge or for unaligned rows). Meanwhile the producer
//   is already loading the next tile's K blocks.
#if defined(JAX_FP8_SM90A)
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "JAX_FP8_SM90A needs the sm_90a target (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace hopper {

constexpr int kConsumers = 2;                      // consumer warpgroups
constexpr int kThreads = 128 * (kConsumers + 1);   // + the producer warpgroup
constexpr int kRowsPerConsumer = kTileM / kConsumers;  // 64 = the WGMMA M
constexpr int kStepK = 32;                         // K of one WGMMA (32 e4m3 = 32 bytes)
constexpr int kAccRegs = kRowsPerConsumer * kTileN / 128;  // 64 f32 per thread
constexpr int kMaxStages = 6;
constexpr int kSwizzleAtom = 1024;                 // 8 rows x 128 bytes
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;                 // 40 * 128 + 232 * 256 <= 65536

static_assert(kBlockK == 128, "one K block must be one 128-byte swizzled row");
static_assert(kOperandBytes % kSwizzleAtom == 0, "stage buffers must stay 1024-byte aligned");

// Epilogue staging, per consumer warp: 16 rows x 32 f32 columns, rows padded to 40 floats so
// that the fragment's 8-byte writes (8 rows x 4 column pairs per half warp) hit distinct banks.
constexpr int kStagingPitch = 40;
constexpr int kStagingFloatsPerWarp = 16 * kStagingPitch;
constexpr int kStagingBytes = kConsumers * 4 * kStagingFloatsPerWarp * 4;

// Shared memory: operand stages, epilogue staging, barriers; +kSwizzleAtom of slack to align
// the dynamic base.
constexpr int smem_bytes_for(int stages) {
  return kSwizzleAtom + stages * kStageBytes + kStagingBytes + 2 * stages * 8;
}

// The mma.sync kernel's parameters (a and b travel as tensor maps instead; `stages` is this
// kernel's TMA ring depth), plus what only this kernel needs.
struct Params : jax_fp8::Params {
  int splits;
  bool vec_out;      // 16-byte row pieces of out (and c) are aligned: n % (16 / sizeof(OutT))
  bool vec_partial;  // likewise for the split-K partials: n % 4
};

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// 2D TMA load of the box at (inner coordinate x = k, outer y = row) into `dst`, completing
// its bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// WGMMA shared-memory descriptor of a K-major operand in 128-byte-swizzled 8 x 128-byte atoms
// stacked along M/N (stride byte offset 1024). The leading byte offset is unused for swizzled
// K-major layouts. `addr` must lie in a 1024-byte aligned atom (base offset 0) plus a K offset
// inside the 128-byte row.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |  // start address
         (static_cast<uint64_t>(1) << 16) |                // leading byte offset (unused)
         (static_cast<uint64_t>(kSwizzleAtom >> 4) << 32) |  // stride byte offset
         (static_cast<uint64_t>(1) << 62);                  // layout: 128-byte swizzle
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// Keeps the compiler from moving accesses of the fragment across WGMMA issue / wait points.
__device__ __forceinline__ void fence_fragment(float (&d)[kAccRegs]) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A[64 x 32] . B[128 x 32]^T, e4m3 from shared memory, f32 in registers.
// accumulate == 0: d is overwritten (scale-d = 0), so a fresh block needs no zeroing.
__device__ __forceinline__ void wgmma_m64n128k32(float (&d)[kAccRegs], uint64_t desc_a,
                                                 uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
      "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),
        "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The work unit `unit` -> (tile_m, tile_n, split), in the same grouped raster as the mma.sync
// kernel: consecutive units walk group_m M tiles before moving along N (L2 reuse of B).
struct WorkUnit {
  int tile_m, tile_n, kb_begin, kb_end;
};

__device__ __forceinline__ WorkUnit work_unit(const Params& p, int tiles_m, int tiles_n,
                                              int unit) {
  const int tiles = tiles_m * tiles_n;
  const int split = unit / tiles;
  const int t = unit % tiles;
  const int per_group = p.group_m * tiles_n;
  const int first_m = (t / per_group) * p.group_m;
  const int group_rows = min(tiles_m - first_m, p.group_m);
  WorkUnit w;
  w.tile_m = first_m + (t % per_group) % group_rows;
  w.tile_n = (t % per_group) / group_rows;
  w.kb_begin = split * p.blocks_per_split;
  w.kb_end = min(p.k_blocks, w.kb_begin + p.blocks_per_split);
  return w;
}

// Writes v[0, valid) to dst[off, off + valid), + beta * c[off, ...) when c is given; as one
// 16-byte store (and 16-byte c loads) when `vec` (all E valid and the piece 16-byte aligned).
template <typename T, int E>
__device__ __forceinline__ void store_piece(T* dst, const float* c, float beta, size_t off,
                                            float (&v)[E], int valid, bool vec) {
  if (vec) {
    if (c != nullptr) {
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        const float4 cv = *reinterpret_cast<const float4*>(c + off + e);
        v[e] = fmaf(beta, cv.x, v[e]);
        v[e + 1] = fmaf(beta, cv.y, v[e + 1]);
        v[e + 2] = fmaf(beta, cv.z, v[e + 2]);
        v[e + 3] = fmaf(beta, cv.w, v[e + 3]);
      }
    }
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(dst + off) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      uint32_t words[E / 2];
#pragma unroll
      for (int i = 0; i < E / 2; ++i) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        memcpy(&words[i], &pair, sizeof(pair));
      }
      *reinterpret_cast<uint4*>(dst + off) = make_uint4(words[0], words[1], words[2], words[3]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (e < valid) {
        float x = v[e];
        if (c != nullptr) x = fmaf(beta, c[off + e], x);
        dst[off + e] = cast_out<T>(x);
      }
    }
  }
}

// Stores one warp's 16 x 128 slice of the accumulator (rows from warp_row0, columns from
// col0) into the row-major [m, n] `dst`. The WGMMA layout scatters column pairs over 8 rows,
// so the slice goes through the warp's staging buffer 32 columns at a time and is read back
// as 16-byte row pieces: global stores and c loads become whole, coalesced vectors.
template <typename T>
__device__ __forceinline__ void store_fragment(const float (&acc)[kAccRegs], float* staging,
                                               T* dst, const float* c, float beta, int m, int n,
                                               int warp_row0, int col0, bool vec, int lane) {
  constexpr int E = 16 / sizeof(T);           // elements per 16-byte piece
  constexpr int kLanesPerRow = 32 / E;        // lanes covering one row of a 32-column chunk
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  const int r = lane / 4;
  const int q = lane % 4;
#pragma unroll
  for (int chunk = 0; chunk < kTileN / 32; ++chunk) {
    __syncwarp();  // the previous chunk (or tile) has been read back
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 4 * chunk + jj;
      *reinterpret_cast<float2*>(staging + r * kStagingPitch + 8 * jj + 2 * q) =
          make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(staging + (r + 8) * kStagingPitch + 8 * jj + 2 * q) =
          make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
    __syncwarp();
#pragma unroll
    for (int pass = 0; pass < 16 / kRowsPerPass; ++pass) {
      const int piece_row = pass * kRowsPerPass + lane / kLanesPerRow;
      const int piece_col = (lane % kLanesPerRow) * E;
      const int row = warp_row0 + piece_row;
      const int col = col0 + 32 * chunk + piece_col;
      if (row >= m || col >= n) continue;
      float v[E];
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        const float4 x =
            *reinterpret_cast<const float4*>(staging + piece_row * kStagingPitch + piece_col + e);
        v[e] = x.x;
        v[e + 1] = x.y;
        v[e + 2] = x.z;
        v[e + 3] = x.w;
      }
      const int valid = min(E, n - col);
      store_piece<T, E>(dst, c, beta, static_cast<size_t>(row) * n + col, v, valid,
                        vec && valid == E);
    }
  }
}

template <typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_fp8_gemm(const __grid_constant__ CUtensorMap a_map,
                    const __grid_constant__ CUtensorMap b_map, const Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Swizzle atoms (and so the stages) need 1024-byte alignment; the dynamic base may not be.
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t stages0 = (raw + kSwizzleAtom - 1) & ~static_cast<uint32_t>(kSwizzleAtom - 1);
  float* staging_base =
      reinterpret_cast<float*>(smem_raw + (stages0 - raw) + p.stages * kStageBytes);
  const uint32_t full0 = stages0 + p.stages * kStageBytes + kStagingBytes;  // full[s]: + 8 s
  const uint32_t empty0 = full0 + p.stages * 8;            // empty[s] at empty0 + 8 s

  const int warpgroup = threadIdx.x / 128;
  const int wg_tid = threadIdx.x % 128;
  const int tiles_m = (p.m + kTileM - 1) / kTileM;
  const int tiles_n = (p.n + kTileN - 1) / kTileN;
  const int units = tiles_m * tiles_n * p.splits;

  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(full0 + 8 * s, 1);                  // the producer's arrive.expect_tx
      mbar_init(empty0 + 8 * s, kConsumers * 4);    // one arrive per consumer warp
    }
    // Make the initialised barriers visible to the async proxy (TMA) too.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == kConsumers) {
    // ---- Producer warpgroup: one thread drives TMA; the rest hand their registers over.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (wg_tid != 0) return;
    prefetch_tensor_map(&a_map);
    prefetch_tensor_map(&b_map);
    int stage = 0;
    uint32_t phase = 0;
    for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
      const WorkUnit w = work_unit(p, tiles_m, tiles_n, unit);
      for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
        const uint32_t full = full0 + 8 * stage;
        mbar_wait(empty0 + 8 * stage, phase ^ 1);  // the first pass finds every slot free
        mbar_arrive_expect_tx(full, kStageBytes);   // out-of-bounds zeros count as bytes too
        const uint32_t a_dst = stages0 + stage * kStageBytes;
        tma_load_2d(a_dst, &a_map, full, kb * kBlockK, w.tile_m * kTileM);
        tma_load_2d(a_dst + kOperandBytes, &b_map, full, kb * kBlockK, w.tile_n * kTileN);
        if (++stage == p.stages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }

  // ---- Consumer warpgroups: rows [64 warpgroup, 64 warpgroup + 64) of each tile.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int warp = wg_tid / 32;
  const int lane = wg_tid % 32;
  // WGMMA accumulator layout: register 4 j + 2 h + c holds row 16 warp + lane / 4 + 8 h and
  // column 8 j + 2 (lane % 4) + c of the warpgroup's 64 x 128 fragment (store_fragment).
  const int frag_row = kRowsPerConsumer * warpgroup + 16 * warp + lane / 4;
  const uint32_t a_offset = warpgroup * kRowsPerConsumer * kBlockK;  // 8 whole atoms

  int stage = 0;
  uint32_t phase = 0;
  float blk[kAccRegs];  // one K block's product; the first WGMMA of a block overwrites it
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const WorkUnit w = work_unit(p, tiles_m, tiles_n, unit);
    const int row0 = w.tile_m * kTileM;
    const int col0 = w.tile_n * kTileN;
    // a_scale rows of this thread's two fragment rows (clamped: rows past M multiply zeros).
    const float* a_scale0 =
        p.a_scale + static_cast<size_t>(min(row0 + frag_row, p.m - 1)) * p.k_blocks;
    const float* a_scale1 =
        p.a_scale + static_cast<size_t>(min(row0 + frag_row + 8, p.m - 1)) * p.k_blocks;
    const float* b_scale = p.b_scale + static_cast<size_t>(w.tile_n) * p.k_blocks;

    float acc[kAccRegs];
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) acc[i] = 0.0f;

    // Scales are read one K block ahead, so their latency hides behind the WGMMAs.
    float sa0 = __ldg(a_scale0 + w.kb_begin);
    float sa1 = __ldg(a_scale1 + w.kb_begin);
    float sb = __ldg(b_scale + w.kb_begin);

    for (int kb = w.kb_begin; kb < w.kb_end; ++kb) {
      const uint32_t a_tile = stages0 + stage * kStageBytes;
      const uint64_t desc_a = smem_desc(a_tile + a_offset);
      const uint64_t desc_b = smem_desc(a_tile + kOperandBytes);
      mbar_wait(full0 + 8 * stage, phase);

      fence_fragment(blk);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / kStepK; ++ks) {
        // Next 32 bytes of K inside the swizzled row: start address + 32 (descriptor units
        // of 16 bytes); the hardware applies the 128-byte swizzle on the final address.
        wgmma_m64n128k32(blk, desc_a + 2 * ks, desc_b + 2 * ks, ks > 0);
      }
      wgmma_commit();
      wgmma_wait_all();
      fence_fragment(blk);
      if (lane == 0) mbar_arrive(empty0 + 8 * stage);  // the stage's operands are read

      const int next = kb + 1 < w.kb_end ? kb + 1 : kb;
      const float next_sa0 = __ldg(a_scale0 + next);
      const float next_sa1 = __ldg(a_scale1 + next);
      const float next_sb = __ldg(b_scale + next);

      // Promotion: acc += blk * a_scale[row] * b_scale, in f32 on the CUDA cores.
      const float s0 = sa0 * sb;
      const float s1 = sa1 * sb;
#pragma unroll
      for (int j = 0; j < kAccRegs / 4; ++j) {
        acc[4 * j + 0] = fmaf(blk[4 * j + 0], s0, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(blk[4 * j + 1], s0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(blk[4 * j + 2], s1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(blk[4 * j + 3], s1, acc[4 * j + 3]);
      }
      sa0 = next_sa0;
      sa1 = next_sa1;
      sb = next_sb;
      if (++stage == p.stages) {
        stage = 0;
        phase ^= 1;
      }
    }

    // Epilogue: + beta * c and cast, or the f32 partial of a split.
    float* staging = staging_base + (4 * warpgroup + warp) * kStagingFloatsPerWarp;
    const int warp_row0 = row0 + kRowsPerConsumer * warpgroup + 16 * warp;
    if (p.splits > 1) {
      const size_t split_offset =
          static_cast<size_t>(w.kb_begin / p.blocks_per_split) * p.m * p.n;
      store_fragment<float>(acc, staging, p.partial + split_offset, nullptr, 0.0f, p.m, p.n,
                            warp_row0, col0, p.vec_partial, lane);
    } else {
      store_fragment<OutT>(acc, staging, static_cast<OutT*>(p.out), p.c, p.beta, p.m, p.n,
                           warp_row0, col0, p.vec_out, lane);
    }
  }
}

}  // namespace hopper
#endif  // JAX_FP8_SM90A

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

// With split-K, sums the partials into the output (+ beta * c); nothing to do otherwise.
template <typename OutT>
ffi::Error finish_splits(cudaStream_t stream, const Params& p, int splits) {
  if (splits == 1) return ffi::Error::Success();
  const size_t count = static_cast<size_t>(p.m) * p.n;
  const size_t blocks = (count + 255) / 256;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  reduce_splits<OutT><<<grid, 256, 0, stream>>>(p.partial, splits, count, p.c, p.beta,
                                                static_cast<OutT*>(p.out));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error(err, "split-K reduction launch");
  return ffi::Error::Success();
}

template <typename OutT>
ffi::Error run(cudaStream_t stream, const Params& p, int splits, bool vec) {
  ffi::Error e = vec ? launch_gemm<OutT, true>(stream, p, splits)
                     : launch_gemm<OutT, false>(stream, p, splits);
  if (e.failure()) return e;
  return finish_splits<OutT>(stream, p, splits);
}

#if defined(JAX_FP8_SM90A)
namespace hopper {

// cuTensorMapEncodeTiled from the driver, found through the runtime (no -lcuda link).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr,
                                                             12000, cudaEnableDefault, &found);
#else
    const cudaError_t err =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// Tensor map of a [rows, k] K-major e4m3 operand, read in 128-row x 128-byte boxes with the
// 128-byte swizzle that the WGMMA descriptors expect; out-of-bounds elements read as zero.
bool encode_operand(EncodeTiledFn encode, CUtensorMap* map, const void* base, int64_t rows,
                    int64_t k) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};  // bytes; a multiple of 16
  const cuuint32_t box[2] = {kBlockK, kTileM};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether this call can take the WGMMA kernel: a cc 9.0 device, K rows that TMA can address
// (16-byte strides and base addresses), and enough shared memory for three stages.
// JAX_FP8_FFI_DISABLE_WGMMA=1 forces the mma.sync kernel (tests, comparisons).
bool usable(int cc_major, int cc_minor, int64_t k, const void* a, const void* b,
            int smem_optin) {
  const char* off = std::getenv("JAX_FP8_FFI_DISABLE_WGMMA");
  if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
  return cc_major == 9 && cc_minor == 0 && k % 16 == 0 && aligned16(a) && aligned16(b) &&
         smem_bytes_for(3) <= smem_optin && encode_tiled() != nullptr;
}

template <typename OutT>
ffi::Error run(cudaStream_t stream, const uint8_t* a, const uint8_t* b, int64_t k,
               const jax_fp8::Params& mp, int splits, int smem_optin, int num_sms) {
  CUtensorMap a_map, b_map;
  const EncodeTiledFn encode = encode_tiled();
  if (!encode_operand(encode, &a_map, a, mp.m, k) || !encode_operand(encode, &b_map, b, mp.n, k))
    return invalid("cuTensorMapEncodeTiled refused an operand");
  Params p;
  static_cast<jax_fp8::Params&>(p) = mp;
  p.splits = splits;
  p.vec_out = p.n % (16 / sizeof(OutT)) == 0 && aligned16(p.out) &&
              (p.c == nullptr || aligned16(p.c));
  p.vec_partial = p.n % 4 == 0 && aligned16(p.partial);
  p.stages = kMaxStages;
  while (p.stages > 3 && smem_bytes_for(p.stages) > smem_optin) --p.stages;

  auto kernel = hopper_fp8_gemm<OutT>;
  const int smem_bytes = smem_bytes_for(p.stages);
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return cuda_error(err, "cudaFuncSetAttribute (WGMMA kernel)");
  const int64_t units =
      static_cast<int64_t>((p.m + kTileM - 1) / kTileM) * ((p.n + kTileN - 1) / kTileN) * splits;
  const int grid = static_cast<int>(units < num_sms ? units : num_sms);  // persistent
  kernel<<<grid, kThreads, smem_bytes, stream>>>(a_map, b_map, p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error(err, "WGMMA GEMM kernel launch");
  return finish_splits<OutT>(stream, mp, splits);
}

}  // namespace hopper
#endif  // JAX_FP8_SM90A

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
#if defined(JAX_FP8_SM90A)
  int cc_major = 0, cc_minor = 0, num_sms = 0;
  err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cuda_error(err, "cudaDeviceGetAttribute");
  if (hopper::usable(cc_major, cc_minor, k, p.a, p.b, smem_optin)) {
    return out_type == ffi::BF16
               ? hopper::run<__nv_bfloat16>(stream, p.a, p.b, k, p, splits, smem_optin, num_sms)
               : hopper::run<float>(stream, p.a, p.b, k, p, splits, smem_optin, num_sms);
  }
#endif
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
