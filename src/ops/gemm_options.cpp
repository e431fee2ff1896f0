// Process-wide GEMM options (ops/ops.h), for the layers above ops, which do not reach the kernels.
#include "ops/ops.h"

#ifdef FP8T_HAVE_CUDA
#include "kernels/matmul.cuh"
#endif

namespace fp8t {

void set_gemm_autotune(bool on) {
#ifdef FP8T_HAVE_CUDA
  kernels::set_matmul_autotune(on);
#else
  (void)on;
#endif
}

}  // namespace fp8t
