// The linear op (x @ w^T + b) and the fused bf16 MLP (linear -> GELU -> linear).
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var linear(const Var& x, const Var& w, const Var& b) {
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
  if (xv.device().is_cuda()) {
    FP8T_ON_CUDA("linear", {
      Tensor out2 = out.view({M, OC});
      cuda_ops::matmul_forward(out2, xv.view({M, IC}), wv, b ? &b->value : nullptr);
    });
  } else {
    on_cpu(xv.dtype(), "linear", [&]<typename F>() {
      cpu::matmul_forward<F>(out.data<F>(), cptr<F>(xv), cptr<F>(wv), b ? cptr<F>(b->value) : nullptr, M, IC, OC);
    });
  }
  Var y = make_output(std::move(out));
  if (needs_grad(x, w, b)) {
    y->requires_grad = true;
    current_tape()->record("linear", [x, w, b, yg = grad_ref(y), M, IC, OC] {
      const Tensor& dout = grad_of(yg);
      const Tensor& xv = value_of(x);  // x may have been released for recompute
      if (dout.device().is_cuda()) {
        FP8T_ON_CUDA("linear backward", {
          bool accumulate = true;
          Tensor dx = x->requires_grad ? grad_for_write(x, accumulate).view({M, IC}) : Tensor();
          Tensor dw = w->requires_grad ? grad_of(w) : Tensor();
          Tensor db = b && b->requires_grad ? grad_of(b) : Tensor();
          cuda_ops::matmul_backward(or_null(dx), or_null(dw), or_null(db), dout.view({M, OC}), xv.view({M, IC}),
                                    w->value, accumulate);
        });
        return;
      }
      on_cpu(dout.dtype(), "linear backward", [&]<typename F>() {
        GradSink dw(w, dout.dtype()), db(b, dout.dtype());
        cpu::matmul_backward<F>(grad_ptr<F>(x, "linear"), dw.ptr<F>(), db.ptr<F>(), cptr<F>(dout), cptr<F>(xv),
                                cptr<F>(w->value), M, IC, OC);
        dw.commit();
        db.commit();
      });
    });
  }
  watch_op("linear", y, {&x, &w, &b});
  return y;
}

#ifdef FP8T_HAVE_CUDA
namespace {
// gelu_mlp on CUDA in BF16: GELU in the cuBLASLt epilogues (see ops.h).
Var gelu_mlp_cuda(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2) {
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
  cuda_ops::matmul_forward(out2, h, w2->value, &b2->value);
  Var y = make_output(std::move(out));
  if (needs_grad(x, w1, b1, w2, b2)) {
    y->requires_grad = true;
    current_tape()->record("gelu_mlp", [x, w1, b1, w2, b2, pre, h, yg = grad_ref(y), M, IC, H, OC] {
      const Tensor dout = grad_of(yg).view({M, OC});
      Tensor dw2 = w2->requires_grad ? grad_of(w2) : Tensor();
      Tensor db2 = b2->requires_grad ? grad_of(b2) : Tensor();
      if (dw2.defined() || db2.defined())
        cuda_ops::matmul_backward(nullptr, or_null(dw2), or_null(db2), dout, h, w2->value);
      // (needs_grad() is false here: the tape does not record during backward.)
      if (!x->requires_grad && !w1->requires_grad && !b1->requires_grad) return;
      const Tensor& xv = value_of(x);  // x may have been released for recompute
      // d(pre) straight from the second GEMM's epilogue: no GELU pass, no zero-filled buffers.
      Tensor dpre = Tensor::empty({M, H}, DType::bf16, pre.device(), MemCategory::activations);
      cuda_ops::matmul_backward_dgelu(dpre, dout, w2->value, pre);
      bool accumulate = true;
      Tensor dx = x->requires_grad ? grad_for_write(x, accumulate).view({M, IC}) : Tensor();
      Tensor dw1 = w1->requires_grad ? grad_of(w1) : Tensor();
      Tensor db1 = b1->requires_grad ? grad_of(b1) : Tensor();
      cuda_ops::matmul_backward(or_null(dx), or_null(dw1), or_null(db1), dpre, xv.view({M, IC}), w1->value,
                                accumulate);
    });
  }
  watch_op("gelu_mlp", y, {&x, &w1, &b1, &w2, &b2});
  return y;
}
}  // namespace
#endif

Var gelu_mlp(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2) {
#ifdef FP8T_HAVE_CUDA
  const Tensor& xv = x->value;
  const bool fusable = xv.device().is_cuda() && xv.dtype() == DType::bf16 && b1 && b2 && w1->value.ndim() == 2 &&
                       w2->value.ndim() == 2 && xv.ndim() >= 1 && xv.dim(-1) == w1->value.dim(1) &&
                       w2->value.dim(1) == w1->value.dim(0) && xv.dim(-1) % 8 == 0 && w1->value.dim(0) % 8 == 0 &&
                       w2->value.dim(0) % 8 == 0;
  if (fusable) return gelu_mlp_cuda(x, w1, b1, w2, b2);
#endif
  return linear(gelu(linear(x, w1, b1)), w2, b2);
}

}  // namespace fp8t
