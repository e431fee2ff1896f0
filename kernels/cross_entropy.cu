// Softmax cross-entropy: one block per row. The forward pass reads the row once (an online max/sum)
// and keeps each row's logsumexp; the backward pass reads the row once more and writes the gradient
// in place, scaled by a loss gradient it reads from device memory (no host round trip).
#include "kernels/cross_entropy.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/fp8_convert8.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr int kThreads = 512;

// Online softmax statistics: folds values v[0..n) (masked ones are -INFINITY) into (m, s).
__device__ __forceinline__ void fold(float& m, float& s, const float* v, int n) {
  float vmax = -INFINITY;
  for (int i = 0; i < n; ++i) vmax = fmaxf(vmax, v[i]);
  if (vmax == -INFINITY) return;
  const float m_new = fmaxf(m, vmax);
  float add = 0.0f;
  for (int i = 0; i < n; ++i) add += __expf(v[i] - m_new);
  s = s * __expf(m - m_new) + add;  // exp(-inf) = 0 on the first fold
  m = m_new;
}

// The row's logsumexp over its first V columns. kVec: 16-byte loads (Vp % 8 == 0, aligned rows).
template <bool kVec>
__device__ float row_logsumexp(const bf16* x, int V, int Vp, float* scratch) {
  float m = -INFINITY, s = 0.0f;
  if constexpr (kVec) {
#pragma unroll 2
    for (int c0 = threadIdx.x * 8; c0 < Vp; c0 += blockDim.x * 8) {
      const auto q = Vec16<bf16>::load(x + c0);
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = c0 + i < V ? __bfloat162float(q.v[i]) : -INFINITY;
      fold(m, s, v, 8);
    }
  } else {
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      const float v = __bfloat162float(x[c]);
      fold(m, s, &v, 1);
    }
  }
  const float row_max = block_max(m, scratch);
  const float row_sum = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - row_max), scratch);
  return row_max + logf(row_sum);
}

template <bool kVec>
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const bf16* logits, const int32_t* targets,
                                             int V, int Vp) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bf16* x = logits + row * Vp;
  const float l = row_logsumexp<kVec>(x, V, Vp, scratch);
  if (threadIdx.x == 0) {
    const int t = targets[row];
    losses[row] = (t >= 0 && t < V) ? l - __bfloat162float(x[t]) : NAN;
    lse[row] = l;
  }
}

// One block: *mean = sum(losses) / n.
__global__ void mean_kernel(float* mean, const float* losses, int64_t n) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += losses[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *mean = s / static_cast<float>(n);
}

// d loss / d logit c of a row with log-sum-exp l and target t, times d; 0 in the padding columns c >= V. The one
// expression every backward kernel uses, so their values agree bit for bit.
__device__ __forceinline__ float logit_grad(bf16 x, int c, int t, float l, float d, int V) {
  return c < V ? (__expf(__bfloat162float(x) - l) - (c == t ? 1.0f : 0.0f)) * d : 0.0f;
}

template <bool kVec>
__global__ void cross_entropy_backward_kernel(bf16* dlogits, const bf16* logits, const float* lse,
                                              const int32_t* targets, const float* dloss, float dloss_scale, int V,
                                              int Vp) {
  const int64_t row = blockIdx.x;
  const bf16* x = logits + row * Vp;
  bf16* dx = dlogits + row * Vp;
  const int t = targets[row];
  const float l = lse[row], d = *dloss * dloss_scale;
  // Each element is read and written by the same thread, so dlogits may alias logits.
  if constexpr (kVec) {
#pragma unroll 2
    for (int c0 = threadIdx.x * 8; c0 < Vp; c0 += blockDim.x * 8) {
      auto q = Vec16<bf16>::load(x + c0);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = c0 + i;
        const float g = logit_grad(q.v[i], c, t, l, d, V);
        q.v[i] = __float2bfloat16_rn(g);
      }
      q.store(dx + c0);
    }
  } else {
    for (int c = threadIdx.x; c < Vp; c += blockDim.x) {
      const float g = logit_grad(x[c], c, t, l, d, V);
      dx[c] = __float2bfloat16_rn(g);
    }
  }
}

// cross_entropy_backward_kernel<true>'s values, rounded to bf16 as it stores them, encoded as E5M2 (convert8: the
// cast's codes and statistics), 8 codes per 8-byte store; one atomic per statistic per block.
__global__ void cross_entropy_backward_codes_kernel(uint8_t* codes, const bf16* logits, const float* lse,
                                                    const int32_t* targets, const float* dloss, float dloss_scale,
                                                    int V, int Vp, const float* scale, Fp8CastOutputs stats) {
  const int64_t row = blockIdx.x;
  const bf16* x = logits + row * Vp;
  uint8_t* out = codes + row * Vp;
  const int t = targets[row];
  const float l = lse[row], d = *dloss * dloss_scale, s = *scale;
  ThreadStats st;
#pragma unroll 2
  for (int c0 = threadIdx.x * 8; c0 < Vp; c0 += blockDim.x * 8) {
    const auto q = Vec16<bf16>::load(x + c0);
    float g[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = c0 + i;
      const float v = logit_grad(q.v[i], c, t, l, d, V);
      g[i] = __bfloat162float(__float2bfloat16_rn(v));
    }
    *reinterpret_cast<uint2*>(out + c0) = convert8<Fp8Format::e5m2>(g, s, st);
  }
  flush_block_stats<kThreads>(st, stats);
}

bool vector_rows(const void* p, int Vp) { return Vp % 8 == 0 && aligned16(p); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void cross_entropy_forward(float* losses, float* lse, float* mean, const bf16* logits, const int32_t* targets,
                           int64_t BT, int V, int Vp, cudaStream_t stream) {
  FP8T_CHECK(BT > 0 && V > 0 && V <= Vp, "cross_entropy_forward: bad sizes BT={} V={} Vp={}", BT, V, Vp);
  FP8T_CHECK(BT <= 0x7fffffff, "cross_entropy_forward: BT={} too large for one grid", BT);
  const auto blocks = static_cast<unsigned>(BT);
  if (vector_rows(logits, Vp))
    cross_entropy_forward_kernel<true><<<blocks, kThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
  else
    cross_entropy_forward_kernel<false><<<blocks, kThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
  CUDA_CHECK_LAUNCH();
  if (mean) {
    mean_kernel<<<1, 1024, 0, stream>>>(mean, losses, BT);
    CUDA_CHECK_LAUNCH();
  }
}

void mean_reduce(float* mean, const float* values, int64_t n, cudaStream_t stream) {
  FP8T_CHECK(n > 0, "mean_reduce: n={}", n);
  mean_kernel<<<1, 1024, 0, stream>>>(mean, values, n);
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(bf16* dlogits, const bf16* logits, const float* lse, const int32_t* targets,
                            const float* dloss, float dloss_scale, int64_t BT, int V, int Vp, cudaStream_t stream) {
  FP8T_CHECK(BT > 0 && V > 0 && V <= Vp, "cross_entropy_backward: bad sizes BT={} V={} Vp={}", BT, V, Vp);
  FP8T_CHECK(BT <= 0x7fffffff, "cross_entropy_backward: BT={} too large for one grid", BT);
  const auto blocks = static_cast<unsigned>(BT);
  if (vector_rows(logits, Vp) && aligned16(dlogits))
    cross_entropy_backward_kernel<true>
        <<<blocks, kThreads, 0, stream>>>(dlogits, logits, lse, targets, dloss, dloss_scale, V, Vp);
  else
    cross_entropy_backward_kernel<false>
        <<<blocks, kThreads, 0, stream>>>(dlogits, logits, lse, targets, dloss, dloss_scale, V, Vp);
  CUDA_CHECK_LAUNCH();
}

bool cross_entropy_codes_supported(const bf16* logits, const uint8_t* codes, int Vp) {
  return vector_rows(logits, Vp) && (reinterpret_cast<uintptr_t>(codes) & 7u) == 0;
}

void cross_entropy_backward_codes(uint8_t* codes, const bf16* logits, const float* lse, const int32_t* targets,
                                  const float* dloss, float dloss_scale, int64_t BT, int V, int Vp, const float* scale,
                                  Fp8CastOutputs stats, cudaStream_t stream) {
  FP8T_CHECK(BT > 0 && V > 0 && V <= Vp, "cross_entropy_backward_codes: bad sizes BT={} V={} Vp={}", BT, V, Vp);
  FP8T_CHECK(BT <= 0x7fffffff, "cross_entropy_backward_codes: BT={} too large for one grid", BT);
  FP8T_CHECK(cross_entropy_codes_supported(logits, codes, Vp) && scale && !stats.colsum,
             "cross_entropy_backward_codes: needs Vp % 8 == 0 ({}), 16-byte aligned logits, 8-byte aligned codes, a "
             "scale and no column sums", Vp);
  cross_entropy_backward_codes_kernel<<<static_cast<unsigned>(BT), kThreads, 0, stream>>>(
      codes, logits, lse, targets, dloss, dloss_scale, V, Vp, scale, stats);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
