// 2^t and 1 / y on the special function unit with subnormal results flushed to zero, for kernels bound by their
// instruction issue (the GELU casts, the attention softmax). exp2f, __expf and __fdividef compile to the forms that
// keep subnormal results (ex2.approx.f32, div.approx.f32), which wrap their MUFU instruction in a range test and
// predicated rescaling: three more instructions per value. For every normal result both forms give the same bits
// (the same MUFU.EX2 / MUFU.RCP); each caller says why it never needs the subnormal ones.
#pragma once
#include <cuda_runtime.h>

namespace fp8t::kernels {

__device__ __forceinline__ float ex2_ftz(float t) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
  return r;
}
__device__ __forceinline__ float rcp_ftz(float y) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
}

}  // namespace fp8t::kernels
