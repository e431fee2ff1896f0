// Tape, scopes and activation recompute.
#include "autograd/tape.h"

#include "core/check.h"
#include "ops/ops.h"

namespace fp8t {

namespace {
thread_local Tape* g_tape = nullptr;
}

void settle_grad(GradCell& cell) {
  if (!cell.pending.defined()) return;
  FP8T_CHECK(!cell.grad.defined(), "settle_grad: a gradient both written and pending");
  PendingGrad p = std::move(cell.pending);
  cell.pending = PendingGrad{};
  cell.grad = p.materialize(p.operand, p.input());
}

bool grad_exists(const GradRef& g) {
  settle_grad(*g.cell);
  return g.cell->grad.defined();
}

bool grad_exists(const Var& v) {
  settle_grad(*v->grad_cell);
  return v->grad.defined();
}

Tensor& grad_of(const Var& v) {
  // Intermediates get gradients in their own dtype; leaves are bound to the (f32) flat gradient buffer.
  settle_grad(*v->grad_cell);
  if (!v->grad.defined()) {
    const Tensor& value = value_of(v);
    v->grad = zeros_like(value, value.dtype());
  }
  return v->grad;
}

const Tensor& value_of(const Var& v) {
  if (!v->value.defined() && v->recompute) {
    NoGradScope ng;
    v->value = v->recompute();
  }
  return v->value;
}

void release_for_recompute(const Var& v, std::function<Tensor()> fn) {
  if (!grad_enabled()) return;
  v->recompute = std::move(fn);
  v->value = Tensor();
}

Tensor& grad_of(const GradRef& g) {
  settle_grad(*g.cell);
  Tensor& grad = g.cell->grad;
  if (!grad.defined()) grad = Tensor::zeros(g.shape, g.dtype, g.device, MemCategory::activations);
  return grad;
}

Tape* current_tape() { return g_tape; }
bool grad_enabled() { return g_tape != nullptr; }

TapeScope::TapeScope(Tape* tape) : prev_(g_tape) { g_tape = tape; }
TapeScope::~TapeScope() { g_tape = prev_; }

void Tape::record(const char* name, std::function<void()> backward) {
  nodes_.push_back(Node{name, std::move(backward)});
}

void Tape::run_backward() {
  while (!nodes_.empty()) {
    {
      Node node = std::move(nodes_.back());
      nodes_.pop_back();
      node.backward();  // `node` (and what it holds) is released at the end of this scope
    }
    if (hook_) hook_(nodes_.size());
  }
}

void Tape::backward(const Var& loss, float seed) {
  FP8T_CHECK(loss->value.numel() == 1, "backward: loss must be a scalar, got {}", loss->value.str());
  FP8T_CHECK(!has_required_seed_ || seed == required_seed_,
             "backward: seed {} but the forward pass computed gradients for seed {} (pass the same "
             "grad_scale to the loss as to backward)", seed, required_seed_);
  fill_(grad_of(loss), seed);
  TapeScope none(nullptr);  // backward closures must not record
  run_backward();
}

Var checkpoint(const std::function<Var(const Var&)>& fn, const Var& input) {
  Var out;
  {
    NoGradScope ng;
    out = fn(input);
  }
  if (!needs_grad(input)) return out;
  out->requires_grad = true;
  current_tape()->record("checkpoint", [fn, input, out] {
    // Recompute with recording on; the detached input gathers the gradient w.r.t. the block input.
    Tape inner;
    Var x = make_var(input->value, true);
    Var y;
    {
      TapeScope ts(&inner);
      y = fn(x);
    }
    grad_of(y).copy_from(grad_of(out));
    {
      TapeScope none(nullptr);
      inner.run_backward();
    }
    add_(grad_of(input), grad_of(x));
  });
  return out;
}

}  // namespace fp8t
