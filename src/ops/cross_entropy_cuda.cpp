// CUDA launchers of the cross-entropy op (see cross_entropy_cuda.h): check devices, dtypes and shapes, then
// call kernels/cross_entropy.cuh on the compute stream.
#include "ops/cross_entropy_cuda.h"

#include "kernels/cross_entropy.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void cross_entropy_forward(Tensor& losses, Tensor& lse, Tensor* mean, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size) {
  const char* op = "cross_entropy_forward";
  expect(logits, DType::bf16, op, "logits");
  expect(targets, DType::i32, op, "targets");
  expect(losses, DType::f32, op, "losses");
  expect(lse, DType::f32, op, "lse");
  const int64_t Vp = logits.dim(-1), BT = rows_of(logits);
  FP8T_CHECK(vocab_size > 0 && vocab_size <= Vp, "{}: vocab_size {} outside (0, {}]", op, vocab_size, Vp);
  expect_numel(targets, BT, op, "targets");
  expect_numel(losses, BT, op, "losses");
  expect_numel(lse, BT, op, "lse");
  if (mean) {
    expect(*mean, DType::f32, op, "mean");
    expect_numel(*mean, 1, op, "mean");
  }
  k::cross_entropy_forward(losses.data<float>(), lse.data<float>(), mean ? mean->data<float>() : nullptr,
                           logits.data<bf16>(), targets.data<int32_t>(), BT, to_int(vocab_size, op, "vocab_size"),
                           to_int(Vp, op, "Vp"), k::compute_stream());
}

void mean_of(Tensor& mean, const Tensor& values) {
  expect(mean, DType::f32, "mean_of", "mean");
  expect(values, DType::f32, "mean_of", "values");
  expect_numel(mean, 1, "mean_of", "mean");
  k::mean_reduce(mean.data<float>(), values.data<float>(), values.numel(), k::compute_stream());
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            const Tensor& dloss, float dloss_scale, int64_t vocab_size) {
  const char* op = "cross_entropy_backward";
  expect(logits, DType::bf16, op, "logits");
  expect(dlogits, DType::bf16, op, "dlogits");
  expect(targets, DType::i32, op, "targets");
  expect(lse, DType::f32, op, "lse");
  expect(dloss, DType::f32, op, "dloss");
  const int64_t Vp = logits.dim(-1), BT = rows_of(logits);
  FP8T_CHECK(vocab_size > 0 && vocab_size <= Vp, "{}: vocab_size {} outside (0, {}]", op, vocab_size, Vp);
  expect_shape(dlogits, logits.shape(), op, "dlogits");
  expect_numel(targets, BT, op, "targets");
  expect_numel(lse, BT, op, "lse");
  expect_numel(dloss, 1, op, "dloss");
  k::cross_entropy_backward(dlogits.data<bf16>(), logits.data<bf16>(), lse.data<float>(), targets.data<int32_t>(),
                            dloss.data<float>(), dloss_scale, BT, to_int(vocab_size, op, "vocab_size"),
                            to_int(Vp, op, "Vp"), k::compute_stream());
}

}  // namespace fp8t::cuda_ops
