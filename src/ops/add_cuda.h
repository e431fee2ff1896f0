// CUDA launcher of the add op (defined in add_cuda.cpp, built with CUDA only; a build without it sees the
// declaration alone and never calls it). All bf16; the launch goes on the current compute stream.
#pragma once
#include "core/tensor.h"

namespace fp8t::cuda_ops {

// out = a + b, same number of elements (out may alias a or b)
void add_forward(Tensor& out, const Tensor& a, const Tensor& b);
// The same over rows of out's last dimension C (out must not alias a or b), with the LayerNorm statistics of out's
// rows into mean and rstd (f32, one per row).
void add_forward_row_stats(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b);

}  // namespace fp8t::cuda_ops
