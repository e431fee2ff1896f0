// CUDA launchers of the GELU op (see gelu_cuda.h): check devices, dtypes and sizes, then call kernels/gelu.cuh
// on the compute stream.
#include "ops/gelu_cuda.h"

#include "kernels/gelu.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void gelu_forward(Tensor& out, const Tensor& inp) {
  expect(inp, DType::bf16, "gelu_forward", "inp");
  expect(out, DType::bf16, "gelu_forward", "out");
  expect_numel(out, inp.numel(), "gelu_forward", "out");
  k::gelu_forward(out.data<bf16>(), inp.data<bf16>(), inp.numel(), k::compute_stream());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  expect(inp, DType::bf16, "gelu_backward", "inp");
  expect(dout, DType::bf16, "gelu_backward", "dout");
  expect(dinp, DType::bf16, "gelu_backward", "dinp");
  expect_numel(dout, inp.numel(), "gelu_backward", "dout");
  expect_numel(dinp, inp.numel(), "gelu_backward", "dinp");
  k::gelu_backward(dinp.data<bf16>(), inp.data<bf16>(), dout.data<bf16>(), inp.numel(), k::compute_stream());
}

}  // namespace fp8t::cuda_ops
