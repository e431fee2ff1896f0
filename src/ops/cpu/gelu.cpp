// CPU reference of the GELU op (see gelu.h), for float and double.
#include "ops/cpu/gelu.h"

#include <cmath>

namespace fp8t::cpu {
namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <typename F>
void gelu_forward(F* out, const F* inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F u = F(kSqrt2OverPi) * (x + F(kGeluCubic) * x * x * x);
    out[i] = F(0.5) * x * (F(1) + std::tanh(u));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F u = F(kSqrt2OverPi) * (x + F(kGeluCubic) * x * x * x);
    const F th = std::tanh(u);
    const F sech2 = F(1) - th * th;
    const F du = F(kSqrt2OverPi) * (F(1) + F(3 * kGeluCubic) * x * x);
    dinp[i] += dout[i] * (F(0.5) * (F(1) + th) + F(0.5) * x * sech2 * du);
  }
}

#define FP8T_INSTANTIATE(F)                                  \
  template void gelu_forward<F>(F*, const F*, int64_t); \
  template void gelu_backward<F>(F*, const F*, const F*, int64_t);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
