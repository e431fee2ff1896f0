// The attention backward's main pass at head size 64, warp-specialized as FlashAttention-3 builds it (sm_90a): the
// 128-key tile and step of kernels/attention_wgmma_backward128_kernel.cuh, with a third warpgroup that only loads.
// Its first warp brings K and V once and each step's Q and dO by TMA (128-byte swizzled boxes, rows past T read
// as zeros) and lse and delta by plain loads, into two stages on transaction barriers (full: the stage has landed;
// empty: the eight computing warps are done with it). The two computing warpgroups then issue no loads and never
// meet the loading one, and dS^T has two buffers (by step parity), so the one barrier a step left is the named
// barrier over the 256 computing threads that puts both warpgroups' dS^T rows in place before dQ reads them. That
// barrier also frees the other dS^T buffer: a warpgroup writes buffer b again two steps on, after the next step's
// barrier, which the other warpgroup reaches only once its dQ MMAs of this step are done. Registers: setmaxnreg
// moves them from the loading warpgroup (kProducerRegs) to the computing ones (kConsumerRegs): 384 threads, one
// block per SM, 197 KB of shared memory. qkv as bf16 only (its E4M3 codes need a dequantizing load: the cp.async
// kernel takes those).
#pragma once
#include "core/launch_limits.h"
#include "kernels/attention_backward_passes.cuh"
#include "kernels/attention_dy_codes.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/attention_wgmma_common.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/tma.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kThreadsWs = 384, kComputeThreadsWs = 256, kProducerRegs = 24, kConsumerRegs = 240;
constexpr int kKeysWs = 128, kStepWs = 128;
// sK, sV (2 tiles each), 2 stages of sQ and of sdO (2 tiles each), 2 buffers of sdS^T (4 tiles each), a dQ tile
// per warpgroup (f32), 2 stages of 128 lse (times log2(e)) and of 128 delta, 6 barriers; +1024 to align the tiles.
constexpr int kSmemWs = 20 * kTileBytes + 2 * 64 * 64 * 4 + 4 * kStepWs * 4 + 6 * 8 + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// kDy: dK and dV go to dy's codes (AttentionDyCodes), not into dqkv. Else where dy.stats.colsum is set (accumulate
// false), they go into dqkv with their column sums. tm_qkv: qkv (B, T, 3C) as 64 x 64 boxes; tm_dout: dout (B, T, C).
template <bool kDy>
__global__ void __launch_bounds__(kThreadsWs, 1)
    attention_backward_ws_kernel(const __grid_constant__ CUtensorMap tm_qkv,
                                 const __grid_constant__ CUtensorMap tm_dout, bf16* dqkv, float* dq_accum,
                                 const float* delta, const float* lse, int BH, int T, int NH, int group, float scale,
                                 bool accumulate, AttentionDyCodes dy) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sK = smem;                    // [key half]
  unsigned char* sV = sK + 2 * kTileBytes;     // [key half]
  unsigned char* sQ = sV + 2 * kTileBytes;     // [stage][query half]
  unsigned char* sdO = sQ + 4 * kTileBytes;    // [stage][query half]
  unsigned char* sdSt = sdO + 4 * kTileBytes;  // [buffer][key half][query half]
  float* sdQ = reinterpret_cast<float*>(sdSt + 8 * kTileBytes);  // [warpgroup] 64 x 64, fragment order
  float* sLse = sdQ + 2 * 64 * 64;                               // [stage] 128, lse * log2(e)
  float* sDelta = sLse + 2 * kStepWs;                            // [stage] 128
  uint64_t* full = reinterpret_cast<uint64_t*>(sDelta + 2 * kStepWs);  // [stage]
  uint64_t* empty = full + 2;                                          // [stage]
  uint64_t* kv_full = empty + 2;

  // blk.warp 0..11; for the computing warps (0..7) blk.key_lo = k0 + 16 warp: warpgroup wg's warp wl (= warp % 4)
  // owns keys k0 + 64 wg + 16 wl.
  const BackwardBlock<kKeysWs, kHs> blk(BH, T, NH, group);
  const int tid = static_cast<int>(threadIdx.x), wg = tid / 128, wl = blk.warp % 4;
  const int n_steps = ceil_div(T, kStepWs), n_qb = ceil_div(T, kRows);
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(full + s, 32);  // the loading warp's lanes, and the TMA bytes lane 0 expects
      mbar_init(empty + s, 8);  // one arrival per computing warp
    }
    mbar_init(kv_full, 1);
    mbar_init_fence();
  }
  __syncthreads();  // the block's only one: from here the loading warpgroup and the computing ones never meet

  if (wg == 2) {  // the loading warpgroup: its first warp loads, the others leave
    setmaxnreg_dec<kProducerRegs>();
    if (blk.warp != 8) return;
    const int lane = blk.lane;
    if (lane == 0) {
      tma_prefetch_map(&tm_qkv);
      tma_prefetch_map(&tm_dout);
      mbar_arrive_expect_tx(kv_full, 4 * kTileBytes);
      for (int half = 0; half < 2; ++half) {
        const int k0 = blk.k0 + 64 * half;
        tma_load_3d(sK + half * kTileBytes, &tm_qkv, blk.C + blk.h * kHs, k0, blk.b, kv_full);
        tma_load_3d(sV + half * kTileBytes, &tm_qkv, 2 * blk.C + blk.h * kHs, k0, blk.b, kv_full);
      }
    }
    const float* lse_bh = lse + int64_t{blk.bh} * T;
    const float* delta_bh = delta + int64_t{blk.bh} * T;
    for (int step = blk.kb, it = 0; step < n_steps; ++step, ++it) {
      const int st = it & 1, q0 = step * kStepWs;
      if (it >= 2) mbar_wait(empty + st, ((it >> 1) - 1) & 1);  // the computing warps are done with step - 2's
      if (lane == 0) {  // the tiles first: their bytes are expected before any arrival can complete the phase
        mbar_expect_tx(full + st, 4 * kTileBytes);
        for (int half = 0; half < 2; ++half) {
          tma_load_3d(sQ + (2 * st + half) * kTileBytes, &tm_qkv, blk.h * kHs, q0 + 64 * half, blk.b, full + st);
          tma_load_3d(sdO + (2 * st + half) * kTileBytes, &tm_dout, blk.h * kHs, q0 + 64 * half, blk.b, full + st);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // query rows past T: lse = inf, hence P = 0
        const int r = lane + 32 * i, qi = q0 + r;
        sLse[st * kStepWs + r] = qi < T ? lse_bh[qi] * kLog2e : INFINITY;
        sDelta[st * kStepWs + r] = qi < T ? delta_bh[qi] : 0.0f;
      }
      mbar_arrive(full + st);  // each lane once its lse and delta are stored (release)
    }
    return;
  }

  setmaxnreg_inc<kConsumerRegs>();
  const float sl2 = scale * kLog2e;
  float dk[8][4] = {}, dv[8][4] = {};
  const uint64_t desc_k = sw128_desc(sK + wg * kTileBytes), desc_v = sw128_desc(sV + wg * kTileBytes);
  mbar_wait(kv_full, 0);

  for (int step = blk.kb, it = 0; step < n_steps; ++step, ++it) {
    const int st = it & 1, q0 = step * kStepWs;
    unsigned char* sdS = sdSt + (it & 1) * 4 * kTileBytes;
    mbar_wait(full + st, (it >> 1) & 1);
    const uint64_t desc_q = sw128_desc(sQ + 2 * st * kTileBytes), desc_do = sw128_desc(sdO + 2 * st * kTileBytes);

    // S^T = K_w Q^T, then dP^T = V_w dO^T: (64 keys, 128 queries), K = the 64 channels.
    float s[16][4], dp[16][4];
    uint32_t pa[8][4], dsa[8][4];  // P^T, dS^T as A fragments (k = queries)
    const bool diagonal = step == blk.kb;  // masked on this step only (queries precede keys; every key past T)
    auto store_ds = [&](int j, uint32_t lo, uint32_t hi) { store_ds_sw128(sdS, wg, wl, blk.g, blk.t, j, lo, hi); };
    const float* lse2 = sLse + st * kStepWs;
    const float* delta_q = sDelta + st * kStepWs;
    backward_sdp_ds(s, dp, pa, dsa, desc_k, desc_q, desc_v, desc_do, lse2, delta_q, sl2, diagonal, q0, blk.key_lo,
                    blk.g, blk.t, store_ds);

    // dV += P^T dO, then (after dQ's) dK += dS^T Q (K = the 128 queries; dO and Q are (queries, channels): MN-major
    // B, the stage's two tiles one after the other). dV's MMAs run while the warpgroups meet at the barrier below,
    // dK's while dQ leaves.
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      wgmma_settle(pa[kk]);
      wgmma_settle(dsa[kk]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kStepWs / 16; ++kk) wgmma_rs<1>(dv, pa[kk], desc_do + kk * kMnStep);
    wgmma_commit();

    // dQ of the warpgroup's 64 queries = dS K over the 128 keys (mma_dq_128keys), once both dS^T are stored.
    fence_async_shared();                      // this thread's dS^T stores, visible to wgmma
    named_barrier(1, kComputeThreadsWs);       // both warpgroups' dS^T rows are in place
    float dqa[8][4];
    mma_dq_128keys(dqa, sdS, sK, wg);
#pragma unroll
    for (int kk = 0; kk < kStepWs / 16; ++kk) wgmma_rs<1>(dk, dsa[kk], desc_q + kk * kMnStep);
    wgmma_commit();
    wgmma_wait<1>();  // dV's and dQ's groups
    wgmma_settle(dv);
    wgmma_settle(dqa);

    // The warpgroup's dQ tile (query tile 2 step + wg) out by bulk reductions.
    reduce_dq_tile_128(dqa, sdQ, dq_accum, blk.bh, n_qb, 2 * step + wg, wg, wl, blk.lane);
    wgmma_wait<0>();  // dK's MMAs: the last reads of stage st
    wgmma_settle(dk);
    __syncwarp();
    if (blk.lane == 0) mbar_arrive(empty + st);
  }

  if (blk.lane == 0) bulk_wait_all();  // shared memory must outlive each warp's last reduction's read
  finish_dkv_128<kDy, kComputeThreadsWs>(dk, dv, scale, dy, dqkv, accumulate, blk, wg, wl, tid % 128, sQ, BH, NH, T);
}

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

template <bool kDy>
__global__ void attention_backward_ws_kernel(const __grid_constant__ CUtensorMap, const __grid_constant__ CUtensorMap,
                                             bf16*, float*, const float*, const float*, int, int, int, int, float,
                                             bool, AttentionDyCodes) {
  __trap();
}

#endif

// Whether the warp-specialized kernel takes these tensors: bf16 qkv and dout, 16-byte aligned (TMA's base).
inline bool backward_ws_takes(const AttentionQkv& qkv, const bf16* dout) {
  return qkv.bf16 != nullptr && reinterpret_cast<uintptr_t>(qkv.bf16) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(dout) % 16 == 0;
}

template <bool kDy>
void launch_backward_ws(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const AttentionQkv& qkv,
                        const float* lse, int B, int T, int NH, float scale, cudaStream_t stream, bool accumulate,
                        const AttentionDyCodes& dy) {
  FP8T_CHECK(backward_ws_takes(qkv, dout), "launch_backward_ws: needs bf16 qkv and dout, 16-byte aligned");
  FP8T_CHECK(!kDy || (dy.scale != nullptr && !accumulate),
             "launch_backward_ws: dy codes need a scale, and accumulate false");
  FP8T_CHECK(kDy || !dy.stats.colsum || (!accumulate && dqkv),
             "launch_backward_ws: column sums need accumulate false and dqkv");
  auto* kernel = attention_backward_ws_kernel<kDy>;
  static PerDevice<int> resident;  // blocks resident at once per device (the shared memory limit is set on each)
  const int slots = resident.get([kernel] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemWs));
    return resident_blocks(reinterpret_cast<const void*>(kernel), kThreadsWs, kSmemWs);
  });
  const int C = NH * kHs, BH = B * NH, n_kb = ceil_div(T, kKeysWs);
  const CUtensorMap tm_qkv = tensor_map_bf16_3d(qkv.bf16, 3 * int64_t{C}, T, B, 3 * int64_t{C}, 3 * int64_t{C} * T,
                                                64, 64);
  const CUtensorMap tm_dout = tensor_map_bf16_3d(dout, C, T, B, C, int64_t{C} * T, 64, 64);
  kernel<<<BH * n_kb, kThreadsWs, kSmemWs, stream>>>(tm_qkv, tm_dout, dqkv, dq_accum, delta, lse, BH, T, NH,
                                                     backward_group(BH, n_kb, T, kHs, slots), scale, accumulate, dy);
  CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fp8t::kernels
