// Softmax cross-entropy: one block per row; an online max/sum in one read of the row, then (in the
// backward) one more read that writes the gradient in place.
#include "kernels/classifier.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr int kThreads = 512;

// Returns the row's max and sum of exp(x - max) over the first V columns (every thread gets them).
__device__ void row_softmax_stats(const bf16* x, int V, float* scratch, float& row_max, float& row_sum) {
  float m = -INFINITY, s = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = __bfloat162float(x[c]);
    if (v > m) {
      s = s * __expf(m - v) + 1.0f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  row_max = block_max(m, scratch);
  row_sum = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - row_max), scratch);
}

__global__ void crossentropy_forward_kernel(float* losses, const bf16* logits, const int32_t* targets, int V, int Vp) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bf16* x = logits + row * Vp;
  float m, s;
  row_softmax_stats(x, V, scratch, m, s);
  if (threadIdx.x == 0) {
    const int t = targets[row];
    losses[row] = (t >= 0 && t < V) ? m + logf(s) - __bfloat162float(x[t]) : NAN;
  }
}

__global__ void crossentropy_backward_kernel(bf16* dlogits, const bf16* logits, const int32_t* targets, float dloss,
                                             int V, int Vp) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bf16* x = logits + row * Vp;
  float m, s;
  row_softmax_stats(x, V, scratch, m, s);
  __syncthreads();  // with dlogits == logits, every read of the row above must precede the writes below
  const int t = targets[row];
  const float inv = 1.0f / s;
  bf16* dx = dlogits + row * Vp;
  for (int c = threadIdx.x; c < Vp; c += blockDim.x) {
    float g = 0.0f;
    if (c < V) g = (__expf(__bfloat162float(x[c]) - m) * inv - (c == t ? 1.0f : 0.0f)) * dloss;
    dx[c] = __float2bfloat16_rn(g);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void crossentropy_forward(float* losses, const bf16* logits, const int32_t* targets, int64_t BT, int V, int Vp,
                          cudaStream_t stream) {
  FP8T_CHECK(BT > 0 && V > 0 && V <= Vp, "crossentropy_forward: bad sizes BT={} V={} Vp={}", BT, V, Vp);
  FP8T_CHECK(BT <= 0x7fffffff, "crossentropy_forward: BT={} too large for one grid", BT);
  crossentropy_forward_kernel<<<static_cast<unsigned>(BT), kThreads, 0, stream>>>(losses, logits, targets, V, Vp);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_backward(bf16* dlogits, const bf16* logits, const int32_t* targets, float dloss, int64_t BT, int V,
                           int Vp, cudaStream_t stream) {
  FP8T_CHECK(BT > 0 && V > 0 && V <= Vp, "crossentropy_backward: bad sizes BT={} V={} Vp={}", BT, V, Vp);
  FP8T_CHECK(BT <= 0x7fffffff, "crossentropy_backward: BT={} too large for one grid", BT);
  crossentropy_backward_kernel<<<static_cast<unsigned>(BT), kThreads, 0, stream>>>(dlogits, logits, targets, dloss, V,
                                                                                   Vp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
