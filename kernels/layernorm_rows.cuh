// The row machinery LayerNorm's kernels share (kernels/layernorm.cu, kernels/add_layernorm.cu): one warp per row,
// a lane owning the row's chunks of 8 elements lane, lane + 32, ...; the row statistics every kernel computes the
// same way (so the same bits), and a chunk's LayerNorm values.
#pragma once
#include "core/launch_limits.h"
#include "kernels/cuda_common.cuh"
#include "kernels/layernorm_math.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp each

// Row access in chunks of 8 elements: 16-byte vectors when the rows allow it (kVec), else scalars
// with the tail masked. Each lane owns chunks lane, lane + 32, ... of its row.
template <bool kVec>
__device__ __forceinline__ void load8(const bf16* p, int c0, int C, float (&v)[8]) {
  if constexpr (kVec) {
    const auto q = Vec16<bf16>::load(p + c0);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(q.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = c0 + i < C ? __bfloat162float(p[c0 + i]) : 0.0f;
  }
}
template <bool kVec>
__device__ __forceinline__ void store8(bf16* p, int c0, int C, const float (&v)[8]) {
  if constexpr (kVec) {
    Vec16<bf16> q;
#pragma unroll
    for (int i = 0; i < 8; ++i) q.v[i] = __float2bfloat16_rn(v[i]);
    q.store(p + c0);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (c0 + i < C) p[c0 + i] = __float2bfloat16_rn(v[i]);
  }
}

// The row's mean and rstd from the lanes' partial sums (of the values; of the squared deviations from the mean):
// row_stats's last steps, also used by kernels that hold the row in registers, so that their bits are row_stats's.
__device__ __forceinline__ float row_mean(float lane_sum, int C) {
  return __fdiv_rn(warp_sum(lane_sum), static_cast<float>(C));
}
__device__ __forceinline__ float row_rstd(float lane_var, int C) {
  return rsqrtf(__fadd_rn(__fdiv_rn(warp_sum(lane_var), static_cast<float>(C)), kLayerNormEps));
}

// The row's mean and rstd (as .x, .y) in every lane of the warp: two passes (mean, then the mean
// square deviation), with explicit _rn arithmetic so that layernorm_forward_kernel and
// layernorm_stats_kernel, which both inline it, produce the same bits.
template <bool kVec>
__device__ __forceinline__ float2 row_stats(const bf16* x, int C, int lane) {
  float sum = 0.0f;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float v[8];
    load8<kVec>(x, c0, C, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum = __fadd_rn(sum, v[i]);
  }
  const float m = row_mean(sum, C);
  float var = 0.0f;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float v[8];
    load8<kVec>(x, c0, C, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float d = c0 + i < C ? __fsub_rn(v[i], m) : 0.0f;
      var = __fmaf_rn(d, d, var);
    }
  }
  return make_float2(m, row_rstd(var, C));
}

// The LayerNorm of the lane's chunk at c0 of row x (w, b: weight and bias), in f32 before any rounding. Past C (the
// scalar path's tail) x, w and b read as 0.
template <bool kVec>
__device__ __forceinline__ void layernorm_chunk(const bf16* x, const bf16* w, const bf16* b, int c0, int C, float m,
                                                float s, float (&v)[8]) {
  float wv[8], bv[8];
  load8<kVec>(x, c0, C, v);
  load8<kVec>(w, c0, C, wv);
  load8<kVec>(b, c0, C, bv);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = layernorm_value(v[i], m, s, wv[i], bv[i]);
}

// The grid for N rows, kRowsPerBlock per block: the kernels index rows in 64 bits, the grid must fit.
inline unsigned row_blocks(int64_t N, const char* op) {
  return checked_grid(ceil_div64(N, kRowsPerBlock), kMaxGridX, op, "N rows (8 per block)");
}

}  // namespace
}  // namespace fp8t::kernels
