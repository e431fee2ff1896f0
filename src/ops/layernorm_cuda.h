// CUDA launchers of the LayerNorm op (defined in layernorm_cuda.cpp, built with CUDA only; a build without it
// sees the declarations alone and never calls them). Activations and weights bf16, statistics f32, weight
// gradients f32; backward ACCUMULATES. Launches go on the current compute stream.
#pragma once
#include "core/tensor.h"

namespace fp8t::cuda_ops {

// out (..., C) = LayerNorm(inp) * w + b, eps 1e-5; mean, rstd (N rows) saved for backward
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w,
                       const Tensor& b);
// dinp (..., C), dw, db (C) += the gradients for dout (..., C)
void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd);

}  // namespace fp8t::cuda_ops
