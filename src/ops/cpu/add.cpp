// CPU reference of the add op (see add.h), for float and double.
#include "ops/cpu/add.h"

namespace fp8t::cpu {

template <typename F>
void add_forward(F* out, const F* a, const F* b, int64_t n, const F* b_bias, int64_t C) {
  if (!b_bias) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
    return;
  }
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + (b[i] + b_bias[i % C]);
}

template void add_forward<float>(float*, const float*, const float*, int64_t, const float*, int64_t);
template void add_forward<double>(double*, const double*, const double*, int64_t, const double*, int64_t);

}  // namespace fp8t::cpu
