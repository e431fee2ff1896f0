// The first and last passes of the attention backward, around every main pass (mma.sync, wgmma, and the wgmma
// variants of kernels/lab/): delta with the dQ scratch zeroed, then scale * dQ added into dqkv.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.cuh"

namespace fp8t::kernels {

// How the main pass leaves dQ / scale in the f32 scratch dq_accum.
enum class DqLayout : uint8_t {
  rows,   // (B, T, C), added by f32 atomics (the mma.sync kernels)
  tiles,  // (B * NH, ceil(T / 64), 64 x 64) in fragment order, added by bulk reductions (wgmma, head size 64 only)
};

// Floats of dq_accum in `layout` for these sizes.
int64_t attention_dq_floats(DqLayout layout, int B, int T, int NH, int HS);

// delta (B, NH, T) = rowsum(dO * O) per head, from dout (B, T, C) and out (either form); dq_accum = 0 in `layout`.
void attention_backward_delta(float* delta, float* dq_accum, DqLayout layout, const __nv_bfloat16* dout,
                              const AttentionOut& out, int B, int T, int NH, int HS, cudaStream_t stream);

// dqkv's Q part (B, T, 3C) += scale * dq_accum (`layout`), scale = 1 / sqrt(HS); = instead unless `accumulate`.
void attention_backward_dq(__nv_bfloat16* dqkv, const float* dq_accum, DqLayout layout, int B, int T, int NH, int HS,
                           cudaStream_t stream, bool accumulate = true);

// dy's codes of qkv's Q part from scale * dq_accum (DqLayout::tiles, head size 64): what attention_backward_dq writes
// (not accumulating), encoded as the E5M2 cast would (kernels/attention_dy_codes.cu). Or, where dy has no codes, those
// values into dqkv's Q part (16-byte aligned) with their column sums alone into dy.stats.colsum.
void attention_backward_dq_codes(const float* dq_accum, const AttentionDyCodes& dy, int B, int T, int NH,
                                 cudaStream_t stream, __nv_bfloat16* dqkv = nullptr);

}  // namespace fp8t::kernels
