// The loss ops: cross-entropy over logits, and the chunked lm_head + cross-entropy.
#include "autograd/finite_watch.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/linear.h"
#include "ops/cross_entropy_cuda.h"
#include "ops/linear_cuda.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

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
  dispatch(
      "cross_entropy", lv,
      [&] {
        Tensor losses = Tensor::empty({BT}, DType::f32, lv.device(), MemCategory::activations);
        lse = Tensor::empty({BT}, DType::f32, lv.device(), MemCategory::activations);
        loss = Tensor::empty({1}, DType::f32, lv.device(), MemCategory::activations);
        cuda_ops::cross_entropy_forward(losses, lse, &loss, lv, targets, V);  // the mean stays on the device
      },
      [&]<typename F>() {
        const int32_t* tgt = targets.data<int32_t>();
        for (int64_t i = 0; i < BT; ++i)
          FP8T_CHECK(tgt[i] >= 0 && tgt[i] < V, "cross_entropy: target {} at position {} is outside [0, {})", tgt[i],
                     i, V);
        loss = Tensor::empty({1}, lv.dtype(), lv.device(), MemCategory::activations);
        std::vector<F> losses(static_cast<size_t>(BT));
        cpu::cross_entropy_forward<F>(losses.data(), cptr<F>(lv), tgt, BT, V, Vp);
        double sum = 0.0;
        for (F l : losses) sum += l;
        loss.data<F>()[0] = static_cast<F>(sum / double(BT));
      });
  Var y = make_output(std::move(loss));
  if (needs_grad(logits)) {
    y->requires_grad = true;
    current_tape()->record("cross_entropy", [logits, targets, y, lse, BT, V, Vp] {
      const Tensor& dy = grad_of(y);
      dispatch(
          "cross_entropy backward", dy,
          [&] {
            // Each token's loss gets d(mean)/d(loss_i) = dy / BT, read by the kernel from the device. The
            // fused kernel overwrites dlogits, so the logits must feed nothing but this loss (as the
            // lm_head output does): in place, d(logits) overwrites the logits, saving a (B, T, Vp) buffer
            // and its zero fill.
            const float dloss_scale = 1.0f / static_cast<float>(BT);
            const bool exists = grad_exists(logits);
            // An FP8 lm_head (without bias) may take the gradient as its own dy cast's codes (Fp8DyRequest): the
            // kernel writes those instead of bf16, and the cast's pass over dlogits is saved. Not under a
            // FiniteWatch; another reader before the lm_head's backward gets the bf16 gradient (materialize).
            const Fp8DyRequest* request = exists || finite_watch() ? nullptr : logits->grad_cell->fp8_dy.get();
            if (request && cuda_ops::cross_entropy_writes_dy_codes(*request, logits->value)) {
              PendingGrad p = cuda_ops::cross_entropy_backward_dy_codes(*request, logits->value, lse, targets, dy,
                                                                        dloss_scale, V);
              p.materialize = [value = logits->value, lse, targets, dy = dy, dloss_scale, V](const Tensor&,
                                                                                           const Tensor&) {
                Tensor g = value;  // in place, as below
                cuda_ops::cross_entropy_backward(g, value, lse, targets, dy, dloss_scale, V);
                return g;
              };
              logits->grad_cell->pending = std::move(p);
              return;
            }
            if (!exists) logits->grad = logits->value;
            cuda_ops::cross_entropy_backward(logits->grad, logits->value, lse, targets, dy, dloss_scale, V);
          },
          [&]<typename F>() {
            std::vector<F> dlosses(static_cast<size_t>(BT), static_cast<F>(double(dy.data<F>()[0]) / double(BT)));
            cpu::cross_entropy_backward<F>(grad_ptr<F>(logits, "cross_entropy"), cptr<F>(logits->value),
                                           targets.data<int32_t>(), dlosses.data(), BT, V, Vp);
          });
    });
  }
  watch_op("cross_entropy", y, {&logits});
  return y;
}

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
  dispatch(
      "lm_head_loss", hv,
      [&] {
        Tensor losses = Tensor::empty({BT}, DType::f32, dev, MemCategory::activations);
        Tensor one = Tensor::empty({1}, DType::f32, dev, MemCategory::activations);
        if (train) fill_(one, 1.0f);
        bool accumulate_w = true;  // false: the first chunk overwrites a stale dw (GradCell::stale)
        Tensor dw = train && w->requires_grad ? grad_for_write(w, accumulate_w) : Tensor();
        for (int64_t r0 = 0; r0 < BT; r0 += chunk_rows) {
          const int64_t rows = std::min(chunk_rows, BT - r0);
          const Tensor hc = h2.slice_flat(r0 * C, {rows, C});
          Tensor logits = Tensor::empty({rows, Vp}, DType::bf16, dev, MemCategory::activations);
          cuda_ops::matmul_forward(logits, hc, wv, nullptr);
          Tensor lc = losses.slice_flat(r0, {rows});
          Tensor lse = Tensor::empty({rows}, DType::f32, dev, MemCategory::activations);
          const Tensor tc = targets.view({BT}).slice_flat(r0, {rows});
          cuda_ops::cross_entropy_forward(lc, lse, nullptr, logits, tc, V);
          if (!train) continue;
          // d(logits) in place, then d(h) for these rows (overwritten) and d(w) (accumulated after the first chunk).
          cuda_ops::cross_entropy_backward(logits, logits, lse, tc, one, grad_scale / static_cast<float>(BT), V);
          Tensor dhc = dh.slice_flat(r0 * C, {rows, C});
          cuda_ops::matmul_backward(h->requires_grad ? &dhc : nullptr, or_null(dw), nullptr, logits, hc,
                                    wv, /*accumulate_dinp=*/false, accumulate_w);
          accumulate_w = true;
        }
        loss = Tensor::empty({1}, DType::f32, dev, MemCategory::activations);
        cuda_ops::mean_of(loss, losses);
      },
      [&]<typename F>() {
        const int32_t* tgt = targets.data<int32_t>();
        for (int64_t i = 0; i < BT; ++i)
          FP8T_CHECK(tgt[i] >= 0 && tgt[i] < V, "cross_entropy: target {} at position {} is outside [0, {})", tgt[i], i,
                     V);
        loss = Tensor::empty({1}, hv.dtype(), dev, MemCategory::activations);
        if (train) dh.zero_();
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
          cpu::cross_entropy_forward<F>(losses.data(), logits.data(), tgt + r0, rows, V, Vp);
          for (F l : losses) sum += l;
          if (!train) continue;
          dlogits.assign(static_cast<size_t>(rows * Vp), F(0));
          dlosses.assign(static_cast<size_t>(rows), static_cast<F>(double(grad_scale) / double(BT)));
          cpu::cross_entropy_backward<F>(dlogits.data(), logits.data(), tgt + r0, dlosses.data(), rows, V, Vp);
          F* dhc = h->requires_grad ? dh.data<F>() + r0 * C : nullptr;
          cpu::matmul_backward<F>(dhc, dw, nullptr, dlogits.data(), hc, cptr<F>(wv), rows, C, Vp);
        }
        loss.data<F>()[0] = static_cast<F>(sum / double(BT));
        dw_sink.commit();
      });
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
