// The attention backward's main pass at head size 64 in FlashAttention-3's tile shape (sm_90a): one block of two
// warpgroups per (128 keys, b*h), warpgroup w owning keys 64 w .. 64 w + 63, over query steps of 128 from the
// diagonal on (the block order of kernels/attention_common.cuh). Per step, each warpgroup:
//   S^T = K_w Q^T, then dP^T = V_w dO^T  (64 keys x 128 queries, m64n128k16; A and B from shared memory)
//   P^T while dP^T's MMAs run, then dS^T (registers; backward_p and backward_ds over 16 column tiles)
//   dV_w += P^T dO                       (k = the 128 queries; A from registers)
//   dS^T into shared memory; after a block barrier, dQ of queries 64 w .. + 63 = dS K over all 128 keys
//   dK_w += dS^T Q, its MMAs running while dQ leaves by bulk reductions
// Against the 64-key kernel (kernels/attention_wgmma_backward_kernel.cuh): Q and dO are loaded once per 128 keys,
// S^T and dP^T read K and V once per 128 queries (m64n128 wgmma: 96 bytes of shared memory per clock at the tensor
// cores' rate instead of 128), and dQ leaves by one bulk reduction per 128 keys instead of 64, in the same tiles
// (DqLayout::tiles: the query half of warpgroup w is the 64-query tile 2 step + w). One block per SM, up to 255
// registers a thread: the 64-key kernel's 168 spilled.
#pragma once
#include "core/launch_limits.h"
#include "kernels/attention_backward_passes.cuh"
#include "kernels/attention_dy_codes.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/attention_wgmma_common.cuh"
#include "kernels/device_facts.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kKeys128 = 128, kSteps128 = 128, kThreads128 = 256;
constexpr int kDqTile128Bytes = 64 * 64 * 4;  // one warpgroup's dQ tile (f32)
// sK, sV (2 tiles each: the warpgroups' keys), 2 stages of sQ and of sdO (2 tiles each: the step's query halves),
// sdS^T as 4 tiles ([key half][query half]), a dQ tile per warpgroup, 2 stages of 128 lse and of 128 delta; +1024
// to align the tiles to 1024 bytes. 165 KB: one block per SM.
constexpr int kSmem128 = 16 * kTileBytes + 2 * kDqTile128Bytes + 4 * kSteps128 * 4 + 1024;

// The lab's step orders of this kernel (kFlags, or-ed; 0 is the product's; the same values with any of them):
//   kJoint: S^T's and dP^T's MMAs in one group, P^T and dS^T made together once it is done (the product commits
//     S^T's first and makes P^T while dP^T's run);
//   kMaskEveryStep: the causal mask's test inside P^T's loop on every step (the product sets the masked scores of the
//     diagonal step to -inf in a loop of their own, mask_scores);
//   kDqLast: dV's and dK's MMAs both before the block barrier, dQ's after, then one wait for all (the product: dV
//     before the barrier, then dQ, then dK, whose MMAs run while dQ leaves);
//   kLseAtLoad: the next step's lse scaled by log2(e) where it is loaded (a register wait on the load at the top of
//     the step; the product scales it where it is stored, at the end).
// kBackward128Main35: the product of the thirty-fifth session.
enum Backward128Flags : int { kJoint = 1, kMaskEveryStep = 2, kDqLast = 4, kLseAtLoad = 8 };
inline constexpr int kBackward128Main35 = kMaskEveryStep | kDqLast | kLseAtLoad;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// kCodes: qkv read from E4M3 codes with a scale per row (AttentionQkv), dequantized into the tiles as they load.
// kDy: dK and dV go to dy's codes (AttentionDyCodes), not into dqkv. Else where dy.stats.colsum is set (accumulate
// false), they go into dqkv with their column sums.
template <bool kCodes, bool kDy, int kFlags = 0>
__global__ void __launch_bounds__(kThreads128, 1)
    attention_backward_wgmma128_kernel(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout,
                                       AttentionQkv qkv, const float* lse, int BH, int T, int NH, int group,
                                       float scale, bool accumulate, AttentionDyCodes dy) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sK = smem;                    // [key half]
  unsigned char* sV = sK + 2 * kTileBytes;     // [key half]
  unsigned char* sQ = sV + 2 * kTileBytes;     // [stage][query half]
  unsigned char* sdO = sQ + 4 * kTileBytes;    // [stage][query half]
  unsigned char* sdSt = sdO + 4 * kTileBytes;  // [key half][query half]
  float* sdQ = reinterpret_cast<float*>(sdSt + 4 * kTileBytes);  // [warpgroup] 64 x 64, fragment order
  float* sLse = sdQ + 2 * 64 * 64;                               // [stage] 128, lse * log2(e)
  float* sDelta = sLse + 2 * kSteps128;                          // [stage] 128

  // blk.warp 0..7, blk.key_lo = k0 + 16 warp: warpgroup wg's warp wl (= warp % 4) owns keys k0 + 64 wg + 16 wl.
  const BackwardBlock<kKeys128, kHs> blk(BH, T, NH, group);
  const int tid = static_cast<int>(threadIdx.x), wg = tid / 128, wl = blk.warp % 4;
  const int64_t head0 = int64_t{blk.b} * T * blk.ld + blk.h * kHs;  // this head's first q element
  const bf16* q_base = kCodes ? nullptr : qkv.bf16 + head0;
  const uint8_t* qc_base = kCodes ? qkv.e4m3 + head0 : nullptr;
  const float* row_sinv = kCodes ? qkv.row_scale_inv + int64_t{blk.b} * T : nullptr;
  const bf16* do_base = dout + int64_t{blk.b} * T * blk.C + blk.h * kHs;
  const float* lse_bh = lse + int64_t{blk.bh} * T;
  const float* delta_bh = delta + int64_t{blk.bh} * T;
  const int n_steps = ceil_div(T, kSteps128), n_qb = ceil_div(T, kRows);
  const float sl2 = scale * kLog2e;

  // Q (bf16; kCodes: fetched and staged here too) and dO of the query rows q0 .. q0 + 127 into stage st.
  auto load_rows = [&](int q0, int st) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if constexpr (!kCodes)
        load_tile_sw128<kThreads128>(sQ + (2 * st + half) * kTileBytes, q_base, blk.ld, q0 + 64 * half, T, tid);
      load_tile_sw128<kThreads128>(sdO + (2 * st + half) * kTileBytes, do_base, blk.C, q0 + 64 * half, T, tid);
    }
    cp_async_commit();
    if constexpr (kCodes) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        CodesTile<kThreads128> q_codes;
        q_codes.fetch(qc_base, row_sinv, blk.ld, q0 + 64 * half, T, tid);
        q_codes.stage(sQ + (2 * st + half) * kTileBytes, tid);
      }
    }
  };
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int k0 = blk.k0 + 64 * half;
    if constexpr (kCodes) {
      CodesTile<kThreads128> k_codes, v_codes;
      k_codes.fetch(qc_base + blk.C, row_sinv, blk.ld, k0, T, tid);
      v_codes.fetch(qc_base + 2 * blk.C, row_sinv, blk.ld, k0, T, tid);
      k_codes.stage(sK + half * kTileBytes, tid);
      v_codes.stage(sV + half * kTileBytes, tid);
    } else {
      load_tile_sw128<kThreads128>(sK + half * kTileBytes, q_base + blk.C, blk.ld, k0, T, tid);
      load_tile_sw128<kThreads128>(sV + half * kTileBytes, q_base + 2 * blk.C, blk.ld, k0, T, tid);
    }
  }
  load_rows(blk.kb * kSteps128, 0);
  if (tid < kSteps128) {  // query rows past T: lse = inf, hence P = 0
    const int qi = blk.kb * kSteps128 + tid;
    sLse[tid] = qi < T ? lse_bh[qi] * kLog2e : INFINITY;
    sDelta[tid] = qi < T ? delta_bh[qi] : 0.0f;
  }

  float dk[8][4] = {}, dv[8][4] = {};
  const uint64_t desc_k = sw128_desc(sK + wg * kTileBytes), desc_v = sw128_desc(sV + wg * kTileBytes);

  for (int step = blk.kb; step < n_steps; ++step) {
    const int st = (step - blk.kb) & 1, q0 = step * kSteps128;
    cp_async_wait<0>();    // the only group in flight is stage st (with sK, sV on the first step)
    fence_async_shared();  // this thread's cp.async writes (and kCodes stores), visible to the async proxy (wgmma)
    // Stage st is complete, and every warp's MMAs of step - 1 are done: stage st ^ 1 and sdSt are free.
    __syncthreads();
    float next_lse = INFINITY, next_delta = 0.0f;  // scaled by log2(e) at the end of the step (kLseAtLoad: here)
    if (step + 1 < n_steps) {
      load_rows(q0 + kSteps128, st ^ 1);
      const int qi = q0 + kSteps128 + tid;
      if (tid < kSteps128 && qi < T) {
        next_lse = (kFlags & kLseAtLoad) ? lse_bh[qi] * kLog2e : lse_bh[qi];
        next_delta = delta_bh[qi];
      }
    }
    const uint64_t desc_q = sw128_desc(sQ + 2 * st * kTileBytes), desc_do = sw128_desc(sdO + 2 * st * kTileBytes);

    // S^T = K_w Q^T and dP^T = V_w dO^T: (64 keys, 128 queries), K = the 64 channels; two groups (kJoint: one).
    float s[16][4], dp[16][4];
    uint32_t pa[8][4], dsa[8][4];  // P^T, dS^T as A fragments (k = queries)
    const bool diagonal = step == blk.kb;  // masked on this step only (queries precede keys; every key past T)
    auto store_ds = [&](int j, uint32_t lo, uint32_t hi) { store_ds_sw128(sdSt, wg, wl, blk.g, blk.t, j, lo, hi); };
    const float* lse2 = sLse + st * kSteps128;
    const float* delta_q = sDelta + st * kSteps128;
    if constexpr (!(kFlags & kJoint)) {
      backward_sdp_ds<(kFlags & kMaskEveryStep) != 0>(s, dp, pa, dsa, desc_k, desc_q, desc_v, desc_do, lse2, delta_q,
                                                      sl2, diagonal, q0, blk.key_lo, blk.g, blk.t, store_ds);
    } else {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHs / 16; ++kk) {
        wgmma_ss_n128(s, desc_k + kk * kKStep, desc_q + kk * kKStep, kk > 0);
        wgmma_ss_n128(dp, desc_v + kk * kKStep, desc_do + kk * kKStep, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_settle(s);
      wgmma_settle(dp);
      backward_p_ds(s, dp, lse2, delta_q, sl2, diagonal, q0, blk.key_lo, blk.g, blk.t, pa, dsa, store_ds);
    }

    // dV += P^T dO, dK += dS^T Q (K = the 128 queries; dO and Q are (queries, channels): MN-major B, the stage's two
    // tiles one after the other). dV's MMAs run while the warpgroups meet at the barrier below, dK's (after dQ's)
    // while dQ leaves; kDqLast: both before the barrier.
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      wgmma_settle(pa[kk]);
      wgmma_settle(dsa[kk]);
    }
    auto mma_dk = [&] {
#pragma unroll
      for (int kk = 0; kk < kSteps128 / 16; ++kk) wgmma_rs<1>(dk, dsa[kk], desc_q + kk * kMnStep);
    };
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps128 / 16; ++kk) {
      wgmma_rs<1>(dv, pa[kk], desc_do + kk * kMnStep);
      if constexpr (kFlags & kDqLast) wgmma_rs<1>(dk, dsa[kk], desc_q + kk * kMnStep);
    }
    wgmma_commit();

    // dQ of the warpgroup's 64 queries = dS K over the 128 keys (mma_dq_128keys), once both dS^T are stored.
    fence_async_shared();  // this thread's dS^T stores, visible to wgmma
    __syncthreads();       // both warpgroups' dS^T rows are in place
    float dqa[8][4];
    mma_dq_128keys(dqa, sdSt, sK, wg);
    if constexpr (kFlags & kDqLast) {
      wgmma_wait<0>();
      wgmma_settle(dv);
      wgmma_settle(dk);
    } else {
      mma_dk();
      wgmma_commit();
      wgmma_wait<1>();  // dV's and dQ's groups
      wgmma_settle(dv);
    }
    wgmma_settle(dqa);

    // The warpgroup's dQ tile (query tile 2 step + wg) out by bulk reductions.
    reduce_dq_tile_128(dqa, sdQ, dq_accum, blk.bh, n_qb, 2 * step + wg, wg, wl, blk.lane);
    if (tid < kSteps128) {  // stage st ^ 1 was last read in step - 1, before this step's first barrier
      sLse[(st ^ 1) * kSteps128 + tid] = (kFlags & kLseAtLoad) ? next_lse : next_lse * kLog2e;
      sDelta[(st ^ 1) * kSteps128 + tid] = next_delta;
    }
    if constexpr (!(kFlags & kDqLast)) {  // dK's MMAs read stage st's Q, which the next step's loads overwrite
      wgmma_wait<0>();
      wgmma_settle(dk);
    }
  }

  if (blk.lane == 0) bulk_wait_all();  // shared memory must outlive each warp's last reduction's read
  finish_dkv_128<kDy>(dk, dv, scale, dy, dqkv, accumulate, blk, wg, wl, tid % 128, sQ, BH, NH, T);
}

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

template <bool kCodes, bool kDy, int kFlags = 0>
__global__ void attention_backward_wgmma128_kernel(bf16*, float*, const float*, const bf16*, AttentionQkv,
                                                   const float*, int, int, int, int, float, bool, AttentionDyCodes) {
  __trap();
}

#endif

template <bool kCodes, bool kDy, int kFlags = 0>
void launch_backward_wgmma128(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout,
                              const AttentionQkv& qkv, const float* lse, int B, int T, int NH, float scale,
                              cudaStream_t stream, bool accumulate, const AttentionDyCodes& dy) {
  FP8T_CHECK((qkv.e4m3 != nullptr) == kCodes, "launch_backward_wgmma128: qkv's form does not match the kernel");
  FP8T_CHECK(!kDy || (dy.scale != nullptr && !accumulate),
             "launch_backward_wgmma128: dy codes need a scale, and accumulate false");
  FP8T_CHECK(kDy || !dy.stats.colsum || (!accumulate && dqkv),
             "launch_backward_wgmma128: column sums need accumulate false and dqkv");
  auto* kernel = attention_backward_wgmma128_kernel<kCodes, kDy, kFlags>;
  static PerDevice<int> resident;  // blocks resident at once per device (the shared memory limit is set on each)
  const int slots = resident.get([kernel] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem128));
    return resident_blocks(reinterpret_cast<const void*>(kernel), kThreads128, kSmem128);
  });
  const int BH = B * NH, n_kb = ceil_div(T, kKeys128);
  kernel<<<BH * n_kb, kThreads128, kSmem128, stream>>>(dqkv, dq_accum, delta, dout, qkv, lse, BH, T, NH,
                                                       backward_group(BH, n_kb, T, kHs, slots), scale, accumulate,
                                                       dy);
  CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fp8t::kernels
