// GELU (tanh approximation) forward and backward over bf16 buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace fp8t::kernels {

// out = gelu(inp)
void gelu_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, size_t n, cudaStream_t stream);
// dinp += gelu'(inp) * dout  (dinp may alias dout)
void gelu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout, size_t n,
                   cudaStream_t stream);

}  // namespace fp8t::kernels
