// The main pass of the attention backward at head size 64 on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a),
// templated on blocks per SM, the dQ path and where dK, dV go (dqkv, or the qkv linear's dy codes). The product until
// the thirty-fifth session (three blocks per SM, tiled dQ, joint order); now the lab's
// (kernels/lab/attention_wgmma_backward_variants.cu), beside the product's 128-key kernel
// (kernels/attention_wgmma_backward128_kernel.cuh).
// One block = one warpgroup (4 warps) per (64 keys, b*h), over query blocks of 64 from the diagonal on; the
// block order is that of the mma.sync kernel (kernels/attention_common.cuh). Per query block:
//   S^T = K Q^T and dP^T = V dO^T        (64 keys x 64 queries; A and B from shared memory)
//   P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta)   in registers (the accumulator layout)
//   dV += P^T dO, dK += dS^T Q           (A from registers, B = dO, Q read transposed from shared memory)
//   dQ = dS K                            (dS^T through shared memory, read transposed) -> dq_accum
// Tiles as in kernels/attention_wgmma_common.cuh; Q and dO double-buffered; desc_x: the wgmma descriptor of sX.
#pragma once
#include "core/launch_limits.h"
#include "kernels/attention_backward_passes.cuh"
#include "kernels/attention_dy_codes.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/attention_wgmma_common.cuh"
#include "kernels/device_facts.cuh"

namespace fp8t::kernels {
namespace {

// How a query step orders its MMAs and arithmetic within the warpgroup:
//   joint:        S^T and dP^T in one group; P^T and dS^T made together once both are done
//   p_during_dp:  S^T's group first; P^T (f32) made while dP^T runs, then dS^T (more spills: 1% slower)
//   dv_during_ds: as p_during_dp, then dV += P^T dO issued before dS^T is made, from P^T rounded to bf16 (the
//                 f32 P^T would not fit the register budget beside dV's MMAs in flight: ptxas serialized them)
enum class StepOrder : uint8_t { joint, p_during_dp, dv_during_ds };
inline constexpr StepOrder kProductOrder = StepOrder::joint;  // the fastest exact one at 64 keys (docs/perf-notes.md)

// sK, sV, 2 x sQ, 2 x sdO, sdS^T, then 2 x lse and 2 x delta (f32); +1024 to align the tiles to 1024 bytes;
// with the tiled dQ layout, a 64 x 64 f32 dQ tile after them.
constexpr int kSmemBytes = 7 * kTileBytes + 4 * kRows * 4 + 1024, kDqTileBytes = 64 * 64 * 4;
constexpr int smem_bytes(DqLayout layout) { return kSmemBytes + (layout == DqLayout::tiles ? kDqTileBytes : 0); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// kMinBlocks: the blocks per SM that __launch_bounds__ fits registers to. kLayout: how dQ leaves, by f32 atomics
// into rows, or through the dQ tile in shared memory, added by one bulk asynchronous reduction
// (cp.reduce.async.bulk) into dq_accum's 64 x 64 tile of (b*h, query block). kCodes: qkv is read from E4M3 codes
// with a scale per row (AttentionQkv), dequantized into the same tiles as they load (through registers).
template <int kMinBlocks, DqLayout kLayout, bool kCodes, StepOrder kOrder, bool kDy>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_backward_wgmma_kernel(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout,
                                    AttentionQkv qkv, const float* lse, int BH, int T, int NH, int group, float scale,
                                    bool accumulate, AttentionDyCodes dy) {
  constexpr bool kTiles = kLayout == DqLayout::tiles;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sK = smem;
  unsigned char* sV = sK + kTileBytes;
  unsigned char* sQ = sV + kTileBytes;     // 2 stages
  unsigned char* sdO = sQ + 2 * kTileBytes;  // 2 stages
  unsigned char* sdSt = sdO + 2 * kTileBytes;
  float* sLse = reinterpret_cast<float*>(sdSt + kTileBytes);  // 2 x 64, lse * log2(e)
  float* sDelta = sLse + 2 * kRows;                             // 2 x 64
  float* sdQ = sDelta + 2 * kRows;                              // (tiles) 64 x 64, fragment order

  const BackwardBlock<kKeys, kHs> blk(BH, T, NH, group);  // blk.key_lo: this warp's first key (accumulator rows)
  const int64_t head0 = int64_t{blk.b} * T * blk.ld + blk.h * kHs;  // this head's first q element
  const bf16* q_base = kCodes ? nullptr : qkv.bf16 + head0;
  const uint8_t* qc_base = kCodes ? qkv.e4m3 + head0 : nullptr;
  const float* row_sinv = kCodes ? qkv.row_scale_inv + int64_t{blk.b} * T : nullptr;
  const bf16* do_base = dout + int64_t{blk.b} * T * blk.C + blk.h * kHs;
  const float* lse_bh = lse + int64_t{blk.bh} * T;
  const float* delta_bh = delta + int64_t{blk.bh} * T;
  const int n_qb = ceil_div(T, kRows);
  const float sl2 = scale * kLog2e;

  // Q (kCodes: by the caller, through next_q) and dO of query rows q0.. into stage st.
  CodesTile<> next_q;  // kCodes
  auto load_rows = [&](int q0, int st) {
    if constexpr (!kCodes) load_tile_sw128(sQ + st * kTileBytes, q_base, blk.ld, q0, T);
    load_tile_sw128(sdO + st * kTileBytes, do_base, blk.C, q0, T);
    cp_async_commit();
  };
  if constexpr (kCodes) {  // every first load in flight before the first store
    CodesTile<> k_codes, v_codes;
    k_codes.fetch(qc_base + blk.C, row_sinv, blk.ld, blk.k0, T);
    v_codes.fetch(qc_base + 2 * blk.C, row_sinv, blk.ld, blk.k0, T);
    next_q.fetch(qc_base, row_sinv, blk.ld, blk.kb * kRows, T);
    k_codes.stage(sK);
    v_codes.stage(sV);
    next_q.stage(sQ);
  } else {
    load_tile_sw128(sK, q_base + blk.C, blk.ld, blk.k0, T);
    load_tile_sw128(sV, q_base + 2 * blk.C, blk.ld, blk.k0, T);
  }
  load_rows(blk.kb * kRows, 0);
  if (threadIdx.x < kRows) {  // query rows past T: lse = inf, hence P = 0
    const int qi = blk.kb * kRows + threadIdx.x;
    sLse[threadIdx.x] = qi < T ? lse_bh[qi] * kLog2e : INFINITY;
    sDelta[threadIdx.x] = qi < T ? delta_bh[qi] : 0.0f;
  }

  float dk[8][4] = {}, dv[8][4] = {};
  const uint64_t desc_k = sw128_desc(sK), desc_v = sw128_desc(sV), desc_dst = sw128_desc(sdSt);

  for (int qb = blk.kb; qb < n_qb; ++qb) {
    const int st = (qb - blk.kb) & 1, q0 = qb * kRows;
    cp_async_wait<0>();    // the only group in flight is stage st (with sK, sV on the first step)
    fence_async_shared();  // this thread's cp.async writes (and kCodes stores), visible to the async proxy (wgmma)
    // Stage st is complete, and every warp's MMAs of step qb - 1 are done: stage st ^ 1 and sdSt are free.
    __syncthreads();
    float next_lse = INFINITY, next_delta = 0.0f;
    if (qb + 1 < n_qb) {
      load_rows(q0 + kRows, st ^ 1);
      if constexpr (kCodes) {
        next_q.fetch(qc_base, row_sinv, blk.ld, q0 + kRows, T);
        next_q.stage(sQ + (st ^ 1) * kTileBytes);
      }
      const int qi = q0 + kRows + threadIdx.x;
      if (threadIdx.x < kRows && qi < T) {
        next_lse = lse_bh[qi] * kLog2e;
        next_delta = delta_bh[qi];
      }
    }
    const uint64_t desc_q = sw128_desc(sQ + st * kTileBytes), desc_do = sw128_desc(sdO + st * kTileBytes);

    // S^T = K Q^T and dP^T = V dO^T: (64 keys, 64 queries), K = the 64 channels; in one group (joint) or S^T's
    // group first.
    float s[8][4], dp[8][4];
    uint32_t pa[4][4], dsa[4][4];  // P^T, dS^T as A fragments (k = queries)
    const float* lse2 = sLse + st * kRows;
    const float* delta_q = sDelta + st * kRows;
    const bool diagonal = qb == blk.kb;  // masked on this step only (queries precede keys; every key past T)
    // dS^T row = key (warp * 16 + g, + 8), columns 8 j + 2 t: chunk j of the row, swizzled, into sdSt for dQ.
    auto store_ds = [&](int j, uint32_t lo, uint32_t hi) {
      const int r0 = blk.warp * 16 + blk.g;
      *reinterpret_cast<uint32_t*>(sdSt + r0 * 128 + ((j ^ (r0 & 7)) << 4) + 4 * blk.t) = lo;
      *reinterpret_cast<uint32_t*>(sdSt + (r0 + 8) * 128 + ((j ^ ((r0 + 8) & 7)) << 4) + 4 * blk.t) = hi;
    };
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHs / 16; ++kk) {
      wgmma_ss<0, 0>(s, desc_k + kk * kKStep, desc_q + kk * kKStep, kk > 0);
      if constexpr (kOrder == StepOrder::joint) wgmma_ss<0, 0>(dp, desc_v + kk * kKStep, desc_do + kk * kKStep, kk > 0);
    }
    if constexpr (kOrder != StepOrder::joint) {
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss<0, 0>(dp, desc_v + kk * kKStep, desc_do + kk * kKStep, kk > 0);
    }
    wgmma_commit();

    if constexpr (kOrder == StepOrder::joint) {
      wgmma_wait<0>();
      wgmma_settle(s);
      wgmma_settle(dp);
      backward_p_ds(s, dp, lse2, delta_q, sl2, diagonal, q0, blk.key_lo, blk.g, blk.t, pa, dsa, store_ds);
    } else if constexpr (kOrder == StepOrder::p_during_dp) {
      wgmma_wait<1>();
      wgmma_settle(s);
      backward_p(s, lse2, sl2, diagonal, q0, blk.key_lo, blk.g, blk.t, pa);  // P in s (f32) and pa
      wgmma_wait<0>();
      wgmma_settle(dp);
      backward_ds(s, dp, delta_q, blk.t, dsa, store_ds);
    } else {  // dv_during_ds: P in pa only (bf16); dV's MMAs issued before dS is made from that P
      wgmma_wait<1>();
      wgmma_settle(s);
      backward_p(s, lse2, sl2, diagonal, q0, blk.key_lo, blk.g, blk.t, pa);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_settle(pa[kk]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk) wgmma_rs<1>(dv, pa[kk], desc_do + kk * kMnStep);
      wgmma_commit();
      wgmma_wait<1>();
      wgmma_settle(dp);
      backward_ds_bf16p(pa, dp, delta_q, blk.t, dsa, store_ds);
    }
    // dV += P^T dO (unless issued above), dK += dS^T Q (K = queries; dO and Q are (queries, channels): MN-major B).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_settle(pa[kk]);
      wgmma_settle(dsa[kk]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      if constexpr (kOrder != StepOrder::dv_during_ds) wgmma_rs<1>(dv, pa[kk], desc_do + kk * kMnStep);
      wgmma_rs<1>(dk, dsa[kk], desc_q + kk * kMnStep);
    }
    wgmma_commit();

    // dQ (64 queries, 64 channels) = dS K: A = dS (queries, keys) read from dS^T (MN-major), B = K (keys,
    // channels): MN-major.
    fence_async_shared();  // this thread's dS^T stores, visible to wgmma
    __syncthreads();       // every warp's dS^T rows are in place
    float dqa[8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_ss<1, 1>(dqa, desc_dst + kk * kMnStep, desc_k + kk * kMnStep, kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_settle(dqa);
    wgmma_settle(dv);
    wgmma_settle(dk);

    if constexpr (kTiles) {
      // Each warp's 16 rows one 4 KB quarter of the tile, added by the warp's own bulk reduction: no block barrier.
      // Query rows past T hold dS = 0, hence zeros.
      reduce_dq_quarter(dqa, sdQ + blk.warp * 1024, blk.lane,
                        [&] { return dq_accum + (int64_t{blk.bh} * n_qb + qb) * 4096 + blk.warp * 1024; });
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = q0 + blk.warp * 16 + blk.g + 8 * r;
        if (qi >= T) continue;
        float* dst = dq_accum + (int64_t{blk.b} * T + qi) * blk.C + blk.h * kHs + 2 * blk.t;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          atomicAdd(reinterpret_cast<float2*>(dst + 8 * j), make_float2(dqa[j][2 * r], dqa[j][2 * r + 1]));
      }
    }
    if (threadIdx.x < kRows) {  // stage st ^ 1 was last read in step qb - 1, before this step's first barrier
      sLse[(st ^ 1) * kRows + threadIdx.x] = next_lse;
      sDelta[(st ^ 1) * kRows + threadIdx.x] = next_delta;
    }
  }

  if (kTiles && blk.lane == 0) bulk_wait_all();  // shared memory must outlive each warp's last reduction's read
  if constexpr (kDy) {  // dK and dV as the qkv linear's dy codes (kernels/attention_dy_codes.cuh), not into dqkv
    __syncthreads();    // every warp is past its last MMAs' wait: the two Q stages hold the codes' tiles
    write_dkv_codes(dk, dv, scale, dy, sQ, blk.b, blk.h, blk.k0, T, blk.C, int64_t{BH / NH} * T, blk.warp, blk.g,
                    blk.t);
  } else {
    add_dkv(dqkv, dk, dv, scale, accumulate, blk, T);  // dK (scaled) and dV into dqkv
  }
}

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

template <int kMinBlocks, DqLayout kLayout, bool kCodes, StepOrder kOrder, bool kDy>
__global__ void attention_backward_wgmma_kernel(bf16*, float*, const float*, const bf16*, AttentionQkv, const float*,
                                                int, int, int, int, float, bool, AttentionDyCodes) {
  __trap();
}

#endif

// kDy: dK and dV go to dy's codes (AttentionDyCodes), not into dqkv.
template <int kMinBlocks, DqLayout kLayout, bool kCodes = false, StepOrder kOrder = kProductOrder, bool kDy = false>
void launch_backward_wgmma(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const AttentionQkv& qkv,
                           const float* lse, int B, int T, int NH, float scale, cudaStream_t stream,
                           bool accumulate = true, const AttentionDyCodes& dy = {}) {
  FP8T_CHECK((qkv.e4m3 != nullptr) == kCodes, "launch_backward_wgmma: qkv's form does not match the kernel");
  FP8T_CHECK(!kDy || (dy.scale != nullptr && !accumulate),
             "launch_backward_wgmma: dy codes need a scale, and accumulate false");
  auto* kernel = attention_backward_wgmma_kernel<kMinBlocks, kLayout, kCodes, kOrder, kDy>;
  static PerDevice<int> resident;  // blocks resident at once per device (the shared memory limit is set on each)
  const int slots = resident.get([kernel] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(kLayout)));
    return resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, smem_bytes(kLayout));
  });
  const int BH = B * NH, n_kb = ceil_div(T, kKeys);
  kernel<<<BH * n_kb, kThreads, smem_bytes(kLayout), stream>>>(dqkv, dq_accum, delta, dout, qkv, lse, BH, T, NH,
                                                              backward_group(BH, n_kb, T, kHs, slots), scale,
                                                              accumulate, dy);
  CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fp8t::kernels
