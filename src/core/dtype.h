// DType (f32, f64, bf16, e4m3, e5m2) and the exact host codecs for BF16 and OCP FP8.
// The FP8 casts round to nearest even and saturate to +-max (CUDA's __NV_SATFINITE); NaN stays NaN.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fp8t {

// f64 exists for finite-difference gradient checks on the CPU; training uses f32/bf16/fp8.
// i32 holds token ids and targets.
enum class DType : uint8_t { f32, f64, bf16, e4m3, e5m2, i32 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::e4m3:
    case DType::e5m2: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // throws Error on unknown names

// ---- BF16: the upper 16 bits of an IEEE float, rounded to nearest even.
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t b);

// ---- FP8 (OCP): E4M3 has no infinities (max 448, NaN = S.1111.111); E5M2 is IEEE-like (max 57344).
enum class Fp8Format : uint8_t { e4m3, e5m2 };
constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }
uint8_t float_to_fp8(float x, Fp8Format f);  // round-to-nearest-even, saturating, NaN -> NaN
float fp8_to_float(uint8_t code, Fp8Format f);
// Bit 7 of each byte of w (four FP8 codes) whose magnitude is at or above the format's largest finite code (E4M3
// 0x7E, E5M2 0x7B), every other bit clear: per byte, magnitude + (0x80 - largest) reaches bit 7 exactly then and never
// carries into the next byte. A saturating cast gives such a code to every value it clamps (|x| > max) and to every
// NaN, so the FP8 cast kernels take their exact per-element statistics only for groups with one
// (kernels/fp8_cast_common.cuh); values that round to +-max without clamping take it too.
constexpr uint32_t fp8_top_codes(uint32_t w, Fp8Format f) {
  const uint32_t largest = f == Fp8Format::e4m3 ? 0x7Eu : 0x7Bu;
  return ((w & 0x7F7F7F7Fu) + (0x80u - largest) * 0x01010101u) & 0x80808080u;
}
inline Fp8Format fp8_format_of(DType t) { return t == DType::e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2; }
inline bool is_fp8_dtype(DType t) { return t == DType::e4m3 || t == DType::e5m2; }

// ---- How AdamW stores its moments (optim.state_dtype): fp32 both; bf16 both; fp8: the first moment E4M3 in
// scaled blocks, the second bf16 (core/adamw_math.h).
enum class StateDtype { fp32, bf16, fp8 };

// How an FP8 tensor's scales cover its codes (rows = the leading dimensions, cols = the last one): one scale,
// one per row, one per 1x128 block of a row, one per 128x128 tile. Shared by the quantized tensor
// (fp8/quantized_tensor.h) and the GEMM operands (kernels/matmul.cuh).
enum class ScaleLayout : uint8_t { per_tensor, per_row, block_1x128, block_128x128 };

}  // namespace fp8t
