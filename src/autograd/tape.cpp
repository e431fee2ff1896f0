// Tape, scopes and activation recompute.
#include "autograd/tape.h"

#include <atomic>

#include "autograd/finite_watch.h"
#include "core/check.h"
#include "core/graph_capture.h"
#include "core/tensor_ops.h"

namespace fp8t {

namespace {
thread_local Tape* g_tape = nullptr;
// The progress hook of the backward running on this thread (null if none), for checkpoint's inner tape.
thread_local const std::function<void(size_t)>* g_progress_hook = nullptr;

// Writes a pending gradient, or makes one through make_grad, or zeroes a stale one; true when the gradient then
// exists.
bool settle_or_make(GradCell& cell) {
  if (cell.stale) {
    cell.grad.zero_();
    clear_stale(cell);
    return true;
  }
  settle_grad(cell);
  if (!cell.grad.defined() && cell.make_grad) {
    cell.grad = cell.make_grad();
    FP8T_CHECK(cell.grad.defined(), "make_grad returned no gradient");
  }
  return cell.grad.defined();
}
}  // namespace

void settle_grad(GradCell& cell) {
  if (!cell.pending.defined()) return;
  FP8T_CHECK(!cell.grad.defined(), "settle_grad: a gradient both written and pending");
  PendingGrad p = std::move(cell.pending);
  cell.pending = PendingGrad{};
  cell.grad = p.materialize(p.operand, p.input ? p.input() : Tensor());
  if (p.then) p.then(false);
}

void clear_stale(GradCell& cell) {
  cell.stale = false;
  on_graph_replay([&cell] { cell.stale = false; });  // a parameter's cell: it outlives the step's graphs
}

bool grad_exists(const GradRef& g) { return settle_or_make(*g.cell); }

bool grad_exists(const Var& v) { return settle_or_make(*v->grad_cell); }

Tensor& grad_of(const Var& v) {
  // Intermediates get gradients in their own dtype; parameters are views of the flat gradient buffer or
  // of a staging bucket (make_grad).
  if (!settle_or_make(*v->grad_cell)) {
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

void release_for_recompute(const Var& v, std::function<Tensor()> fn, std::any form) {
  if (!grad_enabled()) return;
  v->recompute = std::move(fn);
  v->released_form = std::move(form);
  v->value = Tensor();
}

Tensor& grad_of(const GradRef& g) {
  Tensor& grad = g.cell->grad;
  if (!settle_or_make(*g.cell)) grad = Tensor::zeros(g.shape, g.dtype, g.device, MemCategory::activations);
  return grad;
}

Tape* current_tape() { return g_tape; }
bool grad_enabled() { return g_tape != nullptr; }

TapeScope::TapeScope(Tape* tape) : prev_(g_tape) { g_tape = tape; }
TapeScope::~TapeScope() { g_tape = prev_; }

uint64_t Tape::next_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

void mark_gradient_read_only(const Var& y, std::initializer_list<const Var*> inputs) {
  Tape* tape = current_tape();
  FP8T_CHECK(tape && tape->size() > 0, "mark_gradient_read_only: no node recorded");
  GradCell& cell = *y->grad_cell;
  cell.read_only_tape = tape->id();
  cell.read_only_node = tape->size() - 1;
  FP8T_CHECK(inputs.size() <= GradCell::kMaxReadOnlyWrites, "mark_gradient_read_only: {} inputs, at most {}",
             inputs.size(), GradCell::kMaxReadOnlyWrites);
  cell.read_only_n_writes = 0;
  for (const Var* v : inputs)
    if (v && *v) cell.read_only_writes[cell.read_only_n_writes++] = (*v)->grad_cell.get();
}

bool gradient_read_only_by_last_node(const Var& v, const Var& other) {
  const Tape* tape = current_tape();
  const GradCell& cell = *v->grad_cell;
  if (!tape || cell.read_only_tape != tape->id() || cell.read_only_node + 1 != tape->size()) return false;
  for (size_t i = 0; i < cell.read_only_n_writes; ++i)
    if (cell.read_only_writes[i] == other->grad_cell.get()) return false;
  return true;
}

std::weak_ptr<GradCell> residual_dy_cell(const Var& x) {
  const Tape* tape = current_tape();
  const GradCell& cell = *x->grad_cell;
  if (!tape || cell.residual_tape != tape->id() || cell.residual_node + 1 != tape->size()) return {};
  return cell.residual_b;
}

void Tape::record(const char* name, std::function<void()> backward) {
  nodes_.push_back(Node{name, std::move(backward), nullptr});
}

void Tape::attach_check(std::shared_ptr<const NodeCheck> check) {
  FP8T_CHECK(!nodes_.empty(), "attach_check: the tape has no node");
  nodes_.back().check = std::move(check);
}

void Tape::run_backward() {
  struct HookScope {  // the hook of the innermost running backward that has one
    const std::function<void(size_t)>* prev = g_progress_hook;
    explicit HookScope(const std::function<void(size_t)>& hook) {
      if (hook) g_progress_hook = &hook;
    }
    ~HookScope() { g_progress_hook = prev; }
  } scope(hook_);
  while (!nodes_.empty()) {
    {
      Node node = std::move(nodes_.back());
      nodes_.pop_back();
      FiniteWatch* watch = node.check ? finite_watch() : nullptr;
      if (watch) watch->before_node(*node.check);
      node.backward();  // `node` (and what it holds) is released at the end of this scope
      if (watch) watch->after_node(*node.check);
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
    // Recompute with recording on; the detached input gathers the gradient w.r.t. the block input. The
    // outer backward's progress hook follows the inner nodes too (parameter gradients complete there).
    Tape inner;
    if (g_progress_hook) inner.set_progress_hook(*g_progress_hook);
    Var x = make_var(input->value, true);
    if (finite_watch()) x->name = input->name;  // debug re-run: messages name the block input
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
  watch_op("checkpoint", out, {&input});
  return out;
}

}  // namespace fp8t
