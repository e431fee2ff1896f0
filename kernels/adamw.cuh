// AdamW over flat f32 buffers (FP32 master weights), optionally refreshing a bf16 compute copy.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fp8t::kernels {

// For each i < n, with g = grads[i] * grad_scale (grad_scale folds in 1/accumulation and clipping):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   params -= lr * (m / (1 - beta1^step) / (sqrt(v / (1 - beta2^step)) + eps) + wd * params)
// wd = weight_decay where decay_mask[i] != 0 (every element when decay_mask is null). Decay can also be
// chosen per range by calling once per contiguous range with its own weight_decay and a null mask.
// step counts from 1. params_bf16, when not null, receives the updated parameters rounded to bf16.
void adamw_update(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int step,
                  __nv_bfloat16* params_bf16, cudaStream_t stream);

}  // namespace fp8t::kernels
