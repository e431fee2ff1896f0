// CUDA launchers of the LayerNorm op (see layernorm_cuda.h): check devices, dtypes and shapes, then call
// kernels/layernorm.cuh on the compute stream.
#include "ops/layernorm_cuda.h"

#include "autograd/finite_watch.h"
#include "core/cuda_check.h"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b) {
  const char* op = "layernorm_forward";
  expect(inp, DType::bf16, op, "inp");
  expect(out, DType::bf16, op, "out");
  expect(w, DType::bf16, op, "w");
  expect(b, DType::bf16, op, "b");
  expect(mean, DType::f32, op, "mean");
  expect(rstd, DType::f32, op, "rstd");
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  expect_shape(out, inp.shape(), op, "out");
  expect_numel(w, C, op, "w");
  expect_numel(b, C, op, "b");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  k::layernorm_forward(out.data<bf16>(), mean.data<float>(), rstd.data<float>(), inp.data<bf16>(), w.data<bf16>(),
                       b.data<bf16>(), N, to_int(C, op, "C"), k::compute_stream());
}

namespace {

bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; }

void backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
              const Tensor& mean, const Tensor& rstd, const k::LayerNormDyCodes* dy) {
  const char* op = "layernorm_backward";
  expect(dinp, DType::bf16, op, "dinp");
  expect(dout, DType::bf16, op, "dout");
  expect(inp, DType::bf16, op, "inp");
  expect(w, DType::bf16, op, "w");
  expect(dw, DType::f32, op, "dw");
  expect(db, DType::f32, op, "db");
  expect(mean, DType::f32, op, "mean");
  expect(rstd, DType::f32, op, "rstd");
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  expect_shape(dinp, inp.shape(), op, "dinp");
  expect_shape(dout, inp.shape(), op, "dout");
  expect_numel(w, C, op, "w");
  expect_numel(dw, C, op, "dw");
  expect_numel(db, C, op, "db");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  k::layernorm_backward(dinp.data<bf16>(), dw.data<float>(), db.data<float>(), dout.data<bf16>(), inp.data<bf16>(),
                        w.data<bf16>(), mean.data<float>(), rstd.data<float>(), N, to_int(C, op, "C"),
                        k::compute_stream(), dy);
}

}  // namespace

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd) {
  backward(dinp, dw, db, dout, inp, w, mean, rstd, nullptr);
}

bool layernorm_backward_residual(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                                 const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                 const std::weak_ptr<GradCell>& residual) {
  const std::shared_ptr<GradCell> cell = finite_watch() ? nullptr : residual.lock();
  const Fp8DyRequest* request = cell ? cell->fp8_dy.get() : nullptr;
  const bool as_codes = request && request->scale && (request->codes || request->codes_t);
  const int64_t C = inp.ndim() >= 1 ? inp.dim(-1) : 0, N = C > 0 ? inp.numel() / C : 0;
  if (!(as_codes || (cell && cell->dy_colsum_request)) || cell->pending.defined() || cell->grad.defined() ||
      cell->dy_colsum.defined() || C > 4096 || !k::layernorm_backward_writes_dy_codes(N, static_cast<int>(C)) ||
      !aligned(dinp) || !aligned(dout) || !aligned(inp) || !aligned(w)) {
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd);
    return false;
  }
  const Device device = inp.device();
  if (!as_codes) {  // a BF16 linear's bias: dinp's column sums beside it (b gets dinp itself from the add)
    Tensor sums = Tensor::empty({C}, DType::f32, device, MemCategory::workspace);
    CUDA_CHECK(cudaMemsetAsync(sums.raw(), 0, sums.nbytes(), k::compute_stream()));
    const k::LayerNormDyCodes dy{.stats = {.colsum = sums.data<float>()}};
    backward(dinp, dw, db, dout, inp, w, mean, rstd, &dy);
    cell->dy_colsum = std::move(sums);
    return true;
  }
  PendingGrad p;
  // The kernel writes row-major codes always (the transposed ones are their transpose): where only codes_t is asked
  // for, into a scratch that is released once the transpose has read it (stream order).
  const Tensor codes = Tensor::empty({N, C}, DType::e5m2, device, MemCategory::workspace);
  if (request->codes) p.dy_codes = codes;
  if (request->codes_t) p.dy_codes_t = Tensor::empty({C, N}, DType::e5m2, device, MemCategory::workspace);
  p.dy_stats = Tensor::empty({k::cast_stats_floats(C)}, DType::f32, device, MemCategory::workspace);
  CUDA_CHECK(cudaMemsetAsync(p.dy_stats.raw(), 0, p.dy_stats.nbytes(), k::compute_stream()));
  float* stats = p.dy_stats.data<float>();
  const k::LayerNormDyCodes dy{
      .codes = codes.data<uint8_t>(),
      .codes_t = request->codes_t ? p.dy_codes_t.data<uint8_t>() : nullptr,
      .scale = request->scale,
      .stats = {.amax = stats + k::cast_stats_amax_index(C),
                .saturated = reinterpret_cast<unsigned long long*>(stats + k::cast_stats_amax_index(C) + 2),
                .colsum = request->colsum ? stats : nullptr}};
  backward(dinp, dw, db, dout, inp, w, mean, rstd, &dy);
  p.materialize = [dinp](const Tensor&, const Tensor&) { return dinp; };
  cell->pending = std::move(p);
  return true;
}

}  // namespace fp8t::cuda_ops
