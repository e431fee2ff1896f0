// CUDA entry points for the optimizer over raw ranges of the flat f32 buffers (FP8T_HAVE_CUDA).
#pragma once
#include <cstdint>

namespace fp8t::cuda_ops {

// AdamW over n elements on the compute stream (same math as adamw_update_cpu); param_bf16, if not
// null, receives the updated parameters rounded to bf16.
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, float grad_scale, int step, void* param_bf16 = nullptr);
// Sum of squares of n f32 values; synchronises to return it to the host.
double sum_squares(const float* x, int64_t n);

}  // namespace fp8t::cuda_ops
