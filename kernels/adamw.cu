// AdamW: one fused elementwise pass reading params, grads, m, v and writing params, m, v (+ bf16 copy).
#include <cmath>

#include "kernels/adamw.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                             size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, float bias_corr1, float bias_corr2, bf16* params_bf16) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float wd = (decay_mask == nullptr || decay_mask[i]) ? weight_decay : 0.0f;
    float p = params[i];
    p -= lr * ((mi / bias_corr1) / (sqrtf(vi / bias_corr2) + eps) + wd * p);
    params[i] = p;
    if (params_bf16) params_bf16[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void adamw_update(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step, bf16* params_bf16,
                  cudaStream_t stream) {
  FP8T_CHECK(step >= 1, "adamw_update: step must count from 1, got {}", step);
  FP8T_CHECK(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f, "adamw_update: betas ({}, {}) outside [0, 1)",
             beta1, beta2);
  if (n == 0) return;
  const float bias_corr1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), step));
  const float bias_corr2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), step));
  constexpr int kThreads = 256;
  const int grid = static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 132 * 16));
  adamw_kernel<<<grid, kThreads, 0, stream>>>(params, grads, m, v, decay_mask, n, lr, beta1, beta2, eps, weight_decay,
                                              grad_scale, bias_corr1, bias_corr2, params_bf16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
