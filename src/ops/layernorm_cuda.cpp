// CUDA launchers of the LayerNorm op (see layernorm_cuda.h): check devices, dtypes and shapes, then call
// kernels/layernorm.cuh on the compute stream.
#include "ops/layernorm_cuda.h"

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

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd) {
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
                        k::compute_stream());
}

}  // namespace fp8t::cuda_ops
