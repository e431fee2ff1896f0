// CUDA launchers of the cross-entropy op (see cross_entropy_cuda.h): check devices, dtypes and shapes, then
// call kernels/cross_entropy.cuh on the compute stream.
#include "ops/cross_entropy_cuda.h"

#include "core/cuda_check.h"
#include "kernels/cross_entropy.cuh"
#include "kernels/fp8_cast.cuh"
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

bool cross_entropy_writes_dy_codes(const Fp8DyRequest& request, const Tensor& logits) {
  const int64_t Vp = logits.ndim() > 0 ? logits.dim(-1) : 0;
  return request.scale && (request.codes || request.codes_t) && !request.colsum && logits.dtype() == DType::bf16 &&
         Vp > 0 && Vp <= 0x7fffffff && k::cross_entropy_codes_supported(logits.data<bf16>(), nullptr, int(Vp));
}

PendingGrad cross_entropy_backward_dy_codes(const Fp8DyRequest& request, const Tensor& logits, const Tensor& lse,
                                            const Tensor& targets, const Tensor& dloss, float dloss_scale,
                                            int64_t vocab_size) {
  const char* op = "cross_entropy_backward (dy codes)";
  FP8T_CHECK(cross_entropy_writes_dy_codes(request, logits),
             "{}: the request (codes {}, codes_t {}, column sums {}) or the logits {} do not allow it", op,
             request.codes, request.codes_t, request.colsum, logits.str());
  expect(targets, DType::i32, op, "targets");
  expect(lse, DType::f32, op, "lse");
  expect(dloss, DType::f32, op, "dloss");
  const int64_t Vp = logits.dim(-1), BT = rows_of(logits);
  FP8T_CHECK(vocab_size > 0 && vocab_size <= Vp, "{}: vocab_size {} outside (0, {}]", op, vocab_size, Vp);
  expect_numel(targets, BT, op, "targets");
  expect_numel(lse, BT, op, "lse");
  expect_numel(dloss, 1, op, "dloss");
  const cudaStream_t stream = k::compute_stream();
  const Device dev = logits.device();
  PendingGrad p;
  Tensor codes = Tensor::empty({BT, Vp}, DType::e5m2, dev, MemCategory::workspace);
  p.dy_stats = Tensor::empty({k::cast_stats_floats(Vp)}, DType::f32, dev, MemCategory::workspace);
  CUDA_CHECK(cudaMemsetAsync(p.dy_stats.raw(), 0, p.dy_stats.nbytes(), stream));
  float* amax = p.dy_stats.data<float>() + k::cast_stats_amax_index(Vp);
  k::cross_entropy_backward_codes(codes.data<uint8_t>(), logits.data<bf16>(), lse.data<float>(),
                                  targets.data<int32_t>(), dloss.data<float>(), dloss_scale, BT,
                                  to_int(vocab_size, op, "vocab_size"), to_int(Vp, op, "Vp"), request.scale,
                                  {.amax = amax, .saturated = reinterpret_cast<unsigned long long*>(amax + 2)}, stream);
  if (request.codes_t) {
    p.dy_codes_t = Tensor::empty({Vp, BT}, DType::e5m2, dev, MemCategory::workspace);
    k::fp8_transpose(codes.data<uint8_t>(), BT, Vp, p.dy_codes_t.data<uint8_t>(), stream);
  }
  if (request.codes) p.dy_codes = std::move(codes);  // else back to the pool once the stream passes the transpose
  return p;
}

}  // namespace fp8t::cuda_ops
