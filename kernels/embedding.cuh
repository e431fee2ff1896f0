// Token + position embedding: forward into bf16 activations, backward into f32 weight gradients.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fp8t::kernels {

// out (B, T, C) = wte[tokens] + wpe[t]; wte (Vp, C), wpe (maxT >= T, C); tokens must lie in [0, Vp)
void embedding_forward(__nv_bfloat16* out, const int32_t* tokens, const __nv_bfloat16* wte,
                       const __nv_bfloat16* wpe, int B, int T, int C, cudaStream_t stream);
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t]  (f32 atomics)
void embedding_backward(float* dwte, float* dwpe, const __nv_bfloat16* dout, const int32_t* tokens, int B, int T,
                        int C, cudaStream_t stream);

}  // namespace fp8t::kernels
