// CUDA launchers of the linear op (see linear_cuda.h): check devices, dtypes and shapes, then call
// kernels/matmul.cuh on the compute stream; and gelu_mlp's CUDA path, the GELU in the cuBLASLt epilogues.
#include "ops/linear_cuda.h"

#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/op_common.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias) {
  const char* op = "matmul_forward";
  expect(inp, DType::bf16, op, "inp");
  expect(weight, DType::bf16, op, "weight");
  expect_float(out, op, "out");
  FP8T_CHECK(weight.ndim() == 2, "{}: weight must be (N, K), got {}", op, weight.str());
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(inp);
  FP8T_CHECK(inp.dim(-1) == K, "{}: inp {} does not match weight {}", op, inp.str(), weight.str());
  FP8T_CHECK(out.dim(-1) == N && rows_of(out) == M, "{}: out {} should be ({} rows, {})", op, out.str(), M, N);
  if (bias) {
    expect(*bias, out.dtype(), op, "bias");
    expect_numel(*bias, N, op, "bias");
  }
  k::matmul_forward(out.raw(), out.dtype(), inp.data<bf16>(), weight.data<bf16>(), bias ? bias->raw() : nullptr,
                    to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), k::compute_stream());
}

void matmul_forward_gelu(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const char* op = "matmul_forward_gelu";
  expect(inp, DType::bf16, op, "inp");
  expect(weight, DType::bf16, op, "weight");
  expect(bias, DType::bf16, op, "bias");
  expect(out, DType::bf16, op, "out");
  expect(pre, DType::bf16, op, "pre");
  FP8T_CHECK(weight.ndim() == 2, "{}: weight must be (N, K), got {}", op, weight.str());
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(inp);
  FP8T_CHECK(inp.dim(-1) == K, "{}: inp {} does not match weight {}", op, inp.str(), weight.str());
  FP8T_CHECK(out.dim(-1) == N && rows_of(out) == M, "{}: out {} should be ({} rows, {})", op, out.str(), M, N);
  expect_numel(pre, M * N, op, "pre");
  expect_numel(bias, N, op, "bias");
  k::matmul_forward_gelu(out.data<bf16>(), pre.data<bf16>(), inp.data<bf16>(), weight.data<bf16>(), bias.data<bf16>(),
                         to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), k::compute_stream());
}

void matmul_backward_dgelu(Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre) {
  const char* op = "matmul_backward_dgelu";
  expect(dpre, DType::bf16, op, "dpre");
  expect(dout, DType::bf16, op, "dout");
  expect(weight, DType::bf16, op, "weight");
  expect(pre, DType::bf16, op, "pre");
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(dout);
  FP8T_CHECK(dout.dim(-1) == N, "{}: dout {} does not match weight {}", op, dout.str(), weight.str());
  expect_numel(dpre, M * K, op, "dpre");
  expect_numel(pre, M * K, op, "pre");
  k::matmul_backward_input_dgelu(dpre.data<bf16>(), dout.data<bf16>(), weight.data<bf16>(), pre.data<bf16>(),
                                 to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), k::compute_stream());
}

void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, bool accumulate_dinp, bool accumulate_dweight) {
  const char* op = "matmul_backward";
  expect(dout, DType::bf16, op, "dout");
  expect(inp, DType::bf16, op, "inp");
  expect(weight, DType::bf16, op, "weight");
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(inp);
  FP8T_CHECK(inp.dim(-1) == K && dout.dim(-1) == N && rows_of(dout) == M, "{}: dout {}, inp {}, weight {} disagree", op,
             dout.str(), inp.str(), weight.str());
  const cudaStream_t s = k::compute_stream();
  if (dinp) {
    expect(*dinp, DType::bf16, op, "dinp");
    expect_numel(*dinp, M * K, op, "dinp");
    k::matmul_backward_input(dinp->data<bf16>(), dout.data<bf16>(), weight.data<bf16>(), to_int(M, op, "M"),
                             to_int(K, op, "K"), to_int(N, op, "N"), accumulate_dinp, s);
  }
  if (dweight) {
    FP8T_CHECK(dweight->device().is_cuda() && (dweight->dtype() == DType::f32 || dweight->dtype() == DType::bf16),
               "{}: dweight must be a CUDA f32 or bf16 tensor, got {}", op, dweight->str());
    expect_numel(*dweight, N * K, op, "dweight");
    k::matmul_backward_weight(dweight->raw(), dweight->dtype(), dout.data<bf16>(), inp.data<bf16>(),
                              to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), accumulate_dweight, s);
  }
  if (dbias) {
    expect_numel(*dbias, N, op, "dbias");
    // The column sums accumulate in f32: a bf16 gradient gets them through an f32 temporary.
    const bool direct = dbias->dtype() == DType::f32;
    FP8T_CHECK(direct || dbias->dtype() == DType::bf16, "{}: dbias must be f32 or bf16, got {}", op, dbias->str());
    Tensor sums = direct ? *dbias : Tensor::zeros({N}, DType::f32, dbias->device(), MemCategory::workspace);
    k::matmul_backward_bias(sums.data<float>(), dout.data<bf16>(), to_int(M, op, "M"), to_int(N, op, "N"), s);
    if (!direct) add_(*dbias, sums);
  }
}

}  // namespace fp8t::cuda_ops

namespace fp8t::detail {

using namespace ops_detail;

Var gelu_mlp_cuda(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2, LinearBias b2_at) {
  const Tensor& xv = x->value;
  for (const Var* p : {&w1, &b1, &w2, &b2}) {
    check_same_dtype("gelu_mlp", xv, (*p)->value);
    check_same_device("gelu_mlp", xv, (*p)->value);
  }
  const int64_t IC = xv.dim(-1), H = w1->value.dim(0), OC = w2->value.dim(0), M = xv.numel() / IC;
  FP8T_CHECK(b1->value.numel() == H && b2->value.numel() == OC, "gelu_mlp: biases {} and {} must have {} and {} elements",
             b1->value.str(), b2->value.str(), H, OC);
  Tensor pre = Tensor::empty({M, H}, DType::bf16, xv.device(), MemCategory::activations);
  Tensor h = Tensor::empty({M, H}, DType::bf16, xv.device(), MemCategory::activations);
  Shape oshape = xv.shape();
  oshape.back() = OC;
  Tensor out = Tensor::empty(oshape, DType::bf16, xv.device(), MemCategory::activations);
  cuda_ops::matmul_forward_gelu(h, pre, xv.view({M, IC}), w1->value, b1->value);
  Tensor out2 = out.view({M, OC});
  cuda_ops::matmul_forward(out2, h, w2->value, b2_at == LinearBias::in_gemm ? &b2->value : nullptr);
  Var y = make_output(std::move(out));
  if (needs_grad(x, w1, b1, w2, b2)) {
    y->requires_grad = true;
    y->grad_cell->dy_colsum_request = b2->requires_grad;  // b2's gradient may come as column sums (take_dy_colsum)
    current_tape()->record("gelu_mlp", [x, w1, b1, w2, b2, pre, h, yg = grad_ref(y), M, IC, H, OC] {
      const Tensor dout = grad_of(yg).view({M, OC});
      bool accumulate_w2 = true;
      Tensor dw2 = w2->requires_grad ? grad_for_write(w2, accumulate_w2) : Tensor();
      Tensor db2 = b2->requires_grad ? grad_of(b2) : Tensor();
      take_dy_colsum(yg, db2);
      if (dw2.defined() || db2.defined())
        cuda_ops::matmul_backward(nullptr, or_null(dw2), or_null(db2), dout, h, w2->value, true, accumulate_w2);
      // (needs_grad() is false here: the tape does not record during backward.)
      if (!x->requires_grad && !w1->requires_grad && !b1->requires_grad) return;
      const Tensor& xv = value_of(x);  // x may have been released for recompute
      // d(pre) straight from the second GEMM's epilogue: no GELU pass, no zero-filled buffers.
      Tensor dpre = Tensor::empty({M, H}, DType::bf16, pre.device(), MemCategory::activations);
      cuda_ops::matmul_backward_dgelu(dpre, dout, w2->value, pre);
      bool accumulate = true, accumulate_w1 = true;
      Tensor dx = x->requires_grad ? grad_for_write(x, accumulate).view({M, IC}) : Tensor();
      Tensor dw1 = w1->requires_grad ? grad_for_write(w1, accumulate_w1) : Tensor();
      Tensor db1 = b1->requires_grad ? grad_of(b1) : Tensor();
      cuda_ops::matmul_backward(or_null(dx), or_null(dw1), or_null(db1), dpre, xv.view({M, IC}), w1->value,
                                accumulate, accumulate_w1);
    });
    mark_gradient_read_only(y, {&x, &w1, &b1, &w2, &b2});
  }
  watch_op("gelu_mlp", y, {&x, &w1, &b1, &w2, &b2});
  return y;
}

}  // namespace fp8t::detail
