// Internal to the mma.sync attention kernels (kernels/attention.cu, kernels/attention_backward.cu): the
// tensor-core fragment helpers, the tile loads, the forward's tile sizes and the launchers' shared checks.
#pragma once
#include "core/launch_limits.h"
#include "kernels/attention.cuh"
#include "kernels/attention_common.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {


// Shared-memory rows are padded by 16 bytes so that the 8 row addresses of one ldmatrix hit distinct banks.
constexpr int kPad = 8;

// Four 8x8 bf16 matrices; lane i supplies the row address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

// d (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col).
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragment addresses (ld = row stride of the shared tile, in elements). Accumulator layout of one 16x8
// tile: lane = 4 g + t holds rows g and g + 8, columns 2t and 2t + 1.
// A operand (16 rows x 16 k) of a row-major tile; with .trans, the B operand (16 k x 16 n, two n-tiles)
// of a tile stored k-major, e.g. V (keys, HS) in P V.
__device__ __forceinline__ const bf16* frag_rows16(const bf16* s, int ld, int lane) {
  return s + (lane & 15) * ld + (lane >> 4) * 8;
}
// B operand (16 k x 16 n) of a tile stored n-major, e.g. K (keys, HS) in Q K^T: registers 0,1 hold n-tile
// 0 and 2,3 n-tile 1. With .trans, the A operand (16 rows x 16 k) of a tile stored k-major.
__device__ __forceinline__ const bf16* frag_cols16(const bf16* s, int ld, int lane) {
  return s + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8;
}

// Rows [row0, row0 + ROWS) of one head (HS channels at `src`, row stride `ld`) into sX (ROWS, HS + kPad),
// asynchronously; rows at or beyond T are zero.
template <int ROWS, int HS, int THREADS>
__device__ __forceinline__ void load_tile(bf16* sX, const bf16* src, int64_t ld, int row0, int T) {
  constexpr int kChunks = HS / 8, kIters = ROWS * kChunks / THREADS;
  static_assert(ROWS * kChunks % THREADS == 0);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = threadIdx.x + it * THREADS, r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = row0 + r < T;
    cp_async16(sX + r * (HS + kPad) + c, src + (valid ? row0 + r : 0) * ld + c, valid);
  }
}

constexpr int kFwdRows = 128, kFwdKeys = 64, kFwdThreads = 256;  // 8 warps x 16 query rows

// Whether head size HS runs the warpgroup-MMA kernels (kernels/attention_wgmma.cuh).
bool use_wgmma(int HS, const AttentionKernels& k) { return HS == 64 && k.wgmma && attention_wgmma_available(); }

void check_sizes(const char* what, const AttentionQkv& qkv, int B, int T, int NH, int HS, const AttentionKernels& k) {
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "{}: bad sizes B={} T={} NH={}", what, B, T, NH);
  FP8T_CHECK(HS == 64 || HS == 128, "{}: head size {} not supported (64 or 128)", what, HS);
  FP8T_CHECK((qkv.bf16 != nullptr) != (qkv.e4m3 != nullptr), "{}: qkv must be given either as bf16 or as E4M3 codes",
             what);
  if (qkv.bf16) {
    FP8T_CHECK(aligned16(qkv.bf16), "{}: qkv must be 16-byte aligned", what);
  } else {
    FP8T_CHECK(use_wgmma(HS, k), "{}: qkv as E4M3 codes needs the warpgroup-MMA kernels (head size 64 on a Hopper "
               "GPU, sm_90a build; attention_reads_codes), head size {}", what, HS);
    FP8T_CHECK(qkv.row_scale_inv && (reinterpret_cast<uintptr_t>(qkv.e4m3) & 7u) == 0,
               "{}: qkv's codes must be 8-byte aligned, with their per-row scale_inv", what);
  }
  FP8T_CHECK(int64_t{B} * NH <= 0x7fffffff && ceil_div(T, kFwdRows) <= 65535,
             "{}: grid too large (B={} NH={} T={})", what, B, NH, T);
  // The kernels take C = NH * HS and offsets up to 3 C within a row as int.
  checked_int(3 * int64_t{NH} * HS, what, "the qkv row length 3 * NH * HS");
}

}  // namespace
}  // namespace fp8t::kernels
