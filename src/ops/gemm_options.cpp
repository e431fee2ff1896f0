// GEMM options (ops/ops.h), for the layers above ops, which do not reach the kernels: each sets the options of
// one device's GEMM context (kernels/matmul.cuh).
#include "ops/ops.h"

#ifdef FP8T_HAVE_CUDA
#include "kernels/matmul.cuh"
#endif

namespace fp8t {

void set_gemm_autotune(Device device, bool on) {
#ifdef FP8T_HAVE_CUDA
  if (device.is_cuda()) kernels::set_matmul_options(device.index, {.autotune = on});
#else
  (void)device;
  (void)on;
#endif
}

}  // namespace fp8t
