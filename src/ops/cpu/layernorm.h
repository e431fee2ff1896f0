// CPU reference of the LayerNorm op (src/ops/layernorm.cpp): raw pointers, row-major, contiguous;
// instantiated for float and double. Backward ACCUMULATES (+=) into every non-null gradient pointer.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// Row-wise LayerNorm over C, eps 1e-5: out (N, C); mean and rstd (N) are saved for backward.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int64_t N, int64_t C);
// dinp (N, C), dw, db (C) += the gradients for dout (N, C); dinp, dw and db may each be null.
template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int64_t N, int64_t C);

}  // namespace fp8t::cpu
