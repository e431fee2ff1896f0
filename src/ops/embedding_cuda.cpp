// CUDA launchers of the embedding op (see embedding_cuda.h): check devices, dtypes and shapes, then call
// kernels/embedding.cuh on the compute stream.
#include "ops/embedding_cuda.h"

#include "kernels/embedding.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  const char* op = "embedding_forward";
  expect(tokens, DType::i32, op, "tokens");
  expect(wte, DType::bf16, op, "wte");
  expect(wpe, DType::bf16, op, "wpe");
  expect(out, DType::bf16, op, "out");
  FP8T_CHECK(tokens.ndim() == 2 && wte.ndim() == 2 && wpe.ndim() == 2, "{}: tokens (B, T), wte (Vp, C), wpe (maxT, C)",
             op);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = wte.dim(1);
  FP8T_CHECK(wpe.dim(1) == C && wpe.dim(0) >= T, "{}: wpe {} does not cover T={} with C={}", op, wpe.str(), T, C);
  expect_shape(out, {B, T, C}, op, "out");
  k::embedding_forward(out.data<bf16>(), tokens.data<int32_t>(), wte.data<bf16>(), wpe.data<bf16>(), to_int(B, op, "B"),
                       to_int(T, op, "T"), to_int(C, op, "C"), k::compute_stream());
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  const char* op = "embedding_backward";
  expect(tokens, DType::i32, op, "tokens");
  expect(dwte, DType::f32, op, "dwte");
  expect(dwpe, DType::f32, op, "dwpe");
  expect(dout, DType::bf16, op, "dout");
  FP8T_CHECK(tokens.ndim() == 2 && dwte.ndim() == 2 && dwpe.ndim() == 2, "{}: tokens (B, T), dwte (Vp, C), dwpe (maxT, C)",
             op);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dwte.dim(1);
  FP8T_CHECK(dwpe.dim(1) == C && dwpe.dim(0) >= T, "{}: dwpe {} does not cover T={} with C={}", op, dwpe.str(), T, C);
  expect_shape(dout, {B, T, C}, op, "dout");
  k::embedding_backward(dwte.data<float>(), dwpe.data<float>(), dout.data<bf16>(), tokens.data<int32_t>(),
                        to_int(B, op, "B"), to_int(T, op, "T"), to_int(C, op, "C"), k::compute_stream());
}

}  // namespace fp8t::cuda_ops
