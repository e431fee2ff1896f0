// The residual add op.
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var add(const Var& a, const Var& b) {
  FP8T_CHECK(a->value.shape() == b->value.shape(), "add: shapes {} and {} differ", a->value.str(), b->value.str());
  check_same_dtype("add", a->value, b->value);
  check_same_device("add", a->value, b->value);
  Tensor out = Tensor::empty(a->value.shape(), a->value.dtype(), a->value.device(), MemCategory::activations);
  if (out.device().is_cuda()) {
    FP8T_ON_CUDA("add", cuda_ops::residual_forward(out, a->value, b->value));
  } else {
    on_cpu(out.dtype(), "add", [&]<typename F>() {
      F* o = out.data<F>();
      const F* pa = cptr<F>(a->value);
      const F* pb = cptr<F>(b->value);
      const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) o[i] = pa[i] + pb[i];
    });
  }
  Var y = make_output(std::move(out));
  if (needs_grad(a, b)) {
    y->requires_grad = true;
    // Only gradient handles are held: add needs neither input's value in backward.
    current_tape()->record("add", [ag = grad_ref(a), bg = grad_ref(b), yg = grad_ref(y)] {
      const Tensor& dout = grad_of(yg);
      // A gradient that does not exist yet takes d(out) as it is instead of a zero fill and an add:
      // `a` shares d(out)'s buffer (y's backward is done, so nothing else writes it), `b` gets a copy
      // (later accumulation into a's gradient must not reach b's). With a == b the shared buffer is
      // then doubled in place, as it should be.
      if (ag.requires_grad) {
        if (!grad_exists(ag) && dout.dtype() == ag.dtype && dout.device() == ag.device)
          ag.cell->grad = dout.view(ag.shape);
        else
          add_(grad_of(ag), dout);
      }
      if (bg.requires_grad) {
        if (!grad_exists(bg) && dout.dtype() == bg.dtype && dout.device() == bg.device) {
          bg.cell->grad = Tensor::empty(bg.shape, bg.dtype, bg.device, MemCategory::activations);
          bg.cell->grad.copy_from(dout);
        } else {
          add_(grad_of(bg), dout);
        }
      }
    });
  }
  watch_op("add", y, {&a, &b});
  return y;
}

}  // namespace fp8t
