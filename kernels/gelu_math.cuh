// The GELU (tanh approximation) of one f32 value and its derivative, as device functions shared by
// the GELU kernels (kernels/gelu.cu) and the FP8 cast's GELU prologue (kernels/fp8_cast.cu): the fused
// GELU -> FP8 cast must produce bit for bit the codes of the GELU kernel followed by the plain cast.
#pragma once
#include <cuda_runtime.h>

namespace fp8t::kernels {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCubic = 0.044715f;

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The arithmetic is spelled with _rn intrinsics,
// which the compiler may not contract or reassociate, so every kernel that inlines this computes the
// same bits (plain f32 * and + leave fma contraction to each call site). The intrinsics are the ones
// nvcc 13 chose for the plain expression (x^3 term: fma(0.044715 x * x, x, x)), so the values match
// the GELU kernel before this header. gelu(0) = +0, so zero padding stays zero.
__device__ __forceinline__ float gelu(float x) {
  const float u = __fmul_rn(kGeluScale, __fmaf_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x, x));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(u)));
}

// d gelu / dx; only the GELU backward kernel uses it.
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float t = tanhf(u);
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

}  // namespace fp8t::kernels
