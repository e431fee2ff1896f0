// CPU reference of the GELU op (src/ops/gelu.cpp): raw pointers, contiguous; instantiated for float and
// double. Backward ACCUMULATES (+=) into dinp.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), over n elements
template <typename F>
void gelu_forward(F* out, const F* inp, int64_t n);
// dinp (n) += dout * gelu'(inp)
template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n);

}  // namespace fp8t::cpu
