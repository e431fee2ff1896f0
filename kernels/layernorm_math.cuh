// LayerNorm's per-element arithmetic as device functions shared by the LayerNorm forward kernel
// (kernels/layernorm.cu) and the FP8 cast's LayerNorm prologue (kernels/fp8_cast.cu): the fused
// LayerNorm -> FP8 cast must read bit for bit the values layernorm_forward writes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace fp8t::kernels {

inline constexpr float kLayerNormEps = 1e-5f;

// (x - mean) * rstd * w + b in f32. Spelled with _rn intrinsics, which the compiler may not contract
// or reassociate, so every kernel that inlines it computes the same bits; the intrinsics are the
// contraction nvcc chooses for the plain expression (the "* w + b" as one fma).
__device__ __forceinline__ float layernorm_value(float x, float mean, float rstd, float w, float b) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(x, mean), rstd), w, b);
}

// The value layernorm_forward stores (bf16, rounded to nearest even), read back as f32.
__device__ __forceinline__ float layernorm_value_bf16(float x, float mean, float rstd, float w, float b) {
  return __bfloat162float(__float2bfloat16_rn(layernorm_value(x, mean, rstd, w, b)));
}

}  // namespace fp8t::kernels
