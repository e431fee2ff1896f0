// CUDA launchers of the embedding op (defined in embedding_cuda.cpp, built with CUDA only; a build without it
// sees the declarations alone and never calls them). Tokens i32, embeddings bf16, their gradients f32 views of
// the flat gradient buffer; backward ACCUMULATES. Launches go on the current compute stream.
#pragma once
#include "core/tensor.h"

namespace fp8t::cuda_ops {

// out (B, T, C) = wte[tokens] + wpe[t]; tokens (B, T), wte (Vp, C), wpe (maxT >= T, C)
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
// dwte (Vp, C), dwpe (maxT, C) += the rows of dout (B, T, C) that each token and position fed
void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);

}  // namespace fp8t::cuda_ops
