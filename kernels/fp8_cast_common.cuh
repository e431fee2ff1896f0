// Device helpers shared by the FP8 cast kernels (kernels/fp8_cast.cu) and the amax / dequantize kernels
// (kernels/fp8_amax.cu): element loads, the prologues' input values, per-thread statistics and the eight-value
// encode with them.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_codec.cuh"
#include "kernels/fp8_convert8.cuh"
#include "kernels/gelu_math.cuh"
#include "kernels/layernorm_math.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

// Eight consecutive elements from a 16-byte aligned address.
__device__ __forceinline__ void load8(const bf16* p, float (&x)[8]) {
  const auto v = Vec16<bf16>::load(p);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = __bfloat162float(v.v[j]);
}
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const auto v0 = Vec16<float>::load(p), v1 = Vec16<float>::load(p + 4);
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = v0.v[j], x[j + 4] = v1.v[j];
}

// The dgelu prologue's value for the gradient d of gelu(pre): gelu_backward's bf16 rounding into a
// zero-filled gradient (acc = +0). Zero padding stays zero: gelu'(0) * 0 + 0 = +0.
__device__ __forceinline__ float dgelu_value_bf16(float d, float pre) {
  return __bfloat162float(__float2bfloat16_rn(gelu_backward_value(0.0f, pre, d)));
}

// dgelu_value_bf16 of two elements (gradients d0, d1 of gelu(p0), gelu(p1)), rounded together.
__device__ __forceinline__ float2 dgelu_values_bf16(float d0, float p0, float d1, float p1) {
  return bf16_round2(gelu_backward_value(0.0f, p0, d0), gelu_backward_value(0.0f, p1, d1));
}

// The value a cast reads for element i = (r, c) of the input, x: x, or what the unfused kernel stores
// for it (gelu_forward's, layernorm_forward's or gelu_backward's bf16 rounding of the shared device
// arithmetic), so the fused cast sees the unfused cast's input bit for bit. r and c matter only to
// layernorm, the flat index i only to dgelu.
template <Fp8CastInput kIn>
__device__ __forceinline__ float cast_input(float x, int64_t i, int64_t r, int64_t c, const Fp8CastOperands& ops) {
  if constexpr (kIn == Fp8CastInput::gelu) {
    return __bfloat162float(__float2bfloat16_rn(gelu(x)));
  } else if constexpr (kIn == Fp8CastInput::layernorm) {
    return layernorm_value_bf16(x, ops.mean[r], ops.rstd[r], __bfloat162float(ops.w[c]), __bfloat162float(ops.b[c]));
  } else if constexpr (kIn == Fp8CastInput::dgelu) {
    return dgelu_value_bf16(x, __bfloat162float(ops.pre[i]));
  } else if constexpr (kIn == Fp8CastInput::saved_dgelu) {
    return dgelu_value_bf16(x, __bfloat162float(dequant_bf16<Fp8Format::e4m3>(ops.pre_codes[i], ops.row_scale_inv[r])));
  } else if constexpr (kIn == Fp8CastInput::saved_gelu) {
    const float pre = __bfloat162float(dequant_bf16<Fp8Format::e4m3>(ops.pre_codes[i], ops.row_scale_inv[r]));
    return __bfloat162float(__float2bfloat16_rn(gelu(pre)));
  } else {
    return x;
  }
}

__device__ __forceinline__ uint8_t byte_of(uint32_t w, int b) { return static_cast<uint8_t>(w >> (8 * b)); }

// One atomic per block for each statistic (blockDim.x == kThreads).
__device__ __forceinline__ void flush_stats(ThreadStats s, Fp8CastOutputs out) { flush_block_stats<kThreads>(s, out); }

}  // namespace
}  // namespace fp8t::kernels
