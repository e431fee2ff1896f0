// The attention forward at head size 64 on Hopper's warpgroup MMA (sm_90a) with its loads issued by its two computing
// warpgroups (cp.async, or E4M3 codes dequantized through registers): the product's forward where qkv is E4M3 codes
// (fp8_all) or bf16 not 16-byte aligned, and for bf16 qkv in the lab (kernels/lab/attention_wgmma_forward_variants.cu)
// against the product's, which loads by TMA from a loading warpgroup (kernels/attention_wgmma_forward_ws_kernel.cuh).
#pragma once
#include "core/launch_limits.h"
#include "kernels/attention_wgmma.cuh"
#include "kernels/attention_wgmma_common.cuh"
#include "kernels/device_facts.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kFwdRows = 128, kFwdThreads = 256;
constexpr int kFwdSmemBytes = 6 * kTileBytes + 1024;  // sQ (2 tiles), 2 x sK, 2 x sV; +1024 for alignment

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Forward: one block of two warpgroups per (128 queries, b*h), heaviest query blocks first; warpgroup w owns
// queries q0 + 64 w .. + 63 and runs the online softmax over key tiles of 64 up to the diagonal:
// S = Q K^T (A = Q, B = K, both K-major in shared memory), O += P V (A = P from registers, B = V MN-major).
// kCodes: qkv is read from E4M3 codes with a scale per row (AttentionQkv), dequantized into the same tiles; the
// next K and V tiles' codes are fetched before a step's MMAs and staged after them.
template <bool kCodes>
__global__ void __launch_bounds__(kFwdThreads, 2)
    attention_forward_wgmma_kernel(bf16* out, float* lse, AttentionQkv qkv, int T, int NH, float scale) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;                  // 2 tiles: one per warpgroup
  unsigned char* sK = sQ + 2 * kTileBytes;   // 2 stages
  unsigned char* sV = sK + 2 * kTileBytes;   // 2 stages

  const int C = NH * kHs;
  const int64_t ld = 3 * int64_t{C};
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kFwdRows;  // longest rows first
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int wg_lo = q0 + wg * 64, row_lo = wg_lo + warp * 16;  // this warpgroup's and this warp's first query
  const int64_t head0 = int64_t{b} * T * ld + h * kHs;  // this head's first q element
  const bf16* q_base = kCodes ? nullptr : qkv.bf16 + head0;
  const uint8_t* qc_base = kCodes ? qkv.e4m3 + head0 : nullptr;
  const float* row_sinv = kCodes ? qkv.row_scale_inv + int64_t{b} * T : nullptr;
  const int n_kt = ceil_div(std::min(q0 + kFwdRows, T), kKeys);
  const float sl2 = scale * kLog2e;

  CodesTile<kFwdThreads> next_k, next_v;  // kCodes: the next step's K and V codes
  if constexpr (kCodes) {  // every first load in flight before the first store
    CodesTile<kFwdThreads> q_lo, q_hi;
    q_lo.fetch(qc_base, row_sinv, ld, q0, T);
    q_hi.fetch(qc_base, row_sinv, ld, q0 + 64, T);
    next_k.fetch(qc_base + C, row_sinv, ld, 0, T);
    next_v.fetch(qc_base + 2 * C, row_sinv, ld, 0, T);
    q_lo.stage(sQ);
    q_hi.stage(sQ + kTileBytes);
    next_k.stage(sK);
    next_v.stage(sV);
  } else {
    load_tile_sw128<kFwdThreads>(sQ, q_base, ld, q0, T);
    load_tile_sw128<kFwdThreads>(sQ + kTileBytes, q_base, ld, q0 + 64, T);
    load_tile_sw128<kFwdThreads>(sK, q_base + C, ld, 0, T);
    load_tile_sw128<kFwdThreads>(sV, q_base + 2 * C, ld, 0, T);
    cp_async_commit();
  }
  const uint64_t dQ = sw128_desc(sQ + wg * kTileBytes);

  float o[8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8: raw max, partial sum

  for (int kt = 0; kt < n_kt; ++kt) {
    const int st = kt & 1, k0 = kt * kKeys;
    if constexpr (kCodes) {
      if (kt + 1 < n_kt) {
        next_k.fetch(qc_base + C, row_sinv, ld, k0 + kKeys, T);
        next_v.fetch(qc_base + 2 * C, row_sinv, ld, k0 + kKeys, T);
      }
    } else if (kt + 1 < n_kt) {  // the other stage was released by the barrier that ended the previous step
      load_tile_sw128<kFwdThreads>(sK + (st ^ 1) * kTileBytes, q_base + C, ld, k0 + kKeys, T);
      load_tile_sw128<kFwdThreads>(sV + (st ^ 1) * kTileBytes, q_base + 2 * C, ld, k0 + kKeys, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_shared();  // (kCodes) this thread's stores of stage st, visible to wgmma
    __syncthreads();
    if (k0 <= wg_lo + 63) {  // else every key of the tile is after every query of this warpgroup
      const uint64_t dKt = sw128_desc(sK + st * kTileBytes), dVt = sw128_desc(sV + st * kTileBytes);
      forward_tile_64(o, m, l, dQ, dKt, dVt, k0, row_lo, sl2, g, t);
    }
    if (kCodes && kt + 1 < n_kt) {  // the other stage was released by the barrier that ended the previous step
      next_k.stage(sK + (st ^ 1) * kTileBytes);
      next_v.stage(sV + (st ^ 1) * kTileBytes);
    }
    __syncthreads();  // every warp is done with stage st before the next step refills it
  }

  store_rows(o, l, m, sl2, out + int64_t{b} * T * C + h * kHs, C, lse + int64_t{bh} * T, row_lo, T, g, t);
}

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

template <bool kCodes>
__global__ void attention_forward_wgmma_kernel(bf16*, float*, AttentionQkv, int, int, float) {
  __trap();
}

#endif

// kCodes must match qkv's form (E4M3 codes or bf16).
template <bool kCodes>
void launch_forward_cp_async(bf16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH, float scale,
                             cudaStream_t stream) {
  FP8T_CHECK((qkv.e4m3 != nullptr) == kCodes, "launch_forward_cp_async: qkv's form does not match the kernel");
  static PerDevice<bool> configured;  // the shared memory limit is set on each device
  configured.get([] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_wgmma_kernel<kCodes>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kFwdSmemBytes));
    return true;
  });
  const dim3 grid(B * NH, ceil_div(T, kFwdRows));
  attention_forward_wgmma_kernel<kCodes><<<grid, kFwdThreads, kFwdSmemBytes, stream>>>(out, lse, qkv, T, NH, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fp8t::kernels
