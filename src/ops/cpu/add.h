// CPU reference of the add op (src/ops/add.cpp): raw pointers, contiguous; instantiated for float and
// double. The backward pass needs no kernel: d(a) and d(b) are d(out).
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// out (n) = a + b (out may alias a or b); with b_bias (C values, C dividing n): a + (b + b_bias[i % C])
template <typename F>
void add_forward(F* out, const F* a, const F* b, int64_t n, const F* b_bias = nullptr, int64_t C = 0);

}  // namespace fp8t::cpu
