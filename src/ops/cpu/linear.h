// CPU reference of the linear op (src/ops/linear.cpp), on the packed GEMM of cpu/gemm.h: raw pointers,
// row-major, contiguous; instantiated for float and double. Backward ACCUMULATES (+=) into every non-null
// gradient pointer.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N); bias may be null
template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int64_t M, int64_t K, int64_t N);
// dinp (M, K) += dout @ weight; dweight (N, K) += dout^T @ inp; dbias (N) += column sums of dout (M, N)
template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int64_t M,
                     int64_t K, int64_t N);

}  // namespace fp8t::cpu
