// CUDA optimizer entry points: AdamW and the gradient sum of squares over flat f32 ranges.
#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_optim.h"

#include "core/cuda_check.h"
#include "core/tensor.h"
#include "kernels/adamw.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/stream.cuh"

namespace fp8t::cuda_ops {

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, float grad_scale, int step, void* param_bf16) {
  kernels::adamw_update(param, grad, m, v, nullptr, static_cast<size_t>(n), lr, beta1, beta2, eps, weight_decay,
                        grad_scale, step, static_cast<__nv_bfloat16*>(param_bf16), kernels::compute_stream());
}

double sum_squares(const float* x, int64_t n) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  Tensor acc = Tensor::zeros({1}, DType::f32, Device::cuda(dev), MemCategory::workspace);
  kernels::global_norm_squared(acc.data<float>(), x, static_cast<size_t>(n), kernels::compute_stream());
  float host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, acc.data<float>(), sizeof(float), cudaMemcpyDeviceToHost,
                             kernels::compute_stream()));
  CUDA_CHECK(cudaStreamSynchronize(kernels::compute_stream()));
  return host;
}

}  // namespace fp8t::cuda_ops
#endif
