// Host codecs for BF16 and FP8, bit-exact with CUDA's cuda_bf16.h / cuda_fp8.h conversions.
#include "core/dtype.h"

#include <bit>
#include <cmath>

#include "core/check.h"

namespace fp8t {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::i32: return "i32";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::e4m3, DType::e5m2, DType::i32})
    if (dtype_name(t) == name) return t;
  FP8T_FAIL("unknown dtype '{}': expected f32, f64, bf16, e4m3, e5m2 or i32", name);
}

uint16_t float_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep sign, force quiet
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

namespace {
struct Fp8Layout {
  int mbits, bias;
  float max;
};
constexpr Fp8Layout layout(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Fp8Layout{3, 7, 448.0f} : Fp8Layout{2, 15, 57344.0f};
}
}  // namespace

uint8_t float_to_fp8(float x, Fp8Format f) {
  const Fp8Layout L = layout(f);
  if (std::isnan(x)) return f == Fp8Format::e4m3 ? 0x7F : 0x7E;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  if (std::isinf(a)) a = L.max;  // satfinite: infinities become +-max, as PTX cvt.satfinite does
  // Quantum at a's binade (or the subnormal quantum); rint rounds half to even.
  const int min_exp = 1 - L.bias;
  int e = std::ilogb(a);
  if (e < min_exp) e = min_exp;
  const double q = std::ldexp(1.0, e - L.mbits);
  double r = std::nearbyint(a / q) * q;
  if (r > L.max) r = L.max;  // saturate (also maps +-inf to +-max)
  if (r == 0.0) return sign;
  int re = std::ilogb(r);
  uint32_t exp_field, mant;
  if (re < min_exp) {  // subnormal
    exp_field = 0;
    mant = static_cast<uint32_t>(r / std::ldexp(1.0, min_exp - L.mbits));
  } else {
    exp_field = static_cast<uint32_t>(re + L.bias);
    mant = static_cast<uint32_t>((r / std::ldexp(1.0, re) - 1.0) * (1 << L.mbits));
  }
  return static_cast<uint8_t>(sign | (exp_field << L.mbits) | mant);
}

float fp8_to_float(uint8_t code, Fp8Format f) {
  const Fp8Layout L = layout(f);
  const bool neg = code & 0x80;
  const uint32_t exp_field = (code & 0x7F) >> L.mbits;
  const uint32_t mant = code & ((1u << L.mbits) - 1);
  const uint32_t exp_max = (1u << (7 - L.mbits)) - 1;
  float v;
  if (f == Fp8Format::e4m3 && exp_field == exp_max && mant == 7) {
    v = NAN;
  } else if (f == Fp8Format::e5m2 && exp_field == exp_max) {
    v = mant == 0 ? INFINITY : NAN;
  } else if (exp_field == 0) {
    v = std::ldexp(static_cast<float>(mant), 1 - L.bias - L.mbits);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mant) / (1 << L.mbits), static_cast<int>(exp_field) - L.bias);
  }
  return neg ? -v : v;
}

}  // namespace fp8t
