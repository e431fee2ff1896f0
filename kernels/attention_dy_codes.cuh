// Device helpers of the attention backward's dy codes (AttentionDyCodes, kernels/attention.cuh): the gradient of a
// 64-row x 64-channel tile of qkv written as E5M2 codes, row-major and transposed, with the cast's statistics, by
// the main pass (dK, dV: kernels/attention_wgmma_backward_kernel.cuh) and by the dQ pass
// (kernels/attention_dy_codes.cu). Each code is convert8's (kernels/fp8_convert8.cuh), the plain cast's bit for bit.
#pragma once
#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/attention_common.cuh"
#include "kernels/fp8_convert8.cuh"

namespace fp8t::kernels {
namespace {

constexpr Fp8Format kDyFormat = Fp8Format::e5m2;  // the backward format of precision.fp8.format: hybrid
constexpr int kDyTile = 64;                       // rows and channels of a tile

// Byte k (0..15) of the sixteen codes two convert8 calls gave (lo: values 0-7, hi: 8-15).
__device__ __forceinline__ uint8_t code_at(uint2 lo, uint2 hi, int k) {
  const uint2 w = k < 8 ? lo : hi;
  const uint32_t word = (k % 8) < 4 ? w.x : w.y;
  return static_cast<uint8_t>(word >> (8 * (k % 4)));
}

// One warp's statistics into the cast's outputs: one atomic each per warp (lane 0), none for zeros.
__device__ __forceinline__ void flush_warp_stats(ThreadStats s, const Fp8CastOutputs& out) {
  const unsigned amax = __reduce_max_sync(0xffffffffu, s.amax_bits);
  const unsigned saturated = __reduce_add_sync(0xffffffffu, s.saturated);
  if (threadIdx.x % 32 == 0) {
    if (out.amax && amax) atomicMax(reinterpret_cast<unsigned*>(out.amax), amax);
    if (out.saturated && saturated) atomicAdd(out.saturated, static_cast<unsigned long long>(saturated));
  }
}

// A staged tile of transposed codes, s_t[c * 64 + r] (channel c, row r), into codes_t (rows: the 3C channels, row
// length M): rows c0 + c, columns r0 .. r0 + n_rows - 1. 16-byte stores where the destination allows, else bytes.
// kThreadsT threads take part (tid: 0 .. kThreadsT - 1); s_t must be complete (after a barrier).
template <int kThreadsT>
__device__ __forceinline__ void store_codes_t(const uint8_t* s_t, uint8_t* codes_t, int64_t c0, int64_t r0,
                                              int n_rows, int64_t M, int tid = threadIdx.x) {
  const bool vec = (M % 16) == 0 && (r0 % 16) == 0;
  constexpr int kChunksT = kDyTile * kDyTile / 16;
#pragma unroll
  for (int p = 0; p < kChunksT / kThreadsT; ++p) {
    const int idx = p * kThreadsT + tid, c = idx / 4, q = idx % 4;
    const int first = 16 * q;
    if (first >= n_rows) continue;
    const uint8_t* src = s_t + c * kDyTile + first;
    uint8_t* dst = codes_t + (c0 + c) * M + r0 + first;
    if (vec && first + 16 <= n_rows) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int b = 0; b < 16 && first + b < n_rows; ++b) dst[b] = src[b];
    }
  }
}

// One stage of a warp's reduce-scatter over lanes lane ^ kMask: of v[0 .. kN - 1], the lane keeps the upper half if
// its kMask bit is set, else the lower, adds its partner's copy of that half, and leaves the sums in v[0 .. kN / 2).
template <int kMask, int kN>
__device__ __forceinline__ void reduce_scatter_stage(float (&v)[32]) {
  const bool upper = (threadIdx.x & kMask) != 0;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    const float send = upper ? v[i] : v[kN / 2 + i];
    const float keep = upper ? v[kN / 2 + i] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kMask);
  }
}

// The main pass's dK (times the softmax scale) and dV of one warpgroup (64 keys from k0 of head h, batch b) as dy
// codes, from its accumulators: thread (warp, g, t) holds keys k0 + 16 warp + g + 8 r, channels 8 j + 2 t + e
// in dk[j][2 r + e] (and dv). x is the bf16 value the plain path writes (0 + scale * dk, 0 + dv), zero past T.
// smem: 2 * 4096 + 2048 free bytes (16-byte aligned) for the transposed tiles and the column sums. All 128 threads
// of the warpgroup (tid 0 .. 127, warp 0 .. 3 within it) call it, once every MMA has read its tiles, and so do the
// block's other warpgroups (each with its own smem): it has a block barrier before the transposed stores.
// kCodes false: no codes; x goes into dqkv (B, T, 3C) bf16 as the plain path writes it (not accumulating), and only
// the column sums into dy.stats.colsum (non-null): qkv's bias gradient where its producer is a BF16 linear.
// kSyncThreads: the block barrier is named barrier 1 over that many threads (a warp-specialized kernel's computing
// warpgroups), not __syncthreads.
template <bool kCodes = true, int kSyncThreads = 0>
__device__ __forceinline__ void write_dkv_codes(const float (&dk)[8][4], const float (&dv)[8][4], float scale,
                                                const AttentionDyCodes& dy, uint8_t* smem, int b, int h, int k0,
                                                int T, int C, int64_t M, int warp, int g, int t,
                                                int tid = threadIdx.x, __nv_bfloat16* dqkv = nullptr) {
  constexpr int kTileT = kDyTile * kDyTile;
  const float s = kCodes ? *dy.scale : 0.0f;  // its load in flight while the values and their column sums are made
  const int64_t ld = 3 * int64_t{C};
  float* s_cs = reinterpret_cast<float*>(smem + 2 * kTileT);  // [4 warps][128]: K's 64 channels, then V's
  auto sync = [] {
    if constexpr (kSyncThreads == 0)
      __syncthreads();
    else
      named_barrier(1, kSyncThreads);
  };
  // The values, x[part][r][k] for channel 8 (k / 2) + 2 t + k % 2 of row 16 warp + g + 8 r (part 0: K, 1: V).
  // Each the bf16 value the plain path writes, rounded in pairs (bf16_round2: one conversion for two).
  float x[2][2][16];
  bool inside[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    inside[r] = k0 + 16 * warp + g + 8 * r < T;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 kv = bf16_round2(0.0f + scale * dk[j][2 * r], 0.0f + scale * dk[j][2 * r + 1]);
      const float2 vv = bf16_round2(0.0f + dv[j][2 * r], 0.0f + dv[j][2 * r + 1]);
      x[0][r][2 * j] = inside[r] ? kv.x : 0.0f;
      x[0][r][2 * j + 1] = inside[r] ? kv.y : 0.0f;
      x[1][r][2 * j] = inside[r] ? vv.x : 0.0f;
      x[1][r][2 * j + 1] = inside[r] ? vv.y : 0.0f;
    }
  }
  // Column sums over the warp's 16 rows (lanes 4 g + t), as a reduce-scatter: at each of the three butterfly stages
  // (lane masks 4, 8, 16: g's bits) a lane keeps half of its sums and adds its partner's of that half, so that it ends
  // with 4 of the 32; the same additions, in the same tree, as a full butterfly over each of the 32.
  float v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = (0.0f + x[i / 16][0][i % 16]) + x[i / 16][1][i % 16];
  reduce_scatter_stage<4, 32>(v);
  reduce_scatter_stage<8, 16>(v);
  reduce_scatter_stage<16, 8>(v);
  {
    // v[i] is sum 16 (g & 1) + 8 (g >> 1 & 1) + 4 (g >> 2) + i of the 32: part g & 1, k = that - 16 part.
    const int part = g & 1, k0s = 8 * ((g >> 1) & 1) + 4 * (g >> 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = k0s + i;
      s_cs[warp * 128 + part * 64 + 8 * (k / 2) + 2 * t + k % 2] = v[i];
    }
  }
  if constexpr (!kCodes) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!inside[r]) continue;
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        __nv_bfloat16* row =
            dqkv + (int64_t{b} * T + k0 + 16 * warp + g + 8 * r) * ld + (part + 1) * int64_t{C} + h * kDyTile + 2 * t;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<__nv_bfloat162*>(row + 8 * j) =
              __floats2bfloat162_rn(x[part][r][2 * j], x[part][r][2 * j + 1]);
      }
    }
    sync();
    if (tid < 128) {
      const int c = tid;
      const float sum = s_cs[c] + s_cs[128 + c] + s_cs[256 + c] + s_cs[384 + c];
      atomicAdd(dy.stats.colsum + (c < 64 ? C : 2 * C - 64) + h * kDyTile + c, sum);
    }
    return;
  }
  ThreadStats st;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = 16 * warp + g + 8 * r;
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      float x0[8], x1[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        x0[k] = x[part][r][k];
        x1[k] = x[part][r][8 + k];
      }
      const uint2 lo = convert8<kDyFormat>(x0, s, st), hi = convert8<kDyFormat>(x1, s, st);
      if (inside[r] && dy.codes) {
        uint8_t* row =
            dy.codes + (int64_t{b} * T + k0 + local) * ld + (part + 1) * int64_t{C} + h * kDyTile + 2 * t;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<uint16_t*>(row + 8 * j) =
              static_cast<uint16_t>(code_at(lo, hi, 2 * j) | (code_at(lo, hi, 2 * j + 1) << 8));
      }
#pragma unroll
      for (int k = 0; k < 16; ++k)  // channel 8 (k / 2) + 2 t + k % 2, row `local`
        smem[part * kTileT + (8 * (k / 2) + 2 * t + k % 2) * kDyTile + local] = code_at(lo, hi, k);
    }
  }
  flush_warp_stats(st, dy.stats);
  sync();
  const int n_rows = min(kDyTile, T - k0);
  if (dy.codes_t) {
    store_codes_t<128>(smem, dy.codes_t, C + h * kDyTile, int64_t{b} * T + k0, n_rows, M, tid);
    store_codes_t<128>(smem + kTileT, dy.codes_t, 2 * int64_t{C} + h * kDyTile, int64_t{b} * T + k0, n_rows, M, tid);
  }
  if (dy.stats.colsum && tid < 128) {
    const int c = tid;
    const float sum = s_cs[c] + s_cs[128 + c] + s_cs[256 + c] + s_cs[384 + c];
    atomicAdd(dy.stats.colsum + (c < 64 ? C : 2 * C - 64) + h * kDyTile + c, sum);
  }
}

}  // namespace
}  // namespace fp8t::kernels
