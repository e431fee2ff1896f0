// FP8 encode and decode of single values as device functions, shared by the cast kernels
// (kernels/fp8_cast.cu) and the saved-activation kernels (kernels/fp8_saved.cu), so that both write
// and read the codes of the host codec (core/dtype.h) bit for bit.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "core/dtype.h"

namespace fp8t::kernels {

template <Fp8Format F>
inline constexpr uint32_t kNanCode = F == Fp8Format::e4m3 ? 0x7F : 0x7E;  // the host codec's NaN

template <Fp8Format F>
inline constexpr __nv_fp8_interpretation_t kFp8Interp = F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2;

// satfinite_rne(v) in format F, NaN -> the host codec's code.
template <Fp8Format F>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  // NaN gets the host codec's canonical code explicitly: the hardware keeps NaN payload/sign bits.
  if (isnan(v)) return kNanCode<F>;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kFp8Interp<F>));
}

// Two codes, a in the low byte. On sm_89+ one cvt.rn.satfinite.{e4m3,e5m2}x2.f32, the instruction the
// one-value __nv_cvt_float_to_fp8 issues with a zero in the other lane (lanes convert independently);
// before sm_89 it calls the one-value form twice. So each byte equals to_fp8<F> except for NaN.
template <Fp8Format F>
__device__ __forceinline__ uint32_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFp8Interp<F>);
}

// Eight values -> eight codes (v[j] in byte j % 4 of word j / 4) as the paired conversion gives them: to_fp8<F>(v[j])
// except where v[j] is NaN (the conversion keeps its sign and payload bits; fix_nan_codes replaces them).
template <Fp8Format F>
__device__ __forceinline__ void to_fp8x8_raw(const float (&v)[8], uint32_t (&w)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    w[h] = to_fp8x2<F>(v[4 * h], v[4 * h + 1]) | to_fp8x2<F>(v[4 * h + 2], v[4 * h + 3]) << 16;
}

// The host codec's NaN code wherever v[j] is NaN (w from to_fp8x8_raw).
template <Fp8Format F>
__device__ __forceinline__ void fix_nan_codes(const float (&v)[8], uint32_t (&w)[2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (isnan(v[j])) w[j / 4] = (w[j / 4] & ~(0xFFu << 8 * (j % 4))) | kNanCode<F> << 8 * (j % 4);
}

// Whether a code of the eight in w (to_fp8x8_raw's) is at the top of F's range (fp8_top_codes, core/dtype.h): every
// NaN code and every clamped value's are.
template <Fp8Format F>
__device__ __forceinline__ bool any_top_code(const uint32_t (&w)[2]) {
  return (fp8_top_codes(w[0], F) | fp8_top_codes(w[1], F)) != 0;
}

// Eight values -> eight codes (v[j] in byte j % 4 of word j / 4), each bit-exactly to_fp8<F>(v[j]): the
// paired conversion, then the canonical NaN code where the conversion kept another (rare: only when a code is
// at the top of the range, which every NaN code is).
template <Fp8Format F>
__device__ __forceinline__ uint2 to_fp8x8(const float (&v)[8]) {
  uint32_t w[2];
  to_fp8x8_raw<F>(v, w);
  if (any_top_code<F>(w)) fix_nan_codes<F>(v, w);
  return {w[0], w[1]};
}

// The value of a code, exact (every FP8 value is a half).
template <Fp8Format F>
__device__ __forceinline__ float from_fp8(uint8_t c) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, kFp8Interp<F>)));
}

// dequant(c) = bf16_rn(from_fp8(c) * scale_inv), the f32 product rounded once (as the host codec's
// f32 value rounded to bf16).
template <Fp8Format F>
__device__ __forceinline__ __nv_bfloat16 dequant_bf16(uint8_t c, float scale_inv) {
  return __float2bfloat16_rn(__fmul_rn(from_fp8<F>(c), scale_inv));
}

// Two codes (a in the low byte of `pair`) dequantized with one scale_inv: lane by lane dequant_bf16<F>, a in the
// low half. The codes convert together (on sm_89+ the one cvt.rn.f16x2 that from_fp8 issues per code), the
// products round together (cvt.rn.bf16x2.f32, lane for lane the rounding of __float2bfloat16_rn).
template <Fp8Format F>
__device__ __forceinline__ uint32_t dequant_bf16x2(uint16_t pair, float scale_inv) {
  const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, kFp8Interp<F>)));
  const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(v.x, scale_inv), __fmul_rn(v.y, scale_inv));
  return uint32_t{__bfloat16_as_ushort(b.x)} | uint32_t{__bfloat16_as_ushort(b.y)} << 16;
}

// Eight codes (code k in byte k % 4 of word k / 4 of `codes`) dequantized with one scale_inv, two per conversion
// (dequant_bf16x2): w[i] holds values 2i (low half) and 2i + 1.
template <Fp8Format F>
__device__ __forceinline__ void dequant_bf16x8(uint2 codes, float scale_inv, uint32_t (&w)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = dequant_bf16x2<F>(static_cast<uint16_t>((k < 2 ? codes.x : codes.y) >> 16 * (k % 2)), scale_inv);
}

}  // namespace fp8t::kernels
