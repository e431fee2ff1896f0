// Attention on Hopper's warpgroup MMA (wgmma), head size 64: the forward, and the main pass of
// kernels::attention_backward, which runs the delta pass before it and the dQ pass after it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/attention.cuh"

namespace fp8t::kernels {

// True when this build holds the sm_90a kernel and the current device is a Hopper (compute capability 9.0).
bool attention_wgmma_available();

// out (B, T, C) bf16 and lse (B, NH, T) f32, as kernels::attention_forward. Head size 64 only.
void attention_forward_wgmma64(__nv_bfloat16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH,
                               float scale, cudaStream_t stream);

// dqkv's K and V parts += dK, dV (= unless `accumulate`), or with dy, dK and dV as dy's codes (accumulate ignored,
// dqkv not written); dq_accum += dQ / scale in DqLayout::tiles (kernels/attention_backward_passes.cuh).
// delta (B, NH, T) from the delta pass; lse (B, NH, T) from the forward. Head size 64 only.
void attention_backward_wgmma64(__nv_bfloat16* dqkv, float* dq_accum, const float* delta, const __nv_bfloat16* dout,
                                const AttentionQkv& qkv, const float* lse, int B, int T, int NH, float scale,
                                cudaStream_t stream, bool accumulate = true, const AttentionDyCodes* dy = nullptr);

}  // namespace fp8t::kernels
