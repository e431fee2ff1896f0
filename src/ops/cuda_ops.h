// Tensor-level CUDA entry points used by ops.cpp when a tensor lives on a GPU (FP8T_HAVE_CUDA).
// Activations and their gradients are bf16; weights are bf16 compute copies; weight gradients are
// f32 views of the flat gradient buffer; tokens/targets are i32; LayerNorm stats and attention lse
// are f32. Backward functions ACCUMULATE into weight/bias gradients (gradient accumulation) and
// into activation gradients. All launches go on the current compute stream.
#pragma once
#include "core/tensor.h"
#include "kernels/attention.cuh"

namespace fp8t::cuda_ops {

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens);
// out (M, N) = inp (M, K) @ weight (N, K)^T + bias
void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
// dinp (+)= dout @ weight (overwritten when !accumulate_dinp); dweight, dbias +=
void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, bool accumulate_dinp = true);
// out (M, N) = gelu(inp @ weight^T + bias), pre (M, N) = the pre-GELU values (cuBLASLt epilogue)
void matmul_forward_gelu(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight, const Tensor& bias);
// dpre (M, K) = (dout (M, N) @ weight (N, K)) * gelu'(pre), overwritten (cuBLASLt epilogue)
void matmul_backward_dgelu(Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre);
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w,
                       const Tensor& b);
void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd);
void gelu_forward(Tensor& out, const Tensor& inp);
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);
void residual_forward(Tensor& out, const Tensor& a, const Tensor& b);
// `kernels`: which attention kernels run (kernels/attention.cuh; the defaults are the product's).
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head,
                       const kernels::AttentionKernels& kernels = {});
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, int n_head, const kernels::AttentionKernels& kernels = {});
// losses, lse f32 (B*T): per-token loss and logsumexp; *mean (1) f32 = mean loss, if given.
void crossentropy_forward(Tensor& losses, Tensor& lse, Tensor* mean, const Tensor& logits, const Tensor& targets,
                          int64_t vocab_size);
// mean (1) f32 = the mean of values (f32), on the device.
void mean_of(Tensor& mean, const Tensor& values);
// dlogits overwritten (may alias logits: the fused classifier works in place), scaled by
// dloss (1, f32, on the device) * dloss_scale.
void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                           const Tensor& dloss, float dloss_scale, int64_t vocab_size);

}  // namespace fp8t::cuda_ops
