// CUDA launchers of the linear op and the CUDA path of the fused MLP (defined in linear_cuda.cpp, built with
// CUDA only; a build without it sees the declarations alone and never calls them). Inputs and weights bf16,
// outputs bf16 or f32, weight and bias gradients f32 or bf16; backward ACCUMULATES into dbias, and into dweight
// unless told to overwrite it.
// Launches go on the current compute stream.
#pragma once
#include "autograd/variable.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace fp8t::cuda_ops {

// out (M, N) = inp (M, K) @ weight (N, K)^T + bias
void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
// dinp (+)= dout @ weight (overwritten when !accumulate_dinp); dweight (+)= dout^T @ inp (overwritten when
// !accumulate_dweight); dbias +=
void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, bool accumulate_dinp = true, bool accumulate_dweight = true);
// out (M, N) = gelu(inp @ weight^T + bias), pre (M, N) = the pre-GELU values (cuBLASLt epilogue)
void matmul_forward_gelu(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight, const Tensor& bias);
// dpre (M, K) = (dout (M, N) @ weight (N, K)) * gelu'(pre), overwritten (cuBLASLt epilogue)
void matmul_backward_dgelu(Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre);

}  // namespace fp8t::cuda_ops

namespace fp8t::detail {

// gelu_mlp (ops.h) on CUDA in BF16, the GELU in the GEMM epilogues; gelu_mlp checked that the shapes fit.
Var gelu_mlp_cuda(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2, LinearBias b2_at);

}  // namespace fp8t::detail
