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

// d gelu / dx, spelled with _rn intrinsics for the same reason as gelu(): the ones nvcc 13 chose for
// the plain expression 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u),
// so the GELU backward kernel keeps its values and the FP8 cast's dgelu prologue computes the same bits.
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = __fmul_rn(kGeluScale, __fmaf_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x, x));
  const float t = tanhf(u);
  const float sech2 = __fsub_rn(1.0f, __fmul_rn(t, t));
  const float slope = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech2), kGeluScale);
  const float poly = __fmaf_rn(__fmul_rn(3.0f * kGeluCubic, x), x, 1.0f);
  return __fmaf_rn(__fadd_rn(1.0f, t), 0.5f, __fmul_rn(poly, slope));
}

// The GELU backward of one element: acc + gelu'(x) * d in one rounding (what the GELU backward kernel
// adds into its gradient acc; the dgelu prologue passes acc = +0, a zero-filled gradient, so a zero
// product gives +0 there too).
__device__ __forceinline__ float gelu_backward_value(float acc, float x, float d) {
  return __fmaf_rn(d, gelu_grad(x), acc);
}

}  // namespace fp8t::kernels
