// The CPU matmul core shared by matmul_forward/backward: C (M, N) += A (M, K) @ B (K, N) for
// operands given by element strides, so all three products of a linear run on one packed kernel.
#pragma once
#include <cstdint>

namespace fp8t::cpu {

// A read-only matrix given by its element strides: element (r, c) is p[r * rs + c * cs].
template <typename F>
struct StridedMat {
  const F* p;
  int64_t rs, cs;
};

// C (M, N), row stride ldc, += A (M, K) @ B (K, N). Threads split C into blocks (OpenMP).
template <typename F>
void gemm_accumulate(F* C, int64_t ldc, StridedMat<F> A, StridedMat<F> B, int64_t M, int64_t N, int64_t K);

}  // namespace fp8t::cpu
