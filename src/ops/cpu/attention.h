// CPU reference of the causal self-attention op (src/ops/attention.cpp): raw pointers, row-major,
// contiguous; instantiated for float and double. Backward ACCUMULATES (+=) into dqkv.
#pragma once

namespace fp8t::cpu {

// Causal attention. qkv (B, T, 3C) = [q | k | v], head h uses channels [h*HS, (h+1)*HS) of each.
// out (B, T, C); lse (B, NH, T) = log-sum-exp of each scaled score row (saved for backward).
template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, int B, int T, int C, int NH);
// dqkv (B, T, 3C) += the gradient for dout (B, T, C), the probabilities recomputed from lse
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse, int B, int T, int C,
                        int NH);

}  // namespace fp8t::cpu
