// The add op's kernel (the residual connections): out = a + b over bf16 buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace fp8t::kernels {

// out = a + b, all bf16, n elements (out may alias a or b; all three 16-byte aligned). With b_bias (C elements, C
// dividing n, 16-byte aligned): out = a + (b + b_bias[i % C]), summed in f32 and rounded once, the bias of the
// linear that wrote b and left it out (ops.h: add).
void add_forward(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, cudaStream_t stream,
                 const __nv_bfloat16* b_bias = nullptr, int C = 0);

}  // namespace fp8t::kernels
