// CUDA launchers of the causal self-attention op (see attention_cuda.h): check devices, dtypes and shapes,
// take the backward's scratch from the caching allocator, then call kernels/attention.cuh on the compute stream.
#include "ops/attention_cuda.h"

#include "kernels/attention.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head, const k::AttentionKernels& kernels) {
  const char* op = "attention_forward";
  expect(qkv, DType::bf16, op, "qkv");
  expect(out, DType::bf16, op, "out");
  expect(lse, DType::f32, op, "lse");
  FP8T_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, "{}: qkv must be (B, T, 3C), got {}", op, qkv.str());
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "{}: C={} is not divisible by n_head={}", op, C, n_head);
  expect_shape(out, {B, T, C}, op, "out");
  expect_numel(lse, B * n_head * T, op, "lse");
  k::attention_forward(out.data<bf16>(), lse.data<float>(), qkv.data<bf16>(), to_int(B, op, "B"), to_int(T, op, "T"),
                       n_head, to_int(C / n_head, op, "HS"), k::compute_stream(), kernels);
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head) {
  attention_forward(out, lse, qkv, n_head, k::AttentionKernels{});
}

namespace {

// Both forms of out: checks the rest, takes the scratch from the caching allocator (served from the pool after the
// first step) and runs the backward.
void backward(const char* op, Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const k::AttentionOut& out,
              const Tensor& lse, int n_head, const k::AttentionKernels& kernels, bool accumulate) {
  expect(qkv, DType::bf16, op, "qkv");
  expect(dqkv, DType::bf16, op, "dqkv");
  expect(dout, DType::bf16, op, "dout");
  expect(lse, DType::f32, op, "lse");
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  expect_shape(dqkv, qkv.shape(), op, "dqkv");
  expect_shape(dout, {B, T, C}, op, "dout");
  expect_numel(lse, B * n_head * T, op, "lse");
  const int64_t dq_floats = k::attention_dq_scratch_floats(to_int(B, op, "B"), to_int(T, op, "T"), n_head,
                                                          to_int(C / n_head, op, "HS"), kernels);
  Tensor dq_accum = Tensor::empty({dq_floats}, DType::f32, qkv.device(), MemCategory::activations);
  Tensor delta = Tensor::empty({B, n_head, T}, DType::f32, qkv.device(), MemCategory::activations);
  k::attention_backward(dqkv.data<bf16>(), dq_accum.data<float>(), delta.data<float>(), dout.data<bf16>(),
                        qkv.data<bf16>(), out, lse.data<float>(), to_int(B, op, "B"), to_int(T, op, "T"), n_head,
                        to_int(C / n_head, op, "HS"), k::compute_stream(), kernels, accumulate);
}

// (B, T, C) of qkv (B, T, 3C), checked.
Shape out_shape(const char* op, const Tensor& qkv, int n_head) {
  FP8T_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, "{}: qkv must be (B, T, 3C), got {}", op, qkv.str());
  const int64_t C = qkv.dim(2) / 3;
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "{}: C={} is not divisible by n_head={}", op, C, n_head);
  return {qkv.dim(0), qkv.dim(1), C};
}

}  // namespace

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, const k::AttentionKernels& kernels, bool accumulate) {
  const char* op = "attention_backward";
  const Shape oshape = out_shape(op, qkv, n_head);
  expect(out, DType::bf16, op, "out");
  expect_shape(out, oshape, op, "out");
  backward(op, dqkv, dout, qkv, k::AttentionOut{.bf16 = out.data<bf16>()}, lse, n_head, kernels, accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, const k::AttentionKernels& kernels, bool accumulate) {
  const char* op = "attention_backward";
  const Shape oshape = out_shape(op, qkv, n_head);
  const int64_t M = oshape[0] * oshape[1], C = oshape[2];
  FP8T_CHECK(out.codes_t.defined() && out.layout == ScaleLayout::per_tensor && out.codes_t.dtype() == DType::e4m3 &&
                 out.codes_t.shape() == Shape({C, M}) && out.codes_t.device() == qkv.device() &&
                 out.scale_inv.numel() == 1 && out.scale_inv.dtype() == DType::f32 &&
                 out.scale_inv.device() == qkv.device(),
             "{}: out's FP8 form must be per-tensor E4M3 codes transposed to ({}, {}) with one f32 scale_inv on {}, "
             "got {} codes_t {} scale_inv {}",
             op, C, M, qkv.device().str(), scale_layout_name(out.layout),
             out.codes_t.defined() ? out.codes_t.str() : "(none)", out.scale_inv.defined() ? out.scale_inv.str() : "(none)");
  backward(op, dqkv, dout, qkv,
           k::AttentionOut{.e4m3_t = out.codes_t.data<uint8_t>(), .scale_inv = out.scale_inv.data<float>()}, lse,
           n_head, kernels, accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, bool accumulate) {
  attention_backward(dqkv, dout, qkv, out, lse, n_head, k::AttentionKernels{}, accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, bool accumulate) {
  attention_backward(dqkv, dout, qkv, out, lse, n_head, k::AttentionKernels{}, accumulate);
}

}  // namespace fp8t::cuda_ops
