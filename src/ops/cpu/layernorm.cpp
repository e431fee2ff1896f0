// CPU reference of the LayerNorm op (see layernorm.h), for float and double. Rows are spread over OpenMP
// threads; the row statistics and the weight and bias gradients accumulate in double.
#include "ops/cpu/layernorm.h"

#include <cmath>
#include <vector>

#include <omp.h>

namespace fp8t::cpu {

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int64_t N, int64_t C) {
  constexpr double eps = 1e-5;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const F* x = inp + i * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    double v = 0.0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const double r = 1.0 / std::sqrt(v / C + eps);
    F* o = out + i * C;
    for (int64_t c = 0; c < C; ++c) o[c] = static_cast<F>((x[c] - m) * r * w[c] + b[c]);
    mean[i] = static_cast<F>(m);
    rstd[i] = static_cast<F>(r);
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int64_t N, int64_t C) {
  // dw and db are sums over rows: each thread sums its own rows into its slice of `partial`
  // (nt, 2, C), then the slices are added in thread order, so results are bitwise reproducible.
  std::vector<double> partial;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
#pragma omp single
    partial.assign(static_cast<size_t>(nt) * 2 * C, 0.0);
    double* pdw = partial.data() + static_cast<size_t>(id) * 2 * C;
    double* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const F* x = inp + i * C;
      const F* d = dout + i * C;
      const double m = mean[i], r = rstd[i];
      double sum_dn = 0.0, sum_dn_n = 0.0;  // sum(dnorm), sum(dnorm * norm)
      for (int64_t c = 0; c < C; ++c) {
        const double norm = (x[c] - m) * r;
        const double dn = double(d[c]) * w[c];
        sum_dn += dn;
        sum_dn_n += dn * norm;
        pdw[c] += double(d[c]) * norm;
        pdb[c] += d[c];
      }
      if (dinp) {
        const double mdn = sum_dn / C, mdnn = sum_dn_n / C;
        F* g = dinp + i * C;
        for (int64_t c = 0; c < C; ++c) {
          const double norm = (x[c] - m) * r;
          g[c] += static_cast<F>(r * (double(d[c]) * w[c] - mdn - norm * mdnn));
        }
      }
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      double sw = 0.0, sb = 0.0;
      for (int t = 0; t < nt; ++t) {
        sw += partial[static_cast<size_t>(t) * 2 * C + c];
        sb += partial[static_cast<size_t>(t) * 2 * C + C + c];
      }
      if (dw) dw[c] += static_cast<F>(sw);
      if (db) db[c] += static_cast<F>(sb);
    }
  }
}

#define FP8T_INSTANTIATE(F)                                                                                 \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int64_t, int64_t);           \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, int64_t, \
                                      int64_t);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
