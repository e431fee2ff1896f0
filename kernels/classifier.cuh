// Fused softmax cross-entropy over bf16 logits (BT, Vp), of which the first V columns are real.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fp8t::kernels {

// losses (BT) f32 = logsumexp(logits[r, :V]) - logits[r, target]; a target outside [0, V) gives NaN.
void crossentropy_forward(float* losses, const __nv_bfloat16* logits, const int32_t* targets, int64_t BT, int V,
                          int Vp, cudaStream_t stream);
// dlogits (BT, Vp) = (softmax - onehot(target)) * dloss for columns < V, 0 for padded columns.
// Overwrites; dlogits may alias logits (each element is read before it is written by the same thread).
void crossentropy_backward(__nv_bfloat16* dlogits, const __nv_bfloat16* logits, const int32_t* targets, float dloss,
                           int64_t BT, int V, int Vp, cudaStream_t stream);

}  // namespace fp8t::kernels
