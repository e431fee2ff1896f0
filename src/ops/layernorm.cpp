// The LayerNorm op.
#include <utility>

#include "ops/cpu/layernorm.h"
#include "ops/layernorm_cuda.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

namespace ops_detail {

Var layernorm_output(const Var& x, const Var& w, const Var& b, Tensor out, Tensor mean, Tensor rstd) {
  const int64_t C = x->value.dim(-1), N = x->value.numel() / C;
  Var y = make_output(std::move(out));
  if (needs_grad(x, w, b)) {
    y->requires_grad = true;
    // x = add(a, b) recorded just before: this backward finishes x's gradient, which may be b's dy codes too.
    current_tape()->record("layernorm", [x, w, b, yg = grad_ref(y), mean, rstd, N, C,
                                         residual = residual_dy_cell(x)] {
      const Tensor& dout = grad_of(yg);
      dispatch(
          "layernorm backward", dout,
          [&] {
            Tensor dx = grad_or_scratch(x, x->value.dtype());
            GradSink dw(w, DType::f32, /*scratch=*/true), db(b, DType::f32, /*scratch=*/true);
            cuda_ops::layernorm_backward_residual(dx, dw.tensor(), db.tensor(), dout, x->value, w->value, mean, rstd,
                                                  residual);
            dw.commit();
            db.commit();
          },
          [&]<typename F>() {
            GradSink dw(w, dout.dtype()), db(b, dout.dtype());
            cpu::layernorm_backward<F>(grad_ptr<F>(x, "layernorm"), dw.ptr<F>(), db.ptr<F>(), cptr<F>(dout),
                                       cptr<F>(x->value), cptr<F>(w->value), cptr<F>(mean), cptr<F>(rstd), N, C);
            dw.commit();
            db.commit();
          });
    });
  }
  watch_op("layernorm", y, {&x, &w, &b});
  return y;
}

}  // namespace ops_detail

Var layernorm(const Var& x, const Var& w, const Var& b) {
  const Tensor& xv = x->value;
  FP8T_CHECK(xv.ndim() >= 1, "layernorm: x must have at least one dimension, got {}", xv.str());
  const int64_t C = xv.dim(-1), N = xv.numel() / C;
  FP8T_CHECK(w->value.numel() == C && b->value.numel() == C, "layernorm: w {} and b {} must have C = {} elements",
             w->value.str(), b->value.str(), C);
  check_same_dtype("layernorm", xv, w->value);
  check_same_dtype("layernorm", xv, b->value);
  check_same_device("layernorm", xv, w->value);
  check_same_device("layernorm", xv, b->value);
  const DType stat_dtype = xv.device().is_cuda() ? DType::f32 : xv.dtype();  // (N) mean and rstd
  Tensor out = Tensor::empty(xv.shape(), xv.dtype(), xv.device(), MemCategory::activations);
  Tensor mean = Tensor::empty({N}, stat_dtype, xv.device(), MemCategory::activations);
  Tensor rstd = Tensor::empty({N}, stat_dtype, xv.device(), MemCategory::activations);
  dispatch(
      "layernorm", xv, [&] { cuda_ops::layernorm_forward(out, mean, rstd, xv, w->value, b->value); },
      [&]<typename F>() {
        cpu::layernorm_forward<F>(out.data<F>(), mean.data<F>(), rstd.data<F>(), cptr<F>(xv), cptr<F>(w->value),
                                  cptr<F>(b->value), N, C);
      });
  return layernorm_output(x, w, b, std::move(out), std::move(mean), std::move(rstd));
}

Var layernorm(const Var& x, const Var& w, const Var& b, RowStats* from_add) {
  if (!from_add || !from_add->normed) return layernorm(x, w, b);
  FP8T_CHECK(from_add->norm_w == w && from_add->norm_b == b,
             "layernorm: the add that made x wrote the output of another LayerNorm");
  return std::exchange(from_add->normed, nullptr);
}

}  // namespace fp8t
