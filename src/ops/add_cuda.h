// CUDA launcher of the add op (defined in add_cuda.cpp, built with CUDA only; a build without it sees the
// declaration alone and never calls it). All bf16; the launch goes on the current compute stream.
#pragma once
#include "core/tensor.h"

namespace fp8t {
struct Fp8LnCastAhead;  // ops/fp8_linear.h
}  // namespace fp8t

namespace fp8t::cuda_ops {

// out = a + b, same number of elements (out may alias a or b). With b_bias (out's last dimension C, bf16): out = a +
// (b + b_bias) per row, in f32 and rounded once (ops.h: add), here and in add_forward_row_stats.
void add_forward(Tensor& out, const Tensor& a, const Tensor& b, const Tensor* b_bias = nullptr);
// The same over rows of out's last dimension C (out must not alias a or b), with the LayerNorm statistics of out's
// rows into mean and rstd (f32, one per row). With `ahead` (fp8_ln_cast_ahead), the same pass also writes
// ahead->codes: its linear's input codes, out's LayerNorm (ahead's ln_w, ln_b) cast with the linear's input scale
// and, while a tape records, into its statistics (kernels/layernorm.cuh, add_layernorm_cast). With `normed` instead
// (and norm_w, norm_b), it writes out's LayerNorm output there: layernorm_forward's bits (add_layernorm_forward).
void add_forward_row_stats(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           Fp8LnCastAhead* ahead = nullptr, Tensor* normed = nullptr, const Tensor* norm_w = nullptr,
                           const Tensor* norm_b = nullptr, const Tensor* b_bias = nullptr);

}  // namespace fp8t::cuda_ops
