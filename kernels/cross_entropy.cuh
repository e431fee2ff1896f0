// Fused softmax cross-entropy over bf16 logits (BT, Vp), of which the first V columns are real.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.cuh"

namespace fp8t::kernels {

// losses (BT) f32 = lse - logits[r, target] with lse (BT) f32 = logsumexp(logits[r, :V]) kept for the
// backward pass; a target outside [0, V) gives a NaN loss. If mean is not null, *mean = the mean loss
// (computed on the device).
void cross_entropy_forward(float* losses, float* lse, float* mean, const __nv_bfloat16* logits,
                           const int32_t* targets, int64_t BT, int V, int Vp, cudaStream_t stream);
// *mean = sum(values[0..n)) / n, on the device (one block).
void mean_reduce(float* mean, const float* values, int64_t n, cudaStream_t stream);
// dlogits (BT, Vp) = (softmax - onehot(target)) * (*dloss * dloss_scale) for columns < V, 0 for padded
// columns, with softmax = exp(logits - lse). Overwrites; dlogits may alias logits.
void cross_entropy_backward(__nv_bfloat16* dlogits, const __nv_bfloat16* logits, const float* lse,
                            const int32_t* targets, const float* dloss, float dloss_scale, int64_t BT, int V, int Vp,
                            cudaStream_t stream);
// cross_entropy_backward's dlogits, never stored in bf16, as E5M2 codes (BT, Vp): each code to_fp8(x * *scale) for x
// the bf16 value cross_entropy_backward writes, bit for bit what fp8_cast of that dlogits gives, with that cast's
// amax and saturation count into stats (stats.colsum must be null: a row per block has no column sums). Needs
// cross_entropy_codes_supported.
bool cross_entropy_codes_supported(const __nv_bfloat16* logits, const uint8_t* codes, int Vp);
void cross_entropy_backward_codes(uint8_t* codes, const __nv_bfloat16* logits, const float* lse, const int32_t* targets,
                                  const float* dloss, float dloss_scale, int64_t BT, int V, int Vp, const float* scale,
                                  Fp8CastOutputs stats, cudaStream_t stream);

}  // namespace fp8t::kernels
