// The embedding op: token + position embeddings, and their gradients.
#include "ops/cpu/embedding.h"
#include "ops/embedding_cuda.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var embedding(const Tensor& tokens, const Var& wte, const Var& wpe) {
  FP8T_CHECK(tokens.dtype() == DType::i32 && tokens.ndim() == 2, "embedding: tokens must be i32 (B, T), got {}",
             tokens.str());
  FP8T_CHECK(wte->value.ndim() == 2 && wpe->value.ndim() == 2 && wte->value.dim(1) == wpe->value.dim(1),
             "embedding: wte (Vp, C) and wpe (maxT, C) must share C, got {} and {}", wte->value.str(),
             wpe->value.str());
  check_same_dtype("embedding", wte->value, wpe->value);
  check_same_device("embedding", tokens, wte->value);
  check_same_device("embedding", tokens, wpe->value);
  const int B = static_cast<int>(tokens.dim(0)), T = static_cast<int>(tokens.dim(1));
  const int C = static_cast<int>(wte->value.dim(1));
  FP8T_CHECK(T <= wpe->value.dim(0), "embedding: sequence length {} exceeds the {} positions of wpe", T,
             wpe->value.dim(0));
  Tensor out = Tensor::empty({B, T, C}, wte->value.dtype(), tokens.device(), MemCategory::activations);
  dispatch(
      "embedding", out, [&] { cuda_ops::embedding_forward(out, tokens, wte->value, wpe->value); },
      [&]<typename F>() {
        const int64_t Vp = wte->value.dim(0);
        const int32_t* tok = tokens.data<int32_t>();
        for (int64_t i = 0; i < tokens.numel(); ++i)
          FP8T_CHECK(tok[i] >= 0 && tok[i] < Vp, "embedding: token {} at position {} is outside [0, {})", tok[i], i,
                     Vp);
        cpu::embedding_forward<F>(out.data<F>(), tok, cptr<F>(wte->value), cptr<F>(wpe->value), B, T, C);
      });
  Var y = make_output(std::move(out));
  if (needs_grad(wte, wpe)) {
    y->requires_grad = true;
    current_tape()->record("embedding", [tokens, wte, wpe, yg = grad_ref(y), B, T, C] {
      const Tensor& dout = grad_of(yg);
      dispatch(
          "embedding backward", dout,
          [&] {
            GradSink dwte(wte, DType::f32, /*scratch=*/true), dwpe(wpe, DType::f32, /*scratch=*/true);
            cuda_ops::embedding_backward(dwte.tensor(), dwpe.tensor(), dout, tokens);
            dwte.commit();
            dwpe.commit();
          },
          [&]<typename F>() {
            GradSink dwte(wte, dout.dtype()), dwpe(wpe, dout.dtype());
            cpu::embedding_backward<F>(dwte.ptr<F>(), dwpe.ptr<F>(), cptr<F>(dout), tokens.data<int32_t>(), B, T, C);
            dwte.commit();
            dwpe.commit();
          });
    });
  }
  watch_op("embedding", y, {&wte, &wpe});
  return y;
}

}  // namespace fp8t
