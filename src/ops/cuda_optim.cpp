// CUDA optimizer entry points: AdamW and the gradient sum of squares over flat ranges.
#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_optim.h"

#include "core/cuda_check.h"
#include "core/tensor.h"
#include "kernels/adamw.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/stream.cuh"

namespace fp8t::cuda_ops {

void adamw(const AdamWBuffers& b, const AdamWHyper& h) { kernels::adamw_update(b, h, kernels::compute_stream()); }

double sum_squares(const void* x, DType dtype, int64_t n) {
  FP8T_CHECK(dtype == DType::f32 || dtype == DType::bf16, "sum_squares needs f32 or bf16, got {}", dtype_name(dtype));
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  Tensor acc = Tensor::zeros({1}, DType::f32, Device::cuda(dev), MemCategory::workspace);
  if (dtype == DType::f32)
    kernels::global_norm_squared(acc.data<float>(), static_cast<const float*>(x), static_cast<size_t>(n),
                                 kernels::compute_stream());
  else
    kernels::global_norm_squared(acc.data<float>(), static_cast<const __nv_bfloat16*>(x), static_cast<size_t>(n),
                                 kernels::compute_stream());
  float host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, acc.data<float>(), sizeof(float), cudaMemcpyDeviceToHost,
                             kernels::compute_stream()));
  CUDA_CHECK(cudaStreamSynchronize(kernels::compute_stream()));
  return host;
}

}  // namespace fp8t::cuda_ops
#endif
