// Embedding lookup (one block per token) and its scatter-add backward with f32 atomics.
#include "core/launch_limits.h"
#include "kernels/cuda_common.cuh"
#include "kernels/embedding.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

// grid (B*T); each thread strides over C.
__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int T,
                                         int C) {
  const int64_t bt = blockIdx.x;
  const int t = static_cast<int>(bt % T);
  const int64_t tok = tokens[bt];
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    out[bt * C + c] = __float2bfloat16_rn(__bfloat162float(wte[tok * C + c]) + __bfloat162float(wpe[int64_t{t} * C + c]));
}

__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int T,
                                          int C) {
  const int64_t bt = blockIdx.x;
  const int t = static_cast<int>(bt % T);
  const int64_t tok = tokens[bt];
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = __bfloat162float(dout[bt * C + c]);
    atomicAdd(&dwte[tok * C + c], d);
    atomicAdd(&dwpe[int64_t{t} * C + c], d);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                       cudaStream_t stream) {
  FP8T_CHECK(B > 0 && T > 0 && C > 0, "embedding_forward: bad sizes B={} T={} C={}", B, T, C);
  const unsigned blocks = checked_grid(int64_t{B} * T, kMaxGridX, "embedding_forward", "B*T tokens (one block each)");
  embedding_forward_kernel<<<blocks, std::min(C, 256), 0, stream>>>(out, tokens, wte, wpe, T, C);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B, int T, int C,
                        cudaStream_t stream) {
  FP8T_CHECK(B > 0 && T > 0 && C > 0, "embedding_backward: bad sizes B={} T={} C={}", B, T, C);
  const unsigned blocks = checked_grid(int64_t{B} * T, kMaxGridX, "embedding_backward", "B*T tokens (one block each)");
  embedding_backward_kernel<<<blocks, std::min(C, 256), 0, stream>>>(dwte, dwpe, dout, tokens, T, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
