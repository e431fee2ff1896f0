// CPU reference of the cross-entropy op (see cross_entropy.h), for float and double. Rows are spread over
// OpenMP threads; each row's softmax sum accumulates in double.
#include "ops/cpu/cross_entropy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

namespace fp8t::cpu {

namespace {

// The softmax over a 50304-wide row is as costly as the lm_head matmul unless exp vectorises, so
// float rows use a Cephes-style polynomial exp (within 2 ulp of expf) that the compiler turns into
// AVX2 code; double rows (gradient checks) keep std::exp.
#if defined(__x86_64__) && defined(__GNUC__)
#define FP8T_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FP8T_CLONES
#endif

// e^x for x <= 0. Below about -87.3 the result flushes to 0 (a softmax sum >= 1 cannot notice);
// the clamp is on the integer exponent because a float select would keep the loop from vectorising.
inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  // n = round(x / ln2) by the 1.5 * 2^23 trick (branch-free); x = n ln2 + r with |r| <= ln2 / 2.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  // Clamped before the conversion (a NaN or a float below INT32_MIN would make it undefined, UBSan):
  // 2^-127 -> bit pattern 0 -> result 0; a NaN x keeps e NaN, so the result stays NaN.
  const int32_t ni = static_cast<int32_t>(std::fmax(n, -127.0f));
  return e * std::bit_cast<float>((ni + 127) << 23);
}

FP8T_CLONES void row_stats_f32(const float* x, int64_t V, float* mx_out, double* sum_out) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < V; ++i) sum += exp_nonpositive(x[i] - mx);
  *mx_out = mx;
  *sum_out = sum;
}

FP8T_CLONES void row_grad_f32(float* g, const float* x, int64_t V, float mx, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) g[i] += exp_nonpositive(x[i] - mx) * scale;
}

// Max and sum(exp(x - max)) over the first V entries of a logits row.
template <typename F>
void row_stats(const F* x, int64_t V, F& mx, double& sum) {
  if constexpr (std::is_same_v<F, float>) {
    row_stats_f32(x, V, &mx, &sum);
  } else {
    mx = -INFINITY;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, x[i]);
    sum = 0.0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - mx);
  }
}

// g[i] += exp(x[i] - mx) * scale over the first V entries.
template <typename F>
void row_grad(F* g, const F* x, int64_t V, F mx, F scale) {
  if constexpr (std::is_same_v<F, float>) {
    row_grad_f32(g, x, V, mx, scale);
  } else {
    for (int64_t i = 0; i < V; ++i) g[i] += std::exp(x[i] - mx) * scale;
  }
}

}  // namespace

template <typename F>
void cross_entropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t BT, int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BT; ++r) {
    const F* x = logits + r * Vp;
    F mx;
    double sum;
    row_stats(x, V, mx, sum);
    losses[r] = static_cast<F>(std::log(sum) + double(mx) - double(x[targets[r]]));
  }
}

template <typename F>
void cross_entropy_backward(F* dlogits, const F* logits, const int32_t* targets, const F* dlosses, int64_t BT,
                            int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BT; ++r) {
    const F* x = logits + r * Vp;
    F* g = dlogits + r * Vp;
    F mx;
    double sum;
    row_stats(x, V, mx, sum);
    const F dl = dlosses[r];
    row_grad(g, x, V, mx, static_cast<F>(double(dl) / sum));
    g[targets[r]] -= dl;
  }
}

#define FP8T_INSTANTIATE(F)                                                                                  \
  template void cross_entropy_forward<F>(F*, const F*, const int32_t*, int64_t, int64_t, int64_t);          \
  template void cross_entropy_backward<F>(F*, const F*, const int32_t*, const F*, int64_t, int64_t, int64_t);

FP8T_INSTANTIATE(float)
FP8T_INSTANTIATE(double)
#undef FP8T_INSTANTIATE

}  // namespace fp8t::cpu
