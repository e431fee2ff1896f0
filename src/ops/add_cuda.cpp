// CUDA launcher of the add op (see add_cuda.h): check devices, dtypes and sizes, then call kernels/add.cuh on
// the compute stream.
#include "ops/add_cuda.h"

#include "kernels/add.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void add_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  expect(a, DType::bf16, "add_forward", "a");
  expect(b, DType::bf16, "add_forward", "b");
  expect(out, DType::bf16, "add_forward", "out");
  expect_numel(b, a.numel(), "add_forward", "b");
  expect_numel(out, a.numel(), "add_forward", "out");
  k::add_forward(out.data<bf16>(), a.data<bf16>(), b.data<bf16>(), a.numel(), k::compute_stream());
}

}  // namespace fp8t::cuda_ops
