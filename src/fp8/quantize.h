// Host FP8 quantization, bit-exact with the CUDA cast kernels: code = satfinite_rne(x * scale) in the
// tensor's format, the product taken in f32. Also the amax of the unscaled input (NaN-propagating,
// so a NaN anywhere shows up in the amax; the device amax kernel must do the same, fmaxf would
// drop it) and the number of values that saturated (|x * scale| > fmax). Tensor-level quantization of every
// scale layout: fp8/quantized_tensor.h.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace fp8t {

struct Fp8CastStats {
  float amax = 0.0f;       // max |x| of the unscaled input; NaN if any x is NaN
  int64_t saturated = 0;   // values with |x * scale| > fmax (infinities included, NaN not)
};

// max |x[i]|, NaN if any element is NaN.
float fp8_amax(const float* x, int64_t n);
// codes[i] = float_to_fp8(x[i] * scale, f); returns the amax of x and the saturation count.
Fp8CastStats fp8_quantize(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* codes);
// out[i] = fp8_to_float(codes[i], f) * scale_inv
void fp8_dequantize(const uint8_t* codes, int64_t n, float scale_inv, Fp8Format f, float* out);

inline DType fp8_dtype(Fp8Format f) { return f == Fp8Format::e4m3 ? DType::e4m3 : DType::e5m2; }

}  // namespace fp8t
