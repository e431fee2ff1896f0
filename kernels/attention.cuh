// Fused causal flash attention (forward and backward) over the packed qkv (B, T, 3C) layout.
// BF16 inputs, FP32 accumulation and online softmax, tensor cores; T x T is never materialised.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.cuh"

namespace fp8t::kernels {

// Which kernels attention runs. The default is the product's choice; the mma.sync kernels stay selectable because
// every GPU but a Hopper runs them, so the tests check them there too (tests/kernels/attention_gpu_test.cpp).
struct AttentionKernels {
  // Head size 64 on a Hopper GPU with an sm_90a build: the forward and the backward's main pass on warpgroup
  // MMAs (kernels/attention_wgmma.cuh); false: the mma.sync kernels every GPU runs.
  bool wgmma = true;
};

// qkv (B, T, 3C) as the kernels read it: bf16, or the E4M3 codes fp8_all saves of it (fp8/saved.h: (B * T, 3C)
// codes with an f32 scale_inv per row), which the kernels dequantize as they load their tiles, each value the bf16
// fp8_dequantize_rows writes, so that both forms give the same bits. Exactly one of bf16 and e4m3 is set. The codes
// need attention_reads_codes(HS, kernels).
struct AttentionQkv {
  const __nv_bfloat16* bf16 = nullptr;
  const uint8_t* e4m3 = nullptr;
  const float* row_scale_inv = nullptr;
};
// Whether these kernels read qkv as codes (the warpgroup-MMA kernels: head size 64 on a Hopper, sm_90a build).
bool attention_reads_codes(int HS, const AttentionKernels& kernels = {});

// out (B, T, C) bf16; lse (B, NH, T) f32 = logsumexp of each scaled score row (saved for backward).
// HS = C / NH must be 64 or 128.
void attention_forward(__nv_bfloat16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH, int HS,
                       cudaStream_t stream, const AttentionKernels& kernels = {});
inline void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH, int HS,
                              cudaStream_t stream, const AttentionKernels& kernels = {}) {
  attention_forward(out, lse, AttentionQkv{.bf16 = qkv}, B, T, NH, HS, stream, kernels);
}
// The forward's output O as the backward reads it (only for delta = rowsum(dO * O)): bf16 (B, T, C), or, where the
// next FP8 linear keeps O for its weight gradient, those codes: E4M3, transposed (C, B * T), dequantized as
// decode(code) * *scale_inv in f32 (one scale on the device). Exactly one of bf16 and e4m3_t is set.
struct AttentionOut {
  const __nv_bfloat16* bf16 = nullptr;
  const uint8_t* e4m3_t = nullptr;
  const float* scale_inv = nullptr;
};

// qkv's gradient g written as the E5M2 operands of the FP8 linear that made qkv (its dy casts, ops/fp8_linear.h)
// instead of bf16: codes (B * T, 3C) and codes_t (3C, B * T), either may be null, each code to_fp8(x * *scale) for
// x = g's bf16 value, bit for bit what the bf16 gradient followed by fp8_cast (kernels/fp8_cast.cuh) writes, with that
// cast's statistics into `stats` (amax, saturated, and colsum: the (3C) column sums of x, qkv's bias gradient).
// Or, with codes and codes_t null, only those column sums into stats.colsum (non-null; qkv's producer a BF16 linear)
// beside g written into dqkv. Needs attention_writes_dy_codes(HS, kernels).
struct AttentionDyCodes {
  uint8_t* codes = nullptr;
  uint8_t* codes_t = nullptr;
  const float* scale = nullptr;
  Fp8CastOutputs stats;
};
// Whether the backward can write AttentionDyCodes (the warpgroup-MMA kernels: head size 64 on a Hopper, sm_90a build).
bool attention_writes_dy_codes(int HS, const AttentionKernels& kernels = {});

// dqkv (B, T, 3C) bf16 += gradient of the attention; with accumulate false, dqkv = the gradient, written over
// whatever dqkv held (no zero fill needed). Scratch: dq_accum, attention_dq_scratch_floats() f32 (at least
// B * T * C), and delta (B, NH, T) f32, both overwritten. With dy (accumulate false), the gradient goes to dy's codes
// instead, and dqkv (may be null) is not written; with dy without codes, into dqkv with its column sums.
void attention_backward(__nv_bfloat16* dqkv, float* dq_accum, float* delta, const __nv_bfloat16* dout,
                        const AttentionQkv& qkv, const AttentionOut& out, const float* lse, int B, int T, int NH,
                        int HS, cudaStream_t stream, const AttentionKernels& kernels = {}, bool accumulate = true,
                        const AttentionDyCodes* dy = nullptr);
inline void attention_backward(__nv_bfloat16* dqkv, float* dq_accum, float* delta, const __nv_bfloat16* dout,
                               const __nv_bfloat16* qkv, const AttentionOut& out, const float* lse, int B, int T,
                               int NH, int HS, cudaStream_t stream, const AttentionKernels& kernels = {},
                               bool accumulate = true) {
  attention_backward(dqkv, dq_accum, delta, dout, AttentionQkv{.bf16 = qkv}, out, lse, B, T, NH, HS, stream, kernels,
                     accumulate);
}

// Floats of attention_backward's dq_accum scratch for these sizes and kernels.
int64_t attention_dq_scratch_floats(int B, int T, int NH, int HS, const AttentionKernels& kernels = {});

}  // namespace fp8t::kernels
