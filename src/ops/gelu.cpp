// The GELU op (tanh approximation), its input optionally stored as FP8 for backward.
#include "ops/cpu/gelu.h"
#include "ops/gelu_cuda.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var gelu(const Var& x, bool store_fp8) {
  const bool save_fp8 = store_fp8 && needs_grad(x);
  QuantizedTensor saved;
  // The forward sees what the backward will: x's value becomes its round trip dequant(q(x)), in place
  // (ops.h: nothing else may need x unrounded); also without a gradient (a checkpoint's first pass, evaluation),
  // so that it computes what the recorded forward does.
  if (store_fp8) saved = fp8_save_inplace(x->value);
  if (!save_fp8) saved = QuantizedTensor();
  const Tensor& xv = x->value;
  Tensor out = Tensor::empty(xv.shape(), xv.dtype(), xv.device(), MemCategory::activations);
  dispatch(
      "gelu", xv, [&] { cuda_ops::gelu_forward(out, xv); },
      [&]<typename F>() { cpu::gelu_forward<F>(out.data<F>(), cptr<F>(xv), xv.numel()); });
  Var y = make_output(std::move(out));
  if (needs_grad(x)) {
    y->requires_grad = true;
    // Holds x itself, or only its FP8 codes.
    current_tape()->record("gelu", [xg = grad_ref(x), x_kept = save_fp8 ? Var() : x, saved, yg = grad_ref(y)] {
      const Tensor& dout = grad_of(yg);
      const Tensor xin = x_kept ? value_of(x_kept) : fp8_restore(saved, MemCategory::workspace);
      dispatch(
          "gelu backward", dout, [&] { cuda_ops::gelu_backward(grad_of(xg), xin, dout); },
          [&]<typename F>() {
            cpu::gelu_backward<F>(grad_of(xg).data<F>(), cptr<F>(xin), cptr<F>(dout), dout.numel());
          });
    });
  }
  watch_op("gelu", y, {&x});
  return y;
}

}  // namespace fp8t
