// CPU reference implementations of every op (raw pointers, row-major, contiguous).
// Instantiated for float (training, CUDA-kernel oracles) and double (finite-difference checks).
// Backward functions ACCUMULATE (+=) into every non-null gradient pointer.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// out (B, T, C) = wte[tokens] + wpe[t]
template <typename F>
void embedding_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C);
template <typename F>
void embedding_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C);

// out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N); bias may be null
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int64_t M, int64_t K, int64_t N);
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int64_t M,
                     int64_t K, int64_t N);

// Row-wise LayerNorm over C, eps 1e-5; mean and rstd (N) are saved for backward.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int64_t N, int64_t C);
template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int64_t N, int64_t C);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename F>
void gelu_forward(F* out, const F* inp, int64_t n);
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n);

// Causal attention. qkv (B, T, 3C) = [q | k | v], head h uses channels [h*HS, (h+1)*HS) of each.
// out (B, T, C); lse (B, NH, T) = log-sum-exp of each scaled score row (saved for backward).
template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, int B, int T, int C, int NH);
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse, int B, int T, int C,
                        int NH);

// Softmax cross-entropy over the first V of Vp columns. losses (BT) = -log p[target].
template <typename F>
void crossentropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t BT, int64_t V, int64_t Vp);
// dlogits (BT, Vp) += (softmax - onehot) * dlosses[row]; columns >= V get nothing.
template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const int32_t* targets, const F* dlosses, int64_t BT,
                           int64_t V, int64_t Vp);

}  // namespace fp8t::cpu
