// Causal flash attention (FlashAttention-2 schedule) on tensor cores through mma.sync m16n8k16 (bf16 in, f32
// accumulate). Scores, probabilities and accumulators stay in registers; tiles arrive in shared memory by
// cp.async (double-buffered) and reach the tensor cores through ldmatrix.
// Forward: one block of 8 warps per (128 queries, b*h), heaviest query blocks first; each warp owns 16 query
// rows and runs the online softmax over key tiles of 64 up to the diagonal.
// Backward: delta = rowsum(dO * O) (the same pass zeroes the dQ scratch); one block per (key block, b*h), each
// warp owning 16 keys and their dK, dV in registers over query blocks diagonal..end; on deep grids, blocks of
// the same heads run together so that their Q, dO and dQ rows stay in L2; dQ goes to an f32 scratch through
// atomics and a last pass adds scale * dQ into dqkv.
// Head size 64 on a Hopper (sm_90a build) runs the warpgroup-MMA forward and backward main pass of
// kernels/attention_wgmma.cu instead; the delta and dQ passes here serve both.
#include "core/launch_limits.h"
#include "kernels/attention.cuh"
#include "kernels/attention_common.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

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

template <int HS>
constexpr int forward_smem_bytes() {
  return (kFwdRows + 4 * kFwdKeys) * (HS + kPad) * 2;  // sQ, 2 x sK, 2 x sV
}

// HS 64: two blocks per SM (128 registers, a few words spilled outside the MMAs) measured 206 TFLOP/s
// against 161 with one block and no spills (H200, B=32 NH=12 T=1024); the same holds for the backward.
template <int HS>
__global__ void __launch_bounds__(kFwdThreads, HS == 64 ? 2 : 1)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale) {
  constexpr int kLd = HS + kPad;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // (128, HS)
  bf16* sK = sQ + kFwdRows * kLd;            // 2 x (64, HS)
  bf16* sV = sK + 2 * kFwdKeys * kLd;        // 2 x (64, HS)

  const int C = NH * HS;
  const int64_t ld = 3 * int64_t{C};
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kFwdRows;  // longest rows first
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int row_lo = q0 + warp * 16;  // this warp's first query
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * HS;
  const int n_kt = ceil_div(std::min(q0 + kFwdRows, T), kFwdKeys);
  const float sl2 = scale * kLog2e;

  load_tile<kFwdRows, HS, kFwdThreads>(sQ, q_base, ld, q0, T);
  load_tile<kFwdKeys, HS, kFwdThreads>(sK, q_base + C, ld, 0, T);
  load_tile<kFwdKeys, HS, kFwdThreads>(sV, q_base + 2 * C, ld, 0, T);
  cp_async_commit();

  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[HS / 16][4];  // this warp's (16, HS) queries as A fragments
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) ldmatrix_x4(qf[kk], frag_rows16(sQ + warp * 16 * kLd + kk * 16, kLd, lane));
  float o[HS / 8][4] = {};  // (16, HS) output accumulator
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8: raw max, partial sum

  for (int kt = 0; kt < n_kt; ++kt) {
    const int st = kt & 1, k0 = kt * kFwdKeys;
    if (kt + 1 < n_kt) {  // the other stage was released by the barrier that ended the previous step
      load_tile<kFwdKeys, HS, kFwdThreads>(sK + (st ^ 1) * kFwdKeys * kLd, q_base + C, ld, k0 + kFwdKeys, T);
      load_tile<kFwdKeys, HS, kFwdThreads>(sV + (st ^ 1) * kFwdKeys * kLd, q_base + 2 * C, ld, k0 + kFwdKeys, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (k0 <= row_lo + 15) {  // else every key of the tile is after every query of this warp
      const bf16* sKt = sK + st * kFwdKeys * kLd;
      const bf16* sVt = sV + st * kFwdKeys * kLd;
      float s[kFwdKeys / 8][4] = {};  // (16, 64) raw scores
#pragma unroll
      for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
        for (int jp = 0; jp < kFwdKeys / 16; ++jp) {
          uint32_t kb[4];
          ldmatrix_x4(kb, frag_cols16(sKt + jp * 16 * kLd + kk * 16, kLd, lane));
          mma(s[2 * jp], qf[kk], kb[0], kb[1]);
          mma(s[2 * jp + 1], qf[kk], kb[2], kb[3]);
        }
      }
      if (k0 + kFwdKeys - 1 > row_lo) mask_causal(s, k0, row_lo, g, t);  // the diagonal crosses this warp's rows
      uint32_t pf[kFwdKeys / 16][4];  // P (16, 64) bf16 as A fragments
      online_softmax_step(s, sl2, m, l, o, pf);
#pragma unroll
      for (int kk = 0; kk < kFwdKeys / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < HS / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, frag_rows16(sVt + kk * 16 * kLd + dp * 16, kLd, lane));
          mma(o[2 * dp], pf[kk], vb[0], vb[1]);
          mma(o[2 * dp + 1], pf[kk], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with stage st before the next step refills it
  }

  store_rows(o, l, m, sl2, out + int64_t{b} * T * C + h * HS, C, lse + int64_t{bh} * T, row_lo, T, g, t);
}

// delta (B, NH, T) = rowsum(dO * O) per head, and dq_accum (B, T, C) = 0 for the backward's atomics.
// One thread per 8 channels (16-byte loads); HS / 8 adjacent lanes hold one head of one row.
template <int HS>
__global__ void attention_delta_kernel(float* delta, float* dq_accum, const bf16* dout, const bf16* out,
                                       int64_t n_chunks, int T, int NH) {
  constexpr int kLanes = HS / 8;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  float acc = 0.0f;
  if (i < n_chunks) {
    const auto a = Vec16<bf16>::load(dout + 8 * i), o = Vec16<bf16>::load(out + 8 * i);
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a.v[k]));
      const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o.v[k]));
      acc += x.x * y.x + x.y * y.y;
    }
    if (dq_accum) {  // null: the caller zeroes it (the tiled layout is longer)
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      reinterpret_cast<float4*>(dq_accum + 8 * i)[0] = zero;
      reinterpret_cast<float4*>(dq_accum + 8 * i)[1] = zero;
    }
  }
  // Every lane shuffles (lanes past the end add zeros); the groups of kLanes never straddle two heads.
#pragma unroll
  for (int m = kLanes / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (i < n_chunks && i % kLanes == 0) {
    const int64_t row_chunks = int64_t{NH} * kLanes, bt = i / row_chunks, b = bt / T, t = bt % T;
    const int h = static_cast<int>(i % row_chunks) / kLanes;
    delta[(b * NH + h) * T + t] = acc;
  }
}

// Backward tiling per head size. kKeys: keys per block, 16 per warp, whose dK and dV stay in registers for the
// whole block; kRows: query rows per step; kMinBlocks: blocks per SM that __launch_bounds__ fits registers to.
template <int HS>
struct BwdTile;
// HS 64: three blocks of 4 warps per SM (168 registers) measured 117 TFLOP/s against 108 with two blocks and no
// spills. Still to measure: kKeys 128, kMinBlocks 1 (8 warps, 210 registers, half the dQ atomics).
template <>
struct BwdTile<64> {
  static constexpr int kKeys = 64, kRows = 64, kMinBlocks = 3;
};
// HS 128: 32 rows keep dK, dV (128 registers) and the scores within 255; 8 warps of 255 registers fill the
// register file with one block (4 warps of 64 keys left half of it unused).
template <>
struct BwdTile<128> {
  static constexpr int kKeys = 128, kRows = 32, kMinBlocks = 1;
};

template <int HS>
constexpr int backward_smem_bytes() {
  constexpr int KEYS = BwdTile<HS>::kKeys, BR = BwdTile<HS>::kRows;
  // sK, sV, 2 x sQ, 2 x sdO, sdS^T, 2 x lse, 2 x delta
  return (2 * KEYS + 4 * BR) * (HS + kPad) * 2 + KEYS * (BR + kPad) * 2 + 4 * BR * 4;
}

template <int HS>
__global__ void __launch_bounds__(2 * BwdTile<HS>::kKeys, BwdTile<HS>::kMinBlocks)
    attention_backward_kernel(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const bf16* qkv,
                              const float* lse, int BH, int T, int NH, int group, float scale) {
  constexpr int KEYS = BwdTile<HS>::kKeys, BR = BwdTile<HS>::kRows, kThreads = 2 * KEYS, kWarps = KEYS / 16;
  constexpr int kLd = HS + kPad, kLdS = BR + kPad;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);  // (KEYS, HS)
  bf16* sV = sK + KEYS * kLd;                // (KEYS, HS)
  bf16* sQ = sV + KEYS * kLd;                // 2 x (BR queries, HS)
  bf16* sdO = sQ + 2 * BR * kLd;             // 2 x (BR queries, HS)
  bf16* sdSt = sdO + 2 * BR * kLd;           // (KEYS, BR queries) dS^T
  float* sLse = reinterpret_cast<float*>(sdSt + KEYS * kLdS);  // 2 x (BR) lse * log2(e)
  float* sDelta = sLse + 2 * BR;                               // 2 x (BR)

  const int n_kb = ceil_div(T, KEYS);
  int bh, kb;
  backward_block(static_cast<int>(blockIdx.x), BH, n_kb, group, bh, kb);
  const int b = bh / NH, h = bh % NH, k0 = kb * KEYS;
  const int C = NH * HS;
  const int64_t ld = 3 * int64_t{C};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int key_lo = k0 + warp * 16;  // this warp's first key
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * HS;
  const bf16* do_base = dout + int64_t{b} * T * C + h * HS;
  const float* lse_bh = lse + int64_t{bh} * T;
  const float* delta_bh = delta + int64_t{bh} * T;
  const int qb_first = k0 / BR, n_qb = ceil_div(T, BR);
  const float sl2 = scale * kLog2e;

  // Query rows past T get lse = inf, hence P = 0 and no contribution.
  auto load_rows = [&](int q0, int st) {
    load_tile<BR, HS, kThreads>(sQ + st * BR * kLd, q_base, ld, q0, T);
    load_tile<BR, HS, kThreads>(sdO + st * BR * kLd, do_base, C, q0, T);
    cp_async_commit();
  };
  load_tile<KEYS, HS, kThreads>(sK, q_base + C, ld, k0, T);
  load_tile<KEYS, HS, kThreads>(sV, q_base + 2 * C, ld, k0, T);
  load_rows(qb_first * BR, 0);
  if (threadIdx.x < BR) {
    const int qi = qb_first * BR + threadIdx.x;
    sLse[threadIdx.x] = qi < T ? lse_bh[qi] * kLog2e : INFINITY;
    sDelta[threadIdx.x] = qi < T ? delta_bh[qi] : 0.0f;
  }

  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};  // this warp's (16 keys, HS)
  // dQ (BR, HS) of a step split over the warps: kRowTiles row tiles of 16 times HS / kCols column slices.
  constexpr int kRowTiles = BR / 16, kCols = HS * kRowTiles / kWarps;
  static_assert(kWarps % kRowTiles == 0 && kCols % 16 == 0, "dQ tiles must divide evenly over the warps");
  const int dq_row = (warp % kRowTiles) * 16, dq_col = (warp / kRowTiles) * kCols;

  for (int qb = qb_first; qb < n_qb; ++qb) {
    const int st = (qb - qb_first) & 1, q0 = qb * BR;
    cp_async_wait<0>();  // the only group in flight is stage st (with sK, sV on the first step)
    // Stage st is visible to every thread, and every warp has left step qb - 1: stage st ^ 1 of sQ, sdO, sLse,
    // sDelta and sdSt are free to overwrite.
    __syncthreads();
    float next_lse = INFINITY, next_delta = 0.0f;  // kept in registers, stored at the end of the step
    if (qb + 1 < n_qb) {
      load_rows(q0 + BR, st ^ 1);
      const int qi = q0 + BR + threadIdx.x;
      if (threadIdx.x < BR && qi < T) {
        next_lse = lse_bh[qi] * kLog2e;
        next_delta = delta_bh[qi];
      }
    }
    const bf16* sQt = sQ + st * BR * kLd;
    const bf16* sdOt = sdO + st * BR * kLd;

    // 16-query chunks whose every query precedes every key of this warp are masked whole (P = dS = 0): their
    // MMAs are skipped, and the mask below zeroes their P. Warp-uniform; only on the diagonal steps.
    auto live = [&](int chunk) { return q0 + 16 * chunk + 15 >= key_lo; };

    // S^T = K Q^T and dP^T = V dO^T, (16 keys, BR queries) for this warp.
    float s[BR / 8][4] = {}, dp[BR / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldmatrix_x4(ka, frag_rows16(sK + warp * 16 * kLd + kk * 16, kLd, lane));
      ldmatrix_x4(va, frag_rows16(sV + warp * 16 * kLd + kk * 16, kLd, lane));
#pragma unroll
      for (int jp = 0; jp < BR / 16; ++jp) {
        if (!live(jp)) continue;
        uint32_t qb4[4], ob4[4];
        ldmatrix_x4(qb4, frag_cols16(sQt + jp * 16 * kLd + kk * 16, kLd, lane));
        ldmatrix_x4(ob4, frag_cols16(sdOt + jp * 16 * kLd + kk * 16, kLd, lane));
        mma(s[2 * jp], ka, qb4[0], qb4[1]);
        mma(s[2 * jp + 1], ka, qb4[2], qb4[3]);
        mma(dp[2 * jp], va, ob4[0], ob4[1]);
        mma(dp[2 * jp + 1], va, ob4[2], ob4[3]);
      }
    }
    // P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta); both as A fragments, dS^T also to shared.
    // The mask is needed iff the step's first query precedes the warp's last key.
    const bool diagonal = q0 < key_lo + 15;
    uint32_t pa[BR / 16][4], dsa[BR / 16][4];
    backward_p_ds(s, dp, sLse + st * BR, sDelta + st * BR, sl2, diagonal, q0, key_lo, g, t, pa, dsa,
                  [&](int j, uint32_t lo, uint32_t hi) {
                    bf16* row = sdSt + (warp * 16 + g) * kLdS + 8 * j + 2 * t;
                    *reinterpret_cast<uint32_t*>(row) = lo;
                    *reinterpret_cast<uint32_t*>(row + 8 * kLdS) = hi;
                  });
    // dV += P^T dO, dK += dS^T Q (dK unscaled until the end).
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      if (!live(kk)) continue;
#pragma unroll
      for (int dp16 = 0; dp16 < HS / 16; ++dp16) {
        uint32_t ob4[4], qb4[4];
        ldmatrix_x4_trans(ob4, frag_rows16(sdOt + kk * 16 * kLd + dp16 * 16, kLd, lane));
        ldmatrix_x4_trans(qb4, frag_rows16(sQt + kk * 16 * kLd + dp16 * 16, kLd, lane));
        mma(dv[2 * dp16], pa[kk], ob4[0], ob4[1]);
        mma(dv[2 * dp16 + 1], pa[kk], ob4[2], ob4[3]);
        mma(dk[2 * dp16], dsa[kk], qb4[0], qb4[1]);
        mma(dk[2 * dp16 + 1], dsa[kk], qb4[2], qb4[3]);
      }
    }
    __syncthreads();  // sdSt is complete
    // dQ (BR, HS) partial = dS K over this block's keys; this warp's 16 rows x kCols columns.
    float dqa[kCols / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
      uint32_t da[4];
      ldmatrix_x4_trans(da, frag_cols16(sdSt + kk * 16 * kLdS + dq_row, kLdS, lane));
#pragma unroll
      for (int dp16 = 0; dp16 < kCols / 16; ++dp16) {
        uint32_t kb4[4];
        ldmatrix_x4_trans(kb4, frag_rows16(sK + kk * 16 * kLd + dq_col + dp16 * 16, kLd, lane));
        mma(dqa[2 * dp16], da, kb4[0], kb4[1]);
        mma(dqa[2 * dp16 + 1], da, kb4[2], kb4[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qi = q0 + dq_row + g + 8 * r;
      if (qi >= T) continue;
      float* dst = dq_accum + (int64_t{b} * T + qi) * C + h * HS + dq_col + 2 * t;
#pragma unroll
      for (int d = 0; d < kCols / 8; ++d) {
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(dst + 8 * d), make_float2(dqa[d][2 * r], dqa[d][2 * r + 1]));
#else  // vector atomics arrive with sm_90; Ampere adds the pair one by one
        atomicAdd(dst + 8 * d, dqa[d][2 * r]);
        atomicAdd(dst + 8 * d + 1, dqa[d][2 * r + 1]);
#endif
      }
    }
    if (threadIdx.x < BR) {  // stage st ^ 1 was last read in step qb - 1, before this step's first barrier
      sLse[(st ^ 1) * BR + threadIdx.x] = next_lse;
      sDelta[(st ^ 1) * BR + threadIdx.x] = next_delta;
    }
  }

  // dK (scaled) and dV added into dqkv.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int ki = key_lo + g + 8 * r;
    if (ki >= T) continue;
    bf16* dk_dst = dqkv + (int64_t{b} * T + ki) * ld + C + h * HS + 2 * t;
    bf16* dv_dst = dk_dst + C;
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      auto* pk = reinterpret_cast<__nv_bfloat162*>(dk_dst + 8 * d);
      auto* pv = reinterpret_cast<__nv_bfloat162*>(dv_dst + 8 * d);
      const float2 ok = __bfloat1622float2(*pk), ov = __bfloat1622float2(*pv);
      *pk = __floats2bfloat162_rn(ok.x + scale * dk[d][2 * r], ok.y + scale * dk[d][2 * r + 1]);
      *pv = __floats2bfloat162_rn(ov.x + dv[d][2 * r], ov.y + dv[d][2 * r + 1]);
    }
  }
}

// dqkv[:, :, q part] += scale * dq_accum; one thread per 8 channels of (B, T, C) (16-byte accesses). kTiled:
// dq_accum in the wgmma backward's tiles (kernels/attention_wgmma.cuh): head size 64, tile (b * NH + h, t / 64),
// and in it row 16 w + g + 8 r, columns 8 j .. 8 j + 7 at ((w * 8 + j) * 2 + r) * 64 + 8 g.
template <bool kTiled>
__global__ void attention_dq_kernel(bf16* dqkv, const float* dq_accum, int64_t n_chunks, int C, int T, float scale) {
  const int row_chunks = C / 8;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_chunks;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / row_chunks;
    bf16* d = dqkv + bt * 3 * C + (i % row_chunks) * 8;
    const float* src = dq_accum + 8 * i;
    if constexpr (kTiled) {
      const int c8 = static_cast<int>(i % row_chunks), h = c8 / 8, j = c8 % 8, NH = C / 64;
      const int64_t b = bt / T;
      const int t = static_cast<int>(bt % T), row = t % 64, w = row / 16, g = row % 8, r = (row / 8) % 2;
      src = dq_accum + ((b * NH + h) * ceil_div(T, 64) + t / 64) * 4096 + ((w * 8 + j) * 2 + r) * 64 + 8 * g;
    }
    const float4 a0 = reinterpret_cast<const float4*>(src)[0];
    const float4 a1 = reinterpret_cast<const float4*>(src)[1];
    const float acc[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    auto v = Vec16<bf16>::load(d);
#pragma unroll
    for (int k = 0; k < 8; ++k) v.v[k] = __float2bfloat16_rn(__bfloat162float(v.v[k]) + scale * acc[k]);
    v.store(d);
  }
}

// ------------------------------------------------------------------------------------------------
// kernel launchers

void check_sizes(const char* what, const void* qkv, int B, int T, int NH, int HS) {
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "{}: bad sizes B={} T={} NH={}", what, B, T, NH);
  FP8T_CHECK(HS == 64 || HS == 128, "{}: head size {} not supported (64 or 128)", what, HS);
  FP8T_CHECK(aligned16(qkv), "{}: qkv must be 16-byte aligned", what);
  FP8T_CHECK(int64_t{B} * NH <= 0x7fffffff && ceil_div(T, kFwdRows) <= 65535, "{}: grid too large (B={} NH={} T={})", what, B,
             NH, T);
  // The kernels take C = NH * HS and offsets up to 3 C within a row as int.
  checked_int(3 * int64_t{NH} * HS, what, "the qkv row length 3 * NH * HS");
}

// Whether head size HS runs the warpgroup-MMA kernels (kernels/attention_wgmma.cuh).
bool use_wgmma(int HS, const AttentionKernels& k) { return HS == 64 && k.wgmma && attention_wgmma_available(); }

template <int HS>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
  constexpr int bytes = forward_smem_bytes<HS>();
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(B * NH, ceil_div(T, kFwdRows));
  attention_forward_kernel<HS><<<grid, kFwdThreads, bytes, stream>>>(out, lse, qkv, T, NH, 1.0f / sqrtf(float(HS)));
  CUDA_CHECK_LAUNCH();
}

template <int HS>
void launch_backward(bf16* dqkv, float* dq_accum, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                     const float* lse, int B, int T, int NH, cudaStream_t stream, const AttentionKernels& k) {
  constexpr int KEYS = BwdTile<HS>::kKeys, kThreads = 2 * KEYS, bytes = backward_smem_bytes<HS>();
  static const int slots = [] {  // blocks resident at once on the device
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_backward_kernel<HS>, kThreads, bytes));
    return sms * std::max(per_sm, 1);
  }();
  const int64_t BT = int64_t{B} * T, C = int64_t{NH} * HS, n_chunks = BT * C / 8;
  const float scale = 1.0f / sqrtf(float(HS));
  const unsigned delta_blocks = checked_grid(ceil_div64(n_chunks, 256), kMaxGridX, "attention_backward",
                                             "B*T*C / 8 chunks of dout (256 per block)");
  const bool wgmma = use_wgmma(HS, k);
  const bool tiled = wgmma && attention_backward_wgmma_tiled_dq(k.wgmma_backward_variant);
  if (tiled)
    CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, attention_dq_scratch_floats(B, T, NH, HS) * sizeof(float), stream));
  attention_delta_kernel<HS><<<delta_blocks, 256, 0, stream>>>(delta, tiled ? nullptr : dq_accum, dout, out, n_chunks,
                                                               T, NH);
  CUDA_CHECK_LAUNCH();
  if (wgmma) {
    attention_backward_wgmma64(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, k.wgmma_backward_variant,
                               stream);
  } else {
    const int BH = B * NH, n_kb = ceil_div(T, KEYS);
    attention_backward_kernel<HS><<<BH * n_kb, kThreads, bytes, stream>>>(
        dqkv, dq_accum, delta, dout, qkv, lse, BH, T, NH, backward_group(BH, n_kb, T, HS, slots), scale);
    CUDA_CHECK_LAUNCH();
  }
  const int dq_blocks = static_cast<int>(std::min<int64_t>((n_chunks + 255) / 256, 65536));
  if (tiled)
    attention_dq_kernel<true><<<dq_blocks, 256, 0, stream>>>(dqkv, dq_accum, n_chunks, static_cast<int>(C), T, scale);
  else
    attention_dq_kernel<false><<<dq_blocks, 256, 0, stream>>>(dqkv, dq_accum, n_chunks, static_cast<int>(C), T, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t attention_dq_scratch_floats(int B, int T, int NH, int HS, const AttentionKernels& k) {
  if (use_wgmma(HS, k) && attention_backward_wgmma_tiled_dq(k.wgmma_backward_variant))
    return int64_t{B} * NH * ceil_div(T, 64) * 64 * 64;  // whole 64-query tiles per head
  return int64_t{B} * T * NH * HS;
}

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream,
                       const AttentionKernels& k) {
  check_sizes("attention_forward", qkv, B, T, NH, HS);
  if (use_wgmma(HS, k))
    attention_forward_wgmma64(out, lse, qkv, B, T, NH, 1.0f / sqrtf(64.0f), stream);
  else if (HS == 64)
    launch_forward<64>(out, lse, qkv, B, T, NH, stream);
  else
    launch_forward<128>(out, lse, qkv, B, T, NH, stream);
}

void attention_backward(bf16* dqkv, float* dq_accum, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int NH, int HS, cudaStream_t stream,
                        const AttentionKernels& k) {
  check_sizes("attention_backward", qkv, B, T, NH, HS);
  FP8T_CHECK(aligned16(dout) && aligned16(out), "attention_backward: dout and out must be 16-byte aligned");
  FP8T_CHECK(aligned16(dqkv) && aligned16(dq_accum), "attention_backward: dqkv and dq_accum must be 16-byte aligned");
  FP8T_CHECK(int64_t{B} * NH * ceil_div(T, 64) <= 0x7fffffff, "attention_backward: grid too large (B={} NH={} T={})", B,
             NH, T);
  if (HS == 64)
    launch_backward<64>(dqkv, dq_accum, delta, dout, qkv, out, lse, B, T, NH, stream, k);
  else
    launch_backward<128>(dqkv, dq_accum, delta, dout, qkv, out, lse, B, T, NH, stream, k);
}

}  // namespace fp8t::kernels
