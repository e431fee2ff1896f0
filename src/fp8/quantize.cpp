// Host FP8 quantize / dequantize with amax and saturation counting.
#include "fp8/quantize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace fp8t {

namespace {

// Runs over large tensors once per micro-batch: spread over OpenMP threads above this size.
constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

float fp8_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  bool nan = false;
#pragma omp parallel for schedule(static) reduction(max : amax) reduction(|| : nan) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) nan = true;
    else amax = std::max(amax, a);
  }
  return nan ? NAN : amax;
}

Fp8CastStats fp8_quantize(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* codes) {
  const float fmax = fp8_max(f);
  float amax = 0.0f;
  bool nan = false;
  int64_t saturated = 0;
#pragma omp parallel for schedule(static) reduction(max : amax) reduction(|| : nan) reduction(+ : saturated) \
    if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) nan = true;
    else amax = std::max(amax, a);
    const float v = x[i] * scale;  // f32 product, as the cast kernel computes it
    if (std::fabs(v) > fmax) ++saturated;
    codes[i] = float_to_fp8(v, f);
  }
  return {nan ? NAN : amax, saturated};
}

void fp8_dequantize(const uint8_t* codes, int64_t n, float scale_inv, Fp8Format f, float* out) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = fp8_to_float(codes[i], f) * scale_inv;
}

}  // namespace fp8t
