// CUDA launchers of the causal self-attention op (defined in attention_cuda.cpp, built with CUDA only; a build
// without it sees the declarations alone and never calls them). qkv, out and their gradients bf16, lse f32;
// backward ACCUMULATES into dqkv unless told to write it. Launches go on the current compute stream.
#pragma once
#include "autograd/variable.h"
#include "core/tensor.h"
#include "fp8/quantized_tensor.h"

namespace fp8t::kernels {
struct AttentionKernels;  // kernels/attention.cuh
}  // namespace fp8t::kernels

namespace fp8t::cuda_ops {

// out (B, T, C), lse (B, NH, T) = causal attention over qkv (B, T, 3C), with the product's kernels
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head);
// `kernels`: which attention kernels run (kernels/attention.cuh), for the tests and benchmarks that compare them.
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                       const kernels::AttentionKernels& kernels);
// dqkv (B, T, 3C) += the gradient for dout (B, T, C), given the forward's out and lse; with accumulate false,
// dqkv = the gradient (its old contents, even NaN, are not read: no zero fill needed).
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, bool accumulate = true);
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, const kernels::AttentionKernels& kernels, bool accumulate = true);
// The same with the forward's out given as the FP8 codes the next linear keeps of it: E4M3, transposed only
// (codes_t (C, B * T)), one scale (per_tensor), read by delta = rowsum(dO * O) without a bf16 copy.
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, bool accumulate = true);
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, const kernels::AttentionKernels& kernels,
                        bool accumulate = true);

// fp8_all's saved qkv read by the kernels themselves (fp8/saved.h: per-row E4M3 codes (B, T, 3C), fp8_save without
// a round trip), dequantized as they load their tiles to exactly the values fp8_restore gives, so these compute
// what the bf16 overloads compute on fp8_restore(qkv). Only where attention_reads_codes(qkv, n_head): the
// warpgroup-MMA kernels (head size 64, Hopper, sm_90a build).
bool attention_reads_codes(const Tensor& qkv, int n_head);
void attention_forward(Tensor& out, Tensor& lse, const QuantizedTensor& qkv, int n_head);
void attention_backward(Tensor& dqkv, const Tensor& dout, const QuantizedTensor& qkv, const Tensor& out,
                        const Tensor& lse, int n_head, bool accumulate = true);
void attention_backward(Tensor& dqkv, const Tensor& dout, const QuantizedTensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, bool accumulate = true);

// qkv's gradient as the E5M2 codes its producer, an FP8 linear, asked for (Fp8DyRequest: its dy operands, with its
// scale), left pending for that linear's backward: PendingGrad's dy_codes / dy_codes_t and dy_stats (materialize is
// the caller's to set). Each code is what the bf16 gradient of attention_backward (accumulate false) followed by the
// linear's own cast would give. Only where attention_writes_dy_codes(qkv's shape, n_head): the warpgroup-MMA kernels
// (head size 64, Hopper, sm_90a build). qkv and out each in one of the forms above (the other null).
struct AttentionSaved {
  const Tensor* qkv = nullptr;
  const QuantizedTensor* qkv_codes = nullptr;
  const Tensor* out = nullptr;
  const QuantizedTensor* out_codes = nullptr;
};
bool attention_writes_dy_codes(const Shape& qkv_shape, int n_head);
PendingGrad attention_backward_dy_codes(const Fp8DyRequest& request, const Tensor& dout, const AttentionSaved& saved,
                                        const Tensor& lse, int n_head);
// qkv's gradient into dqkv (written over it), as attention_backward with accumulate false, and its (3C) column sums
// into colsum (f32, written over) in the same passes: the bias gradient of qkv's producer, a BF16 linear (GradCell::dy_colsum).
// Only where attention_writes_dy_codes(qkv's shape, n_head).
void attention_backward_colsum(Tensor& dqkv, Tensor& colsum, const Tensor& dout, const AttentionSaved& saved,
                               const Tensor& lse, int n_head);

}  // namespace fp8t::cuda_ops
