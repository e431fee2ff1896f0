// CUDA launchers of the GELU op (defined in gelu_cuda.cpp, built with CUDA only; a build without it sees the
// declarations alone and never calls them). All bf16; backward ACCUMULATES. Launches go on the current compute
// stream.
#pragma once
#include "core/tensor.h"

namespace fp8t::cuda_ops {

// out = gelu(inp), tanh approximation, elementwise
void gelu_forward(Tensor& out, const Tensor& inp);
// dinp += gelu'(inp) * dout
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);

}  // namespace fp8t::cuda_ops
