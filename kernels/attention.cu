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
#include "kernels/attention_mma.cuh"
#include "kernels/device_facts.cuh"

namespace fp8t::kernels {
namespace {

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

template <int HS>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
  constexpr int bytes = forward_smem_bytes<HS>();
  static PerDevice<bool> configured;  // the shared memory limit is set on each device
  configured.get([] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  });
  const dim3 grid(B * NH, ceil_div(T, kFwdRows));
  attention_forward_kernel<HS><<<grid, kFwdThreads, bytes, stream>>>(out, lse, qkv, T, NH, 1.0f / sqrtf(float(HS)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_reads_codes(int HS, const AttentionKernels& k) { return use_wgmma(HS, k); }

void attention_forward(bf16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH, int HS,
                       cudaStream_t stream, const AttentionKernels& k) {
  check_sizes("attention_forward", qkv, B, T, NH, HS, k);
  if (use_wgmma(HS, k))
    attention_forward_wgmma64(out, lse, qkv, B, T, NH, 1.0f / sqrtf(64.0f), stream);
  else if (HS == 64)
    launch_forward<64>(out, lse, qkv.bf16, B, T, NH, stream);
  else
    launch_forward<128>(out, lse, qkv.bf16, B, T, NH, stream);
}

}  // namespace fp8t::kernels
