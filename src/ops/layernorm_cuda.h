// CUDA launchers of the LayerNorm op (defined in layernorm_cuda.cpp, built with CUDA only; a build without it
// sees the declarations alone and never calls them). Activations and weights bf16, statistics f32, weight
// gradients f32; backward ACCUMULATES. Launches go on the current compute stream.
#pragma once
#include <memory>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace fp8t::cuda_ops {

// out (..., C) = LayerNorm(inp) * w + b, eps 1e-5; mean, rstd (N rows) saved for backward
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w,
                       const Tensor& b);
// dinp (..., C), dw, db (C) += the gradients for dout (..., C)
void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd);

// layernorm_backward, and where `residual` (residual_dy_cell of inp's Var; empty: none) names a cell that asks for
// dy codes (fp8_dy), holds no gradient yet and the kernel can write them (not under a FiniteWatch, which reads every
// gradient as written): dinp's new values also as those E5M2 codes, with the cast's statistics, left in that cell as
// its pending gradient (materialize gives dinp itself: the cell's gradient is the sum's). Where the cell asks for
// column sums instead (dy_colsum_request, a BF16 linear), those of dinp's new values into its dy_colsum. True when
// it did either.
bool layernorm_backward_residual(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                                 const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                 const std::weak_ptr<GradCell>& residual);

}  // namespace fp8t::cuda_ops
