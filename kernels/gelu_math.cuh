// The GELU (tanh approximation) of one f32 value and its derivative, as device functions shared by
// the GELU kernels (kernels/gelu.cu) and the FP8 cast's GELU prologue (kernels/fp8_cast.cu): the fused
// GELU -> FP8 cast must produce bit for bit the codes of the GELU kernel followed by the plain cast.
#pragma once
#include <cuda_runtime.h>

#include "kernels/fast_math.cuh"

namespace fp8t::kernels {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCubic = 0.044715f;

// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), written as x sigmoid(2u) = x / (1 + exp(-2u))
// (1 + tanh(u) = 2 sigmoid(2u)): one fast exp and one fast divide instead of tanhf, whose range split and
// polynomial kept the FP8 cast with the GELU prologue compute-bound (at 1.5B's fc2 input: 167.6 -> 138.2
// us with this form, docs/perf-notes.md). The sigmoid form has no cancellation for
// negative x (1 + tanh(u) does), so it is also closer to the exact GELU: within 5.2e-7 absolute of it in
// double precision over [-12, 12] (host emulation with correctly rounded exp; the device's ex2.approx and
// div.approx add a few ulp), far below bf16's rounding. The arithmetic is spelled with _rn intrinsics,
// which the compiler may not contract or reassociate, so every kernel that inlines it computes the same
// bits (plain f32 * and + leave fma contraction to each call site). gelu(+0) = +0 / 2 = +0, so zero padding
// stays zero; gelu(+inf) = +inf, and gelu(-inf) = -inf * (1 / inf) = -inf * 0 = NaN, the same in every
// kernel that inlines it.
__device__ __forceinline__ float gelu_2u(float x) {
  return __fmul_rn(2.0f * kGeluScale, __fmaf_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x, x));
}
// exp(-2u) and the reciprocal below come from kernels/fast_math.cuh (subnormal results flushed). GELU never needs
// those results: exp(-2u) is subnormal only where 1 + exp(-2u) rounds to 1 anyway (and gelu' adds x v' s e, < 1e-35,
// to s = 1), and 1 / (1 + exp(-2u)) only for x below about -10.8, where gelu is ~1e-37 and becomes 0 (-0 for x < 0)
// here. exp(-2u) as __expf computes it (the f32 product with log2(e) rounded to f32, then 2^t), flushed.
__device__ __forceinline__ float gelu_exp(float x) { return ex2_ftz(__fmul_rn(-gelu_2u(x), 0x1.715476p+0f)); }
// sigmoid(2u) = 1 / (1 + exp(-2u)) from e = exp(-2u): the one reciprocal gelu and gelu_grad share (a kernel computing
// both computes it once).
__device__ __forceinline__ float gelu_sigmoid_of(float e) { return rcp_ftz(__fadd_rn(1.0f, e)); }
__device__ __forceinline__ float gelu(float x) { return __fmul_rn(x, gelu_sigmoid_of(gelu_exp(x))); }

// d gelu / dx = s + x s (1 - s) d(2u)/dx, s = sigmoid(2u), with 1 - s taken as e s (e = exp(-2u)) where
// e < 1, so neither end cancels. Same intrinsics discipline as gelu(). gelu'(+inf) is NaN (inf * 0).
__device__ __forceinline__ float gelu_grad(float x) {
  const float e = gelu_exp(x);
  const float s = gelu_sigmoid_of(e);
  const float one_minus_s = e < 1.0f ? __fmul_rn(e, s) : __fsub_rn(1.0f, s);
  const float dv = __fmul_rn(2.0f * kGeluScale, __fmaf_rn(__fmul_rn(3.0f * kGeluCubic, x), x, 1.0f));  // d(2u)/dx
  return __fmaf_rn(__fmul_rn(x, dv), __fmul_rn(s, one_minus_s), s);
}

// The GELU backward of one element: acc + gelu'(x) * d in one rounding (what the GELU backward kernel
// adds into its gradient acc; the dgelu prologue passes acc = +0, a zero-filled gradient, so a zero
// product gives +0 there too).
__device__ __forceinline__ float gelu_backward_value(float acc, float x, float d) {
  return __fmaf_rn(d, gelu_grad(x), acc);
}

}  // namespace fp8t::kernels
