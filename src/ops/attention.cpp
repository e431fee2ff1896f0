// The causal self-attention op over packed qkv, its input optionally stored as FP8.
#include "autograd/finite_watch.h"
#include "ops/attention_cuda.h"
#include "ops/cpu/attention.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var attention(const Var& qkv, int n_head, bool store_fp8) {
  FP8T_CHECK(qkv->value.ndim() == 3 && qkv->value.dim(2) % 3 == 0, "attention: qkv must be (B, T, 3C), got {}",
             qkv->value.str());
  // With FP8 storage forward and backward both run on dequant(q(qkv)), so the backward's recomputed softmax
  // matches the forward's logsumexp exactly: where the kernels read the saved codes themselves (read_codes: CUDA,
  // head size 64 on a Hopper), both read them; elsewhere the round trip replaces qkv's value in place (ops.h). A
  // forward without a tape rounds the same way (a checkpoint's first pass, evaluation): it computes what the
  // recorded forward and its gradients do.
  const bool read_codes = store_fp8 && qkv->value.device().is_cuda() &&
                          on_cuda("attention", [&] { return cuda_ops::attention_reads_codes(qkv->value, n_head); });
  QuantizedTensor saved;
  if (store_fp8) saved = read_codes ? fp8_save(qkv->value, nullptr) : fp8_save_inplace(qkv->value);
  const Tensor& xv = qkv->value;
  const int B = static_cast<int>(xv.dim(0)), T = static_cast<int>(xv.dim(1)), C = static_cast<int>(xv.dim(2) / 3);
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "attention: C = {} is not divisible by n_head = {}", C, n_head);
  Tensor out = Tensor::empty({B, T, C}, xv.dtype(), xv.device(), MemCategory::activations);
  // (B, NH, T) log-sum-exp of each score row: all that backward needs besides qkv and out.
  const DType lse_dtype = xv.device().is_cuda() ? DType::f32 : xv.dtype();
  Tensor lse = Tensor::empty({B, n_head, T}, lse_dtype, xv.device(), MemCategory::activations);
  dispatch(
      "attention", xv,
      [&] {
        if (read_codes)
          cuda_ops::attention_forward(out, lse, saved, n_head);
        else
          cuda_ops::attention_forward(out, lse, xv, n_head);
      },
      [&]<typename F>() { cpu::attention_forward<F>(out.data<F>(), lse.data<F>(), cptr<F>(xv), B, T, C, n_head); });
  Var y = make_output(std::move(out));
  if (needs_grad(qkv)) {
    y->requires_grad = true;
    // qkv's producer asks for its gradient's column sums (a BF16 linear's bias) and is the node recorded last, reading
    // qkv's gradient only: its backward then runs right after this one, so the sums written here stay those of the
    // gradient it reads.
    const bool qkv_sums = qkv->grad_cell->dy_colsum_request && gradient_read_only_by_last_node(qkv, qkv);
    // Holds qkv itself, or only its FP8 codes.
    current_tape()->record("attention", [qg = grad_ref(qkv), qkv_kept = store_fp8 ? Var() : qkv, saved, read_codes,
                                         y, lse, n_head, B, T, C, qkv_sums] {
      const Tensor& dout = grad_of(y);
      // The output, or where the projection serves it from its FP8 codes (fp8_linear's serve_input) their
      // dequantized values: delta = rowsum(dO * O) then reads the O that the projection read. On CUDA it
      // reads those codes themselves (y's released form), in f32 as the CPU reads the dequantized values.
      const auto* out_codes = std::any_cast<QuantizedTensor>(&y->released_form);
      // qkv's values: kept, or restored from the codes.
      auto qkv_value = [&] { return qkv_kept ? value_of(qkv_kept) : fp8_restore(saved, MemCategory::workspace); };
      dispatch(
          "attention backward", dout,
          [&] {
            // The kernels write qkv's gradient when it has none yet (no zero fill first), else add to it. They
            // read qkv from its codes (read_codes) or as bf16, and O from its codes or as bf16.
            const bool accumulate = grad_exists(qg);
            const Tensor qv = read_codes ? Tensor() : qkv_value();
            const Tensor ov = out_codes ? Tensor() : value_of(y);
            const QuantizedTensor oc = out_codes ? *out_codes : QuantizedTensor();
            const bool has_oc = out_codes != nullptr;
            auto run = [qv, saved, ov, oc, has_oc, read_codes, dout, lse, n_head](Tensor& dqkv, bool acc) {
              if (read_codes && has_oc)
                cuda_ops::attention_backward(dqkv, dout, saved, oc, lse, n_head, acc);
              else if (read_codes)
                cuda_ops::attention_backward(dqkv, dout, saved, ov, lse, n_head, acc);
              else if (has_oc)
                cuda_ops::attention_backward(dqkv, dout, qv, oc, lse, n_head, acc);
              else
                cuda_ops::attention_backward(dqkv, dout, qv, ov, lse, n_head, acc);
            };
            // qkv's producer, an FP8 linear, may take the gradient as its own dy cast's codes (Fp8DyRequest): the
            // kernels write those instead of bf16, and the cast's pass over the gradient is saved. Not under a
            // FiniteWatch (it reads every gradient as written). Another reader of the gradient before the producer
            // takes it gets the bf16 gradient, computed again (materialize).
            const Fp8DyRequest* request = accumulate || finite_watch() ? nullptr : qg.cell->fp8_dy.get();
            const cuda_ops::AttentionSaved forms{.qkv = read_codes ? nullptr : &qv,
                                                 .qkv_codes = read_codes ? &saved : nullptr,
                                                 .out = has_oc ? nullptr : &ov,
                                                 .out_codes = has_oc ? &oc : nullptr};
            if (request && cuda_ops::attention_writes_dy_codes(qg.shape, n_head)) {
              PendingGrad p = cuda_ops::attention_backward_dy_codes(*request, dout, forms, lse, n_head);
              p.materialize = [run, shape = qg.shape, device = qg.device](const Tensor&, const Tensor&) {
                Tensor g = Tensor::empty(shape, DType::bf16, device, MemCategory::activations);
                run(g, false);
                return g;
              };
              qg.cell->pending = std::move(p);
              return;
            }
            if (!accumulate) qg.cell->grad = Tensor::empty(qg.shape, qg.dtype, qg.device, MemCategory::activations);
            if (qkv_sums && !accumulate && !finite_watch() && !qg.cell->dy_colsum.defined() &&
                cuda_ops::attention_writes_dy_codes(qg.shape, n_head)) {
              Tensor sums = Tensor::empty({qg.shape.back()}, DType::f32, qg.device, MemCategory::workspace);
              cuda_ops::attention_backward_colsum(qg.cell->grad, sums, dout, forms, lse, n_head);
              qg.cell->dy_colsum = std::move(sums);
              return;
            }
            run(qg.cell->grad, accumulate);
          },
          [&]<typename F>() {
            const Tensor qv = qkv_value();
            cpu::attention_backward<F>(grad_of(qg).data<F>(), cptr<F>(dout), cptr<F>(qv), cptr<F>(value_of(y)),
                                       cptr<F>(lse), B, T, C, n_head);
          });
    });
  }
  watch_op("attention", y, {&qkv});
  return y;
}

}  // namespace fp8t
