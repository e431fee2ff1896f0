// The add op (the residual connections): a + b, and the gradient handed to both.
#include <optional>

#include "core/allocator.h"
#include "ops/add_cuda.h"
#include "ops/cpu/add.h"
#include "ops/op_common.h"

namespace fp8t {

using namespace ops_detail;

Var add(const Var& a, const Var& b, RowStats* stats, const Var& b_bias) {
  FP8T_CHECK(a->value.shape() == b->value.shape(), "add: shapes {} and {} differ", a->value.str(), b->value.str());
  check_same_dtype("add", a->value, b->value);
  check_same_device("add", a->value, b->value);
  const Tensor* bias = b_bias ? &b_bias->value : nullptr;
  if (bias) {
    FP8T_CHECK(a->value.ndim() >= 1 && bias->numel() == a->value.dim(-1),
               "add: b's bias {} must have one value per column of {}", bias->str(), a->value.str());
    check_same_dtype("add", a->value, *bias);
    check_same_device("add", a->value, *bias);
  }
  Tensor out = Tensor::empty(a->value.shape(), a->value.dtype(), a->value.device(), MemCategory::activations);
  std::shared_ptr<Fp8LnCastAhead> ahead;
  Var norm_w, norm_b;
  const char* norm_role = nullptr;
  if (stats) {
    ahead = std::move(stats->cast_ahead);
    norm_w = std::move(stats->norm_w);
    norm_b = std::move(stats->norm_b);
    norm_role = stats->norm_role;
    *stats = RowStats{};
  }
  const bool with_stats = stats && out.device().is_cuda() && out.ndim() >= 1 && out.numel() > 0;
  // The linear keeps no transposed codes of its input where the sum needs a gradient or no tape records
  // (fp8_linear.h, fp8_ln_cast_ahead): only then is its cast the one done here.
  const bool cast_ahead = with_stats && ahead && (needs_grad(a, b) || !grad_enabled());
  // A bf16 LayerNorm next: its output is written here, from the statistics and rows this pass holds.
  const bool with_norm = with_stats && !ahead && norm_w && norm_b;
  if (with_stats) {  // kept for the LayerNorm backward of the linear that reads them, as its own would be
    const Shape rows(out.shape().begin(), out.shape().end() - 1);
    stats->mean = Tensor::empty(rows, DType::f32, out.device(), MemCategory::activations);
    stats->rstd = Tensor::empty(rows, DType::f32, out.device(), MemCategory::activations);
  }
  Tensor normed;
  if (with_norm) {
    std::optional<ActivationRole> role;
    if (norm_role) role.emplace(norm_role);
    normed = Tensor::empty(out.shape(), out.dtype(), out.device(), MemCategory::activations);
  }
  dispatch(
      "add", out,
      [&] {
        if (with_stats) {
          cuda_ops::add_forward_row_stats(out, stats->mean, stats->rstd, a->value, b->value,
                                          cast_ahead ? ahead.get() : nullptr, with_norm ? &normed : nullptr,
                                          with_norm ? &norm_w->value : nullptr, with_norm ? &norm_b->value : nullptr,
                                          bias);
          if (cast_ahead) stats->cast_ahead = std::move(ahead);  // holding the codes for the linear
        } else {
          cuda_ops::add_forward(out, a->value, b->value, bias);
        }
      },
      [&]<typename F>() {
        cpu::add_forward<F>(out.data<F>(), cptr<F>(a->value), cptr<F>(b->value), out.numel(),
                            bias ? cptr<F>(*bias) : nullptr, bias ? bias->numel() : 0);
      });
  Var y = make_output(std::move(out));
  if (needs_grad(a, b)) {
    y->requires_grad = true;
    // b's producer recorded just before this node, reads b's gradient only and does not write a's (a residual
    // branch's last linear): b may share d(out)'s buffer too, as its backward runs right after this one.
    const bool b_shares = gradient_read_only_by_last_node(b, a);
    // Such a b whose producer takes its gradient as dy codes or asks for its column sums: the node recorded next, the
    // last to add into y's gradient, may write them (residual_dy_cell); b's gradient is then pending as codes when
    // this backward runs, or b gets it as it is with the sums beside it (GradCell::dy_colsum).
    const bool b_residual = b_shares && a != b && (b->grad_cell->fp8_dy || b->grad_cell->dy_colsum_request);
    // Only gradient handles are held: add needs neither input's value in backward.
    current_tape()->record("add", [ag = grad_ref(a), bg = grad_ref(b), yg = grad_ref(y), b_shares, b_residual] {
      const Tensor& dout = grad_of(yg);
      // A gradient that does not exist yet takes d(out) as it is instead of a zero fill and an add:
      // `a` shares d(out)'s buffer (y's backward is done, so nothing else writes it). `b` gets a copy, as later
      // accumulation into a's gradient must not reach b's, unless b_shares: then the only node to run before
      // anything writes into a's gradient is b's producer, which reads b's and writes neither (b's gradient, once
      // read, then changes with a's: nothing reads it again). With a == b the shared buffer is then doubled in
      // place, as it should be.
      if (ag.requires_grad) {
        if (!grad_exists(ag) && dout.dtype() == ag.dtype && dout.device() == ag.device)
          ag.cell->grad = dout.view(ag.shape);
        else
          add_(grad_of(ag), dout);
      }
      const PendingGrad& bp = bg.cell->pending;
      if (bg.requires_grad && !(b_residual && (bp.dy_codes.defined() || bp.dy_codes_t.defined()))) {
        if (!grad_exists(bg) && dout.dtype() == bg.dtype && dout.device() == bg.device) {
          if (b_shares) {
            bg.cell->grad = dout.view(bg.shape);
          } else {
            bg.cell->grad = Tensor::empty(bg.shape, bg.dtype, bg.device, MemCategory::activations);
            bg.cell->grad.copy_from(dout);
          }
        } else {
          add_(grad_of(bg), dout);
        }
      }
    });
    if (b_residual) {
      y->grad_cell->residual_b = b->grad_cell;
      y->grad_cell->residual_tape = current_tape()->id();
      y->grad_cell->residual_node = current_tape()->size() - 1;
    }
  }
  // Not b_bias: the add takes no gradient for it (its linear's node does), and the watch checks the weights itself.
  watch_op("add", y, {&a, &b});
  if (with_norm) {  // recorded right after the add, where layernorm(y, norm_w, norm_b) would be
    stats->normed = layernorm_output(y, norm_w, norm_b, std::move(normed), stats->mean, stats->rstd);
    stats->norm_w = std::move(norm_w);
    stats->norm_b = std::move(norm_b);
  }
  return y;
}

}  // namespace fp8t
