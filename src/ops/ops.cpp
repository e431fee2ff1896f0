// The differentiable ops: argument checks, output allocation, dispatch to the CPU reference
// (f32/f64) or cuda_ops, and one tape node per op whose closure holds only what backward reads.
#include "ops/ops.h"

#include <algorithm>
#include <vector>

#include "autograd/finite_watch.h"
#include "fp8/saved.h"
#include "ops/cpu/reference.h"
#include "ops/dispatch.h"
#include "ops/grad_sink.h"

namespace fp8t {

using ops_detail::GradSink;
using ops_detail::on_cpu;

namespace {

Var make_output(Tensor value) { return make_var(std::move(value)); }

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  FP8T_CHECK(a.device() == b.device(), "{}: {} and {} are on different devices; move them to one device", op,
             a.str(), b.str());
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  FP8T_CHECK(a.dtype() == b.dtype(), "{}: {} and {} have different dtypes; cast them to one dtype", op, a.str(),
             b.str());
}

// The gradient of v as F* for the CPU reference, or null when v needs none.
template <typename F>
F* grad_ptr(const Var& v, const char* op) {
  if (!v || !v->requires_grad) return nullptr;
  Tensor& g = grad_of(v);
  const Tensor& value = value_of(v);
  FP8T_CHECK(g.device().is_cpu() && g.dtype() == value.dtype() && g.numel() == value.numel(),
             "{}: gradient {} does not match its value {} (CPU ops need same-dtype gradients)", op, g.str(),
             value.str());
  return g.data<F>();
}

#ifdef FP8T_HAVE_CUDA
// cuda_ops take gradients by reference; an input that needs none gets a throwaway buffer.
Tensor grad_or_scratch(const Var& v, DType scratch_dtype) {
  if (v->requires_grad) return grad_of(v);
  return zeros_like(v->value, scratch_dtype);
}

// cuda_ops take optional gradients as pointers: null for one that is not wanted (undefined).
Tensor* or_null(Tensor& t) { return t.defined() ? &t : nullptr; }
#endif

#ifdef FP8T_HAVE_CUDA
// The gradient of v for an op that can overwrite or accumulate: one that does not exist yet is
// allocated uninitialised and `accumulate` is false, so the op writes it without a zero fill.
Tensor grad_for_write(const Var& v, bool& accumulate) {
  accumulate = grad_exists(v);
  if (!accumulate) {
    const Tensor& value = value_of(v);
    v->grad = Tensor::empty(value.shape(), value.dtype(), value.device(), MemCategory::activations);
  }
  return v->grad;
}
#endif

template <typename F>
const F* cptr(const Tensor& t) {
  return t.data<F>();
}

}  // namespace

// ---------------------------------------------------------------- embedding

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
  if (tokens.device().is_cuda()) {
    FP8T_ON_CUDA("embedding", cuda_ops::embedding_forward(out, tokens, wte->value, wpe->value));
  } else {
    const int64_t Vp = wte->value.dim(0);
    const int32_t* tok = tokens.data<int32_t>();
    for (int64_t i = 0; i < tokens.numel(); ++i)
      FP8T_CHECK(tok[i] >= 0 && tok[i] < Vp, "embedding: token {} at position {} is outside [0, {})", tok[i], i,
                 Vp);
    on_cpu(out.dtype(), "embedding", [&]<typename F>() {
      cpu::embedding_forward<F>(out.data<F>(), tok, cptr<F>(wte->value), cptr<F>(wpe->value), B, T, C);
    });
  }
  Var y = make_output(std::move(out));
  if (needs_grad(wte, wpe)) {
    y->requires_grad = true;
    current_tape()->record("embedding", [tokens, wte, wpe, yg = grad_ref(y), B, T, C] {
      const Tensor& dout = grad_of(yg);
      if (dout.device().is_cuda()) {
        FP8T_ON_CUDA("embedding backward", {
          GradSink dwte(wte, DType::f32, /*scratch=*/true), dwpe(wpe, DType::f32, /*scratch=*/true);
          cuda_ops::embedding_backward(dwte.tensor(), dwpe.tensor(), dout, tokens);
          dwte.commit();
          dwpe.commit();
        });
        return;
      }
      on_cpu(dout.dtype(), "embedding backward", [&]<typename F>() {
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

// ---------------------------------------------------------------- linear

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

// ---------------------------------------------------------------- GELU MLP

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

// ---------------------------------------------------------------- layernorm

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
  const bool on_gpu = xv.device().is_cuda();
  const DType stat_dtype = on_gpu ? DType::f32 : xv.dtype();  // (N) mean and rstd
  Tensor out = Tensor::empty(xv.shape(), xv.dtype(), xv.device(), MemCategory::activations);
  Tensor mean = Tensor::empty({N}, stat_dtype, xv.device(), MemCategory::activations);
  Tensor rstd = Tensor::empty({N}, stat_dtype, xv.device(), MemCategory::activations);
  if (on_gpu) {
    FP8T_ON_CUDA("layernorm", cuda_ops::layernorm_forward(out, mean, rstd, xv, w->value, b->value));
  } else {
    on_cpu(xv.dtype(), "layernorm", [&]<typename F>() {
      cpu::layernorm_forward<F>(out.data<F>(), mean.data<F>(), rstd.data<F>(), cptr<F>(xv), cptr<F>(w->value),
                                cptr<F>(b->value), N, C);
    });
  }
  Var y = make_output(std::move(out));
  if (needs_grad(x, w, b)) {
    y->requires_grad = true;
    current_tape()->record("layernorm", [x, w, b, yg = grad_ref(y), mean, rstd, N, C] {
      const Tensor& dout = grad_of(yg);
      if (dout.device().is_cuda()) {
        FP8T_ON_CUDA("layernorm backward", {
          Tensor dx = grad_or_scratch(x, x->value.dtype());
          GradSink dw(w, DType::f32, /*scratch=*/true), db(b, DType::f32, /*scratch=*/true);
          cuda_ops::layernorm_backward(dx, dw.tensor(), db.tensor(), dout, x->value, w->value, mean, rstd);
          dw.commit();
          db.commit();
        });
        return;
      }
      on_cpu(dout.dtype(), "layernorm backward", [&]<typename F>() {
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

// ---------------------------------------------------------------- gelu

Var gelu(const Var& x, bool store_fp8) {
  const bool save_fp8 = store_fp8 && needs_grad(x);
  Fp8Saved saved;
  // The forward sees what the backward will: x's value becomes its round trip dequant(q(x)), in place
  // (ops.h: nothing else may need x unrounded).
  if (save_fp8) saved = fp8_save_inplace(x->value);
  const Tensor& xv = x->value;
  Tensor out = Tensor::empty(xv.shape(), xv.dtype(), xv.device(), MemCategory::activations);
  if (xv.device().is_cuda()) {
    FP8T_ON_CUDA("gelu", cuda_ops::gelu_forward(out, xv));
  } else {
    on_cpu(xv.dtype(), "gelu",
           [&]<typename F>() { cpu::gelu_forward<F>(out.data<F>(), cptr<F>(xv), xv.numel()); });
  }
  Var y = make_output(std::move(out));
  if (needs_grad(x)) {
    y->requires_grad = true;
    // Holds x itself, or only its FP8 codes.
    current_tape()->record("gelu", [xg = grad_ref(x), x_kept = save_fp8 ? Var() : x, saved, yg = grad_ref(y)] {
      const Tensor& dout = grad_of(yg);
      const Tensor xin = x_kept ? value_of(x_kept) : fp8_restore(saved, MemCategory::workspace);
      if (dout.device().is_cuda()) {
        FP8T_ON_CUDA("gelu backward", cuda_ops::gelu_backward(grad_of(xg), xin, dout));
        return;
      }
      on_cpu(dout.dtype(), "gelu backward", [&]<typename F>() {
        cpu::gelu_backward<F>(grad_of(xg).data<F>(), cptr<F>(xin), cptr<F>(dout), dout.numel());
      });
    });
  }
  watch_op("gelu", y, {&x});
  return y;
}

// ---------------------------------------------------------------- add

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

// ---------------------------------------------------------------- attention

Var attention(const Var& qkv, int n_head, bool store_fp8) {
  FP8T_CHECK(qkv->value.ndim() == 3 && qkv->value.dim(2) % 3 == 0, "attention: qkv must be (B, T, 3C), got {}",
             qkv->value.str());
  const bool save_fp8 = store_fp8 && needs_grad(qkv);
  Fp8Saved saved;
  // With FP8 storage the forward runs on dequant(q(qkv)), which replaces qkv's value in place (ops.h),
  // so the backward's recomputed softmax matches the forward's logsumexp exactly.
  if (save_fp8) saved = fp8_save_inplace(qkv->value);
  const Tensor& xv = qkv->value;
  const int B = static_cast<int>(xv.dim(0)), T = static_cast<int>(xv.dim(1)), C = static_cast<int>(xv.dim(2) / 3);
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "attention: C = {} is not divisible by n_head = {}", C, n_head);
  const bool on_gpu = xv.device().is_cuda();
  Tensor out = Tensor::empty({B, T, C}, xv.dtype(), xv.device(), MemCategory::activations);
  // (B, NH, T) log-sum-exp of each score row: all that backward needs besides qkv and out.
  Tensor lse = Tensor::empty({B, n_head, T}, on_gpu ? DType::f32 : xv.dtype(), xv.device(), MemCategory::activations);
  if (on_gpu) {
    FP8T_ON_CUDA("attention", cuda_ops::attention_forward(out, lse, xv, n_head));
  } else {
    on_cpu(xv.dtype(), "attention", [&]<typename F>() {
      cpu::attention_forward<F>(out.data<F>(), lse.data<F>(), cptr<F>(xv), B, T, C, n_head);
    });
  }
  Var y = make_output(std::move(out));
  if (needs_grad(qkv)) {
    y->requires_grad = true;
    // Holds qkv itself, or only its FP8 codes.
    current_tape()->record("attention", [qg = grad_ref(qkv), qkv_kept = save_fp8 ? Var() : qkv, saved, y, lse,
                                         n_head, B, T, C] {
      const Tensor& dout = grad_of(y);
      const Tensor qv = qkv_kept ? value_of(qkv_kept) : fp8_restore(saved, MemCategory::workspace);
      // The output, or where the projection serves it from its FP8 codes (fp8_linear's serve_input) their
      // dequantized values: delta = rowsum(dO * O) then reads the O that the projection read.
      const Tensor& ov = value_of(y);
      if (dout.device().is_cuda()) {
        FP8T_ON_CUDA("attention backward",
                     cuda_ops::attention_backward(grad_of(qg), dout, qv, ov, lse, n_head));
        return;
      }
      on_cpu(dout.dtype(), "attention backward", [&]<typename F>() {
        cpu::attention_backward<F>(grad_of(qg).data<F>(), cptr<F>(dout), cptr<F>(qv), cptr<F>(ov),
                                   cptr<F>(lse), B, T, C, n_head);
      });
    });
  }
  watch_op("attention", y, {&qkv});
  return y;
}

// ---------------------------------------------------------------- cross-entropy

Var cross_entropy(const Var& logits, const Tensor& targets, int64_t vocab_size) {
  const Tensor& lv = logits->value;
  FP8T_CHECK(lv.ndim() == 3, "cross_entropy: logits must be (B, T, Vp), got {}", lv.str());
  FP8T_CHECK(targets.dtype() == DType::i32 && targets.ndim() == 2 && targets.dim(0) == lv.dim(0) &&
                 targets.dim(1) == lv.dim(1),
             "cross_entropy: targets must be i32 (B, T) matching logits {}, got {}", lv.str(), targets.str());
  const int64_t Vp = lv.dim(2), BT = lv.dim(0) * lv.dim(1), V = vocab_size;
  FP8T_CHECK(V > 0 && V <= Vp, "cross_entropy: vocab_size {} must be in [1, Vp = {}]", V, Vp);
  check_same_device("cross_entropy", lv, targets);
  Tensor loss;  // (1) mean over the B*T tokens
  Tensor lse;   // (B*T) per-token logsumexp, kept for the CUDA backward
  if (lv.device().is_cuda()) {
    FP8T_ON_CUDA("cross_entropy", {
      Tensor losses = Tensor::empty({BT}, DType::f32, lv.device(), MemCategory::activations);
      lse = Tensor::empty({BT}, DType::f32, lv.device(), MemCategory::activations);
      loss = Tensor::empty({1}, DType::f32, lv.device(), MemCategory::activations);
      cuda_ops::crossentropy_forward(losses, lse, &loss, lv, targets, V);  // the mean stays on the device
    });
  } else {
    const int32_t* tgt = targets.data<int32_t>();
    for (int64_t i = 0; i < BT; ++i)
      FP8T_CHECK(tgt[i] >= 0 && tgt[i] < V, "cross_entropy: target {} at position {} is outside [0, {})", tgt[i],
                 i, V);
    loss = Tensor::empty({1}, lv.dtype(), lv.device(), MemCategory::activations);
    on_cpu(lv.dtype(), "cross_entropy", [&]<typename F>() {
      std::vector<F> losses(static_cast<size_t>(BT));
      cpu::crossentropy_forward<F>(losses.data(), cptr<F>(lv), tgt, BT, V, Vp);
      double sum = 0.0;
      for (F l : losses) sum += l;
      loss.data<F>()[0] = static_cast<F>(sum / double(BT));
    });
  }
  Var y = make_output(std::move(loss));
  if (needs_grad(logits)) {
    y->requires_grad = true;
    current_tape()->record("cross_entropy", [logits, targets, y, lse, BT, V, Vp] {
      const Tensor& dy = grad_of(y);
      if (dy.device().is_cuda()) {
        // Each token's loss gets d(mean)/d(loss_i) = dy / BT, read by the kernel from the device. The
        // fused kernel overwrites dlogits, so the logits must feed nothing but this loss (as the
        // lm_head output does).
        FP8T_ON_CUDA("cross_entropy backward", {
          // In place: d(logits) overwrites the logits (nothing else reads them), saving a (B, T, Vp)
          // buffer and its zero fill.
          if (!grad_exists(logits)) logits->grad = logits->value;
          cuda_ops::crossentropy_backward(logits->grad, logits->value, lse, targets, dy,
                                          1.0f / static_cast<float>(BT), V);
        });
        return;
      }
      on_cpu(dy.dtype(), "cross_entropy backward", [&]<typename F>() {
        std::vector<F> dlosses(static_cast<size_t>(BT), static_cast<F>(double(dy.data<F>()[0]) / double(BT)));
        cpu::crossentropy_backward<F>(grad_ptr<F>(logits, "cross_entropy"), cptr<F>(logits->value),
                                      targets.data<int32_t>(), dlosses.data(), BT, V, Vp);
      });
    });
  }
  watch_op("cross_entropy", y, {&logits});
  return y;
}

// ---------------------------------------------------------------- chunked lm_head + cross-entropy

Var lm_head_loss(const Var& h, const Var& w, const Tensor& targets, int64_t vocab_size, int64_t chunk_rows,
                 float grad_scale) {
  const Tensor& hv = h->value;
  const Tensor& wv = w->value;
  FP8T_CHECK(hv.ndim() == 3 && wv.ndim() == 2 && hv.dim(2) == wv.dim(1),
             "lm_head_loss: h (B, T, C) = {} does not match w (Vp, C) = {}", hv.str(), wv.str());
  FP8T_CHECK(targets.dtype() == DType::i32 && targets.numel() == hv.dim(0) * hv.dim(1),
             "lm_head_loss: targets must be i32 (B, T) matching h {}, got {}", hv.str(), targets.str());
  check_same_dtype("lm_head_loss", hv, wv);
  check_same_device("lm_head_loss", hv, wv);
  check_same_device("lm_head_loss", hv, targets);
  const int64_t BT = hv.dim(0) * hv.dim(1), C = hv.dim(2), Vp = wv.dim(0), V = vocab_size;
  FP8T_CHECK(V > 0 && V <= Vp, "lm_head_loss: vocab_size {} must be in [1, Vp = {}]", V, Vp);
  FP8T_CHECK(chunk_rows > 0, "lm_head_loss: chunk_rows must be positive, got {}", chunk_rows);
  const bool train = needs_grad(h, w);
  const Device dev = hv.device();
  const Tensor h2 = hv.view({BT, C});
  // d(h) for the assumed seed, filled chunk by chunk during the forward pass.
  Tensor dh = train ? Tensor::empty({BT, C}, hv.dtype(), dev, MemCategory::activations) : Tensor();
  Tensor loss;
  if (dev.is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    Tensor losses = Tensor::empty({BT}, DType::f32, dev, MemCategory::activations);
    Tensor one = Tensor::empty({1}, DType::f32, dev, MemCategory::activations);
    if (train) fill_(one, 1.0f);
    Tensor dw = train && w->requires_grad ? grad_of(w) : Tensor();
    for (int64_t r0 = 0; r0 < BT; r0 += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, BT - r0);
      const Tensor hc = h2.slice_flat(r0 * C, {rows, C});
      Tensor logits = Tensor::empty({rows, Vp}, DType::bf16, dev, MemCategory::activations);
      cuda_ops::matmul_forward(logits, hc, wv, nullptr);
      Tensor lc = losses.slice_flat(r0, {rows});
      Tensor lse = Tensor::empty({rows}, DType::f32, dev, MemCategory::activations);
      const Tensor tc = targets.view({BT}).slice_flat(r0, {rows});
      cuda_ops::crossentropy_forward(lc, lse, nullptr, logits, tc, V);
      if (!train) continue;
      // d(logits) in place, then d(h) for these rows (overwritten) and d(w) (accumulated).
      cuda_ops::crossentropy_backward(logits, logits, lse, tc, one, grad_scale / static_cast<float>(BT), V);
      Tensor dhc = dh.slice_flat(r0 * C, {rows, C});
      cuda_ops::matmul_backward(h->requires_grad ? &dhc : nullptr, or_null(dw), nullptr, logits, hc,
                                wv, /*accumulate_dinp=*/false);
    }
    loss = Tensor::empty({1}, DType::f32, dev, MemCategory::activations);
    cuda_ops::mean_of(loss, losses);
#else
    FP8T_FAIL("lm_head_loss: tensor is on a CUDA device but this build has no CUDA");
#endif
  } else {
    const int32_t* tgt = targets.data<int32_t>();
    for (int64_t i = 0; i < BT; ++i)
      FP8T_CHECK(tgt[i] >= 0 && tgt[i] < V, "cross_entropy: target {} at position {} is outside [0, {})", tgt[i], i,
                 V);
    loss = Tensor::empty({1}, hv.dtype(), dev, MemCategory::activations);
    if (train) dh.zero_();
    on_cpu(hv.dtype(), "lm_head_loss", [&]<typename F>() {
      GradSink dw_sink(train ? w : Var(), hv.dtype());
      F* dw = dw_sink.ptr<F>();
      double sum = 0.0;
      std::vector<F> losses, logits, dlogits, dlosses;
      for (int64_t r0 = 0; r0 < BT; r0 += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, BT - r0);
        const F* hc = cptr<F>(hv) + r0 * C;
        logits.assign(static_cast<size_t>(rows * Vp), F(0));
        cpu::matmul_forward<F>(logits.data(), hc, cptr<F>(wv), nullptr, rows, C, Vp);
        losses.resize(static_cast<size_t>(rows));
        cpu::crossentropy_forward<F>(losses.data(), logits.data(), tgt + r0, rows, V, Vp);
        for (F l : losses) sum += l;
        if (!train) continue;
        dlogits.assign(static_cast<size_t>(rows * Vp), F(0));
        dlosses.assign(static_cast<size_t>(rows), static_cast<F>(double(grad_scale) / double(BT)));
        cpu::crossentropy_backward<F>(dlogits.data(), logits.data(), tgt + r0, dlosses.data(), rows, V, Vp);
        F* dhc = h->requires_grad ? dh.data<F>() + r0 * C : nullptr;
        cpu::matmul_backward<F>(dhc, dw, nullptr, dlogits.data(), hc, cptr<F>(wv), rows, C, Vp);
      }
      loss.data<F>()[0] = static_cast<F>(sum / double(BT));
      dw_sink.commit();
    });
  }
  Var y = make_output(std::move(loss));
  if (train) {
    y->requires_grad = true;
    current_tape()->require_seed(grad_scale);
    // d(w) is already in w's gradient; d(h) waits here for the backward pass.
    current_tape()->record("lm_head_loss", [hg = grad_ref(h), dh] {
      if (!hg.requires_grad) return;
      if (!grad_exists(hg))
        hg.cell->grad = dh.view(hg.shape);
      else
        add_(grad_of(hg), dh.view(hg.shape));
    });
  }
  watch_op("lm_head_loss", y, {&h, &w});
  return y;
}

}  // namespace fp8t
