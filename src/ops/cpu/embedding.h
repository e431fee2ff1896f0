// CPU reference of the embedding op (src/ops/embedding.cpp): raw pointers, row-major, contiguous;
// instantiated for float and double. Backward ACCUMULATES (+=) into every non-null gradient pointer.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// out (B, T, C) = wte[tokens] + wpe[t]
template <typename F>
void embedding_forward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C);
// dwte (Vp, C), dwpe (maxT, C) += the rows of dout (B, T, C) that each token and position fed; either may be null
template <typename F>
void embedding_backward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C);

}  // namespace fp8t::cpu
