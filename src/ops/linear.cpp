// The linear op (x @ w^T + b) and the MLP (linear -> GELU -> linear), fused on CUDA in BF16.
#include "ops/cpu/linear.h"
#include "ops/linear_cuda.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var linear(const Var& x, const Var& w, const Var& b, LinearBias bias_at) {
  const Tensor& xv = x->value;
  const Tensor& wv = w->value;
  FP8T_CHECK(xv.ndim() >= 1 && wv.ndim() == 2 && xv.dim(-1) == wv.dim(1),
             "linear: x (..., IC) = {} does not match w (OC, IC) = {}", xv.str(), wv.str());
  const int64_t IC = wv.dim(1), OC = wv.dim(0), M = xv.numel() / IC;
  check_same_dtype("linear", xv, wv);
  check_same_device("linear", xv, wv);
  if (b) {
    FP8T_CHECK(b->value.numel() == OC, "linear: bias {} must have OC = {} elements", b->value.str(), OC);
    check_same_dtype("linear", xv, b->value);
    check_same_device("linear", xv, b->value);
  }
  Shape oshape = xv.shape();
  oshape.back() = OC;
  Tensor out = Tensor::empty(oshape, xv.dtype(), xv.device(), MemCategory::activations);
  const Tensor* gemm_bias = b && bias_at == LinearBias::in_gemm ? &b->value : nullptr;
  dispatch(
      "linear", xv,
      [&] {
        Tensor out2 = out.view({M, OC});
        cuda_ops::matmul_forward(out2, xv.view({M, IC}), wv, gemm_bias);
      },
      [&]<typename F>() {
        cpu::matmul_forward<F>(out.data<F>(), cptr<F>(xv), cptr<F>(wv), gemm_bias ? cptr<F>(*gemm_bias) : nullptr, M,
                               IC, OC);
      });
  Var y = make_output(std::move(out));
  if (needs_grad(x, w, b)) {
    y->requires_grad = true;
    // On CUDA the bias's gradient may come as column sums from the op that finishes dy (take_dy_colsum).
    y->grad_cell->dy_colsum_request = b && b->requires_grad && xv.device().is_cuda();
    current_tape()->record("linear", [x, w, b, yg = grad_ref(y), M, IC, OC] {
      const Tensor& dout = grad_of(yg);
      const Tensor& xv = value_of(x);  // x may have been released for recompute
      dispatch(
          "linear backward", dout,
          [&] {
            bool accumulate = true, accumulate_w = true;
            Tensor dx = x->requires_grad ? grad_for_write(x, accumulate).view({M, IC}) : Tensor();
            Tensor dw = w->requires_grad ? grad_for_write(w, accumulate_w) : Tensor();
            Tensor db = b && b->requires_grad ? grad_of(b) : Tensor();
            take_dy_colsum(yg, db);
            cuda_ops::matmul_backward(or_null(dx), or_null(dw), or_null(db), dout.view({M, OC}), xv.view({M, IC}),
                                      w->value, accumulate, accumulate_w);
          },
          [&]<typename F>() {
            GradSink dw(w, dout.dtype()), db(b, dout.dtype());
            cpu::matmul_backward<F>(grad_ptr<F>(x, "linear"), dw.ptr<F>(), db.ptr<F>(), cptr<F>(dout), cptr<F>(xv),
                                    cptr<F>(w->value), M, IC, OC);
            dw.commit();
            db.commit();
          });
    });
    mark_gradient_read_only(y, {&x, &w, &b});
  }
  watch_op("linear", y, {&x, &w, &b});
  return y;
}

Var gelu_mlp(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2, LinearBias b2_at) {
  const Tensor& xv = x->value;
  const bool fusable = xv.device().is_cuda() && xv.dtype() == DType::bf16 && b1 && b2 && w1->value.ndim() == 2 &&
                       w2->value.ndim() == 2 && xv.ndim() >= 1 && xv.dim(-1) == w1->value.dim(1) &&
                       w2->value.dim(1) == w1->value.dim(0) && xv.dim(-1) % 8 == 0 && w1->value.dim(0) % 8 == 0 &&
                       w2->value.dim(0) % 8 == 0;
  if (fusable) return on_cuda("gelu_mlp", [&] { return detail::gelu_mlp_cuda(x, w1, b1, w2, b2, b2_at); });
  return linear(gelu(linear(x, w1, b1)), w2, b2, b2_at);
}

}  // namespace fp8t
