// Host BF16/FP8 codecs: exact round trips, round-to-nearest-even, saturation, NaN.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

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

TEST_CASE("fp8_top_codes marks exactly the codes at or above the largest finite one, byte by byte", "[core][fp8]") {
  // Hand-worked: E4M3's largest finite code is 0x7E (448), 0x7F its NaN; E5M2's is 0x7B (57344), 0x7C infinity,
  // 0x7D-0x7F NaNs; the sign bit does not matter.
  CHECK(fp8_top_codes(0x7E7D0000u, Fp8Format::e4m3) == 0x80000000u);
  CHECK(fp8_top_codes(0x00FF7F01u, Fp8Format::e4m3) == 0x00808000u);
  CHECK(fp8_top_codes(0x7A7B7CFDu, Fp8Format::e5m2) == 0x00808080u);
  CHECK(fp8_top_codes(0x00000000u, Fp8Format::e5m2) == 0u);
  // Every code in every byte position, beside neighbours that are at the top or not (no carry between bytes), against
  // the host codec: at the top means NaN, infinite, or +-max.
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (uint32_t c = 0; c < 256; ++c) {
      const float v = fp8_to_float(static_cast<uint8_t>(c), f);
      const bool top = std::isnan(v) || std::isinf(v) || std::fabs(v) == fp8_max(f);
      for (uint32_t fill : {0x00u, 0x7Fu, 0xFFu, 0x7Au}) {
        for (int k = 0; k < 4; ++k) {
          uint32_t w = fill * 0x01010101u;
          w = (w & ~(0xFFu << 8 * k)) | c << 8 * k;
          const uint32_t got = fp8_top_codes(w, f);
          INFO("format " << static_cast<int>(f) << " code " << c << " fill " << fill << " byte " << k);
          CHECK(((got >> (8 * k + 7)) & 1u) == (top ? 1u : 0u));
          CHECK((got & ~0x80808080u) == 0u);
          const uint32_t fill_top = fp8_top_codes(fill * 0x01010101u, f) & 0x80u;
          for (int j = 0; j < 4; ++j)
            if (j != k) CHECK(((got >> 8 * j) & 0x80u) == fill_top);
        }
      }
    }
  }
  // What the cast kernels rely on: a clamped value (|x| > max) and a NaN always encode to a top code.
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const float mx = fp8_max(f);
    for (float x : {std::nextafter(mx, INFINITY), 2.0f * mx, 1e30f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
      for (float sx : {x, -x}) {
        INFO("format " << static_cast<int>(f) << " value " << sx);
        CHECK(fp8_top_codes(float_to_fp8(sx, f), f) != 0u);
      }
    }
    // Just below the second largest finite value: not at the top.
    const float below = std::nextafter(fp8_to_float(f == Fp8Format::e4m3 ? 0x7D : 0x7A, f), 0.0f);
    CHECK(fp8_top_codes(float_to_fp8(below, f), f) == 0u);
  }
}
