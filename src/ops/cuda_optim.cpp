// CUDA optimizer entry point: AdamW over a flat range (the gradient sum of squares is core/tensor_ops.h).
#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_optim.h"

#include "core/tensor.h"
#include "kernels/adamw.cuh"
#include "kernels/stream.cuh"

namespace fp8t::cuda_ops {

void adamw(const AdamWBuffers& b, const AdamWHyper& h) { kernels::adamw_update(b, h, kernels::compute_stream()); }

}  // namespace fp8t::cuda_ops
#endif
