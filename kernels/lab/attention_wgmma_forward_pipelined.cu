// The lab's pipelined wgmma attention forward (kernels/lab/attention_wgmma_forward_pipelined.cuh).
#include <cmath>

#include "core/launch_limits.h"
#include "kernels/attention_wgmma.cuh"
#include "kernels/attention_wgmma_common.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/lab/attention_wgmma_forward_pipelined.cuh"

namespace fp8t::kernels::lab {
namespace {

constexpr int kFwdRows = 128, kFwdThreads = 256;
constexpr int kKStages = 2, kVStages = 3;
// sQ (2 tiles: one per warpgroup), 2 x sK, 3 x sV; +1024 for alignment.
constexpr int kFwdSmemBytes = (2 + kKStages + kVStages) * kTileBytes + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// One block of two warpgroups per (128 queries, b*h), heaviest query blocks first, as the product's forward. Step kt
// (from 1) of a warpgroup issues S = Q K_kt^T and then O += P_{kt-1} V_{kt-1} (P of the previous step, still in
// registers), waits only for S, runs the softmax of S (P_kt and the rescale alpha_kt) while P V runs, then waits for
// P V and rescales O by alpha_kt; after the last tile it adds that tile's P V. So O after step kt holds the tiles
// before kt at the running max of tile kt, as the product's O does before its P_kt V_kt. K is double-buffered and V
// triple-buffered: the stage that step kt + 1's loads overwrite was last read by MMAs that every warp waited for in
// step kt - 1 (K_{kt-1} by S, V_{kt-2} by P V), before step kt's barrier.
__global__ void __launch_bounds__(kFwdThreads, 2)
    attention_forward_pipelined_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + 2 * kTileBytes;
  unsigned char* sV = sK + kKStages * kTileBytes;

  const int C = NH * kHs;
  const int64_t ld = 3 * int64_t{C};
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kFwdRows;  // longest rows first
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int wg_lo = q0 + wg * 64, row_lo = wg_lo + warp * 16;
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * kHs;
  const int n_kt = ceil_div(std::min(q0 + kFwdRows, T), kKeys);  // the block's key tiles
  const float sl2 = scale * kLog2e;

  load_tile_sw128<kFwdThreads>(sQ, q_base, ld, q0, T);
  load_tile_sw128<kFwdThreads>(sQ + kTileBytes, q_base, ld, q0 + 64, T);
  load_tile_sw128<kFwdThreads>(sK, q_base + C, ld, 0, T);
  load_tile_sw128<kFwdThreads>(sV, q_base + 2 * C, ld, 0, T);
  cp_async_commit();
  const uint64_t dQ = sw128_desc(sQ + wg * kTileBytes);

  float o[8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float alpha[2];
  uint32_t pf[4][4];  // P of the previous tile: the A operand of its P V, in flight during a step
  float s[8][4];
  // Both warpgroups run every key tile of the block, so that no wgmma sits on a path ptxas cannot prove uniform (it
  // then serializes them): the lower warpgroup's last tile lies wholly after its queries, is masked out entirely
  // (P = 0, alpha = 1) and costs its MMAs, ~3% of the block's.
  cp_async_wait<0>();
  __syncthreads();
  if (1 < n_kt) {
    load_tile_sw128<kFwdThreads>(sK + kTileBytes, q_base + C, ld, kKeys, T);
    load_tile_sw128<kFwdThreads>(sV + kTileBytes, q_base + 2 * C, ld, kKeys, T);
    cp_async_commit();
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss<0, 0>(s, dQ + kk * kKStep, sw128_desc(sK) + kk * kKStep, kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_settle(s);
  if (kKeys - 1 > row_lo) mask_causal(s, 0, row_lo, g, t);
  softmax_step_p(s, sl2, m, l, alpha, pf);  // o is 0: no rescale

  for (int kt = 1; kt < n_kt; ++kt) {
    const int k0 = kt * kKeys;
    cp_async_wait<0>();  // K_kt and V_kt, committed in step kt - 1
    __syncthreads();     // ... are in place, and every warp is past step kt - 1's waits
    if (kt + 1 < n_kt) {
      load_tile_sw128<kFwdThreads>(sK + ((kt + 1) % kKStages) * kTileBytes, q_base + C, ld, k0 + kKeys, T);
      load_tile_sw128<kFwdThreads>(sV + ((kt + 1) % kVStages) * kTileBytes, q_base + 2 * C, ld, k0 + kKeys, T);
      cp_async_commit();
    }
    const uint64_t dKt = sw128_desc(sK + (kt % kKStages) * kTileBytes);
    const uint64_t dVprev = sw128_desc(sV + ((kt - 1) % kVStages) * kTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss<0, 0>(s, dQ + kk * kKStep, dKt + kk * kKStep, kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs<1>(o, pf[kk], dVprev + kk * kMnStep);
    wgmma_commit();
    wgmma_wait<1>();  // S landed; P V may still run
    wgmma_settle(s);
    if (k0 + kKeys - 1 > row_lo) mask_causal(s, k0, row_lo, g, t);
    uint32_t pf_next[4][4];
    softmax_step_p(s, sl2, m, l, alpha, pf_next);
    wgmma_wait<0>();
    wgmma_settle(o);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_settle(pf[kk]);  // pf stays untouched until P V has read it
    rescale_rows(o, alpha);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) pf[kk][i] = pf_next[kk][i];
  }
  // The last tile's P V.
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    wgmma_rs<1>(o, pf[kk], sw128_desc(sV + ((n_kt - 1) % kVStages) * kTileBytes) + kk * kMnStep);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_settle(o);

  store_rows(o, l, m, sl2, out + int64_t{b} * T * C + h * kHs, C, lse + int64_t{bh} * T, row_lo, T, g, t);
}

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

__global__ void attention_forward_pipelined_kernel(bf16*, float*, const bf16*, int, int, float) { __trap(); }

#endif

}  // namespace

void attention_forward_wgmma_pipelined(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                                       cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "lab::attention_forward_wgmma_pipelined: needs sm_90a and a Hopper GPU");
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "lab::attention_forward_wgmma_pipelined: bad sizes B={} T={} NH={}", B, T, NH);
  static PerDevice<bool> configured;  // the shared memory limit is set on each device
  configured.get([] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_pipelined_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kFwdSmemBytes));
    return true;
  });
  const dim3 grid(B * NH, ceil_div(T, kFwdRows));
  attention_forward_pipelined_kernel<<<grid, kFwdThreads, kFwdSmemBytes, stream>>>(out, lse, qkv, T, NH,
                                                                                  1.0f / sqrtf(float(kHs)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels::lab
