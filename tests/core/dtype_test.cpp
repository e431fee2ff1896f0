// Host BF16/FP8 codecs: exact round trips, round-to-nearest-even, saturation, NaN.
#include <catch2/catch_test_macros.hpp>
#include <cmath>

#include "core/dtype.h"

using namespace fp8t;

TEST_CASE("every FP8 code decodes and re-encodes to itself", "[core][fp8]") {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), f);
      const uint8_t back = float_to_fp8(v, f);
      if (std::isnan(v)) {
        CHECK(std::isnan(fp8_to_float(back, f)));
      } else if (std::isinf(v)) {
        // E5M2 infinities saturate to +-max under satfinite conversion.
        CHECK(fp8_to_float(back, f) == std::copysign(fp8_max(f), v));
      } else {
        CHECK(back == c);
      }
    }
  }
}

TEST_CASE("FP8 known values - rounding and saturation", "[core][fp8]") {
  CHECK(fp8_to_float(0x7E, Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_to_float(0x7B, Fp8Format::e5m2) == 57344.0f);
  CHECK(fp8_to_float(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));   // smallest subnormal
  CHECK(fp8_to_float(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
  CHECK(float_to_fp8(1000.0f, Fp8Format::e4m3) == 0x7E);
  CHECK(float_to_fp8(-1e9f, Fp8Format::e4m3) == 0xFE);
  CHECK(float_to_fp8(INFINITY, Fp8Format::e5m2) == 0x7B);
  CHECK(std::isnan(fp8_to_float(float_to_fp8(NAN, Fp8Format::e4m3), Fp8Format::e4m3)));
  CHECK(std::isnan(fp8_to_float(float_to_fp8(NAN, Fp8Format::e5m2), Fp8Format::e5m2)));
  // Ties to even: 1.0625 lies halfway between 1.0 (mantissa 000) and 1.125 (001) in E4M3.
  CHECK(fp8_to_float(float_to_fp8(1.0625f, Fp8Format::e4m3), Fp8Format::e4m3) == 1.0f);
  CHECK(fp8_to_float(float_to_fp8(1.1875f, Fp8Format::e4m3), Fp8Format::e4m3) == 1.25f);
  // Halfway between the two smallest E4M3 subnormals rounds to the even one (0).
  CHECK(float_to_fp8(std::ldexp(1.0f, -10), Fp8Format::e4m3) == 0x00);
  CHECK(float_to_fp8(-0.0f, Fp8Format::e4m3) == 0x80);
}

TEST_CASE("FP8 encode is the nearest code", "[core][fp8]") {
  // Brute force against a search over all finite codes on many values.
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (int i = -20000; i <= 20000; ++i) {
      const float x = std::ldexp(static_cast<float>(i), -8) * (f == Fp8Format::e4m3 ? 1.0f : 64.0f);
      const float got = fp8_to_float(float_to_fp8(x, f), f);
      float best_err = INFINITY;
      for (int c = 0; c < 256; ++c) {
        const float v = fp8_to_float(static_cast<uint8_t>(c), f);
        if (std::isfinite(v)) best_err = std::min(best_err, std::fabs(v - x));
      }
      REQUIRE(std::fabs(got - x) == best_err);
    }
  }
}

TEST_CASE("BF16 round trip and rounding", "[core][bf16]") {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float v = bf16_to_float(static_cast<uint16_t>(c));
    if (std::isnan(v)) continue;
    REQUIRE(float_to_bf16(v) == c);
  }
  CHECK(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);  // tie to even
  CHECK(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}
