// CPU reference of the cross-entropy op (src/ops/cross_entropy.cpp): raw pointers, row-major, contiguous;
// instantiated for float and double. Backward ACCUMULATES (+=) into dlogits.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// Softmax cross-entropy over the first V of Vp columns of logits (BT, Vp). losses (BT) = -log p[target].
template <typename F>
void cross_entropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t BT, int64_t V, int64_t Vp);
// dlogits (BT, Vp) += (softmax - onehot) * dlosses[row]; columns >= V get nothing.
template <typename F>
void cross_entropy_backward(F* dlogits, const F* logits, const int32_t* targets, const F* dlosses, int64_t BT,
                            int64_t V, int64_t Vp);

}  // namespace fp8t::cpu
