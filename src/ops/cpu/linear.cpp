// CPU reference of the linear op (see linear.h), for float and double. The products go through cpu/gemm.h,
// a packed, register-tiled kernel, because the lm_head dominates CPU training time.
#include "ops/cpu/linear.h"

#include <algorithm>
#include <vector>

#include <omp.h>

#include "ops/cpu/gemm.h"

namespace fp8t::cpu {

template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int64_t M, int64_t K, int64_t N) {
  // out (M, N) starts as the bias, then accumulates inp (M, K) @ weight (N, K)^T.
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    F* o = out + m * N;
    if (bias) std::copy(bias, bias + N, o);
    else std::fill(o, o + N, F(0));
  }
  gemm_accumulate<F>(out, N, StridedMat<F>{inp, K, 1}, StridedMat<F>{weight, 1, K}, M, N, K);
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight, int64_t M,
                     int64_t K, int64_t N) {
  // dinp (M, K) += dout (M, N) @ weight (N, K)
  if (dinp) gemm_accumulate<F>(dinp, K, StridedMat<F>{dout, N, 1}, StridedMat<F>{weight, K, 1}, M, K, N);
  // dweight (N, K) += dout^T (N, M) @ inp (M, K)
  if (dweight) gemm_accumulate<F>(dweight, K, StridedMat<F>{dout, 1, N}, StridedMat<F>{inp, K, 1}, N, K, M);
  if (dbias) {
    // Column sums of dout, each thread owning a range of columns; the sums accumulate in double.
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t n0 = N * id / nt, n1 = N * (id + 1) / nt;
      std::vector<double> acc(static_cast<size_t>(n1 - n0), 0.0);
      for (int64_t m = 0; m < M; ++m) {
        const F* d = dout + m * N;
        for (int64_t n = n0; n < n1; ++n) acc[n - n0] += d[n];
      }
      for (int64_t n = n0; n < n1; ++n) dbias[n] += static_cast<F>(acc[n - n0]);
    }
  }
}

#define FP8T_INSTANTIATE(F)                                                                    \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int64_t, int64_t, int64_t); \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, int64_t, int64_t, int64_t);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
