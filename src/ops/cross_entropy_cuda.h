// CUDA launchers of the cross-entropy op (defined in cross_entropy_cuda.cpp, built with CUDA only; a build
// without it sees the declarations alone and never calls them). Logits and their gradient bf16, targets i32,
// losses and lse f32. Launches go on the current compute stream.
#pragma once
#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace fp8t::cuda_ops {

// losses, lse f32 (B*T): per-token loss and logsumexp over the first vocab_size columns of logits (..., Vp);
// *mean (1) f32 = mean loss, if given.
void cross_entropy_forward(Tensor& losses, Tensor& lse, Tensor* mean, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size);
// mean (1) f32 = the mean of values (f32), on the device.
void mean_of(Tensor& mean, const Tensor& values);
// dlogits overwritten (may alias logits: the fused kernel works in place), scaled by
// dloss (1, f32, on the device) * dloss_scale.
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            const Tensor& dloss, float dloss_scale, int64_t vocab_size);
// The same gradient as the E5M2 codes the FP8 linear that made the logits asked for (Fp8DyRequest: its dy operands,
// with its scale), left pending for that linear's backward: PendingGrad's dy_codes / dy_codes_t and dy_stats
// (materialize is the caller's to set). Each code is what the bf16 dlogits followed by the linear's own cast would
// give; codes_t is their transpose. Only where cross_entropy_writes_dy_codes: no column sums asked (no bias), rows
// of a multiple of 8 logits, 16-byte aligned. The logits are not overwritten.
bool cross_entropy_writes_dy_codes(const Fp8DyRequest& request, const Tensor& logits);
PendingGrad cross_entropy_backward_dy_codes(const Fp8DyRequest& request, const Tensor& logits, const Tensor& lse,
                                            const Tensor& targets, const Tensor& dloss, float dloss_scale,
                                            int64_t vocab_size);

}  // namespace fp8t::cuda_ops
