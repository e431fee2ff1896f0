// Tape-based reverse-mode autograd. Ops record a node (a backward closure holding only the
// tensors its backward reads); Tape::backward runs them in reverse and frees each after use.
// Autograd never sees CUDA or MPI: closures call ops, ops call kernels.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"

namespace fp8t {

struct NodeCheck;  // autograd/finite_watch.h

struct Node {
  const char* name;
  std::function<void()> backward;
  std::shared_ptr<const NodeCheck> check;  // set only in a debug re-run (FiniteWatch)
};

class Tape {
 public:
  void record(const char* name, std::function<void()> backward);
  // Seeds d(loss) = seed and runs every node in reverse order, releasing each node afterwards.
  void backward(const Var& loss, float seed = 1.0f);
  // Runs the nodes in reverse without seeding (the caller already set the output gradients).
  void run_backward();
  // Attaches the debug re-run's checks to the node recorded last (FiniteWatch::after_op).
  void attach_check(std::shared_ptr<const NodeCheck> check);
  void clear() { nodes_.clear(); }
  size_t size() const { return nodes_.size(); }
  // Called after each node has run and been released, with the number of nodes still to run
  // (the trainer uses it to start reducing gradients that are complete, ZeRO stage 2). A checkpoint
  // node's inner backward calls it too, after each inner node (with the inner tape's count).
  void set_progress_hook(std::function<void(size_t nodes_left)> hook) { hook_ = std::move(hook); }
  // An op that computed gradients during the forward pass for an assumed loss-gradient seed (the
  // chunked lm_head loss) registers it; backward() then refuses any other seed.
  void require_seed(float seed) { required_seed_ = seed; has_required_seed_ = true; }
  // Unique over the process's tapes (never 0), so a mark left by a tape is not mistaken for another's.
  uint64_t id() const { return id_; }

 private:
  static uint64_t next_id();
  uint64_t id_ = next_id();
  std::vector<Node> nodes_;
  float required_seed_ = 1.0f;
  bool has_required_seed_ = false;
  std::function<void(size_t)> hook_;
};

// An op calls this right after recording its node, for its output y, when that node's backward reads y's gradient,
// never writes into it, and writes only into the gradients of `inputs` (null entries skipped). An add recorded next
// on the same tape may then give y the buffer of its own output's gradient, which its other input keeps too,
// instead of a copy: nothing runs between the add's backward and that node's (ops/add.cpp).
void mark_gradient_read_only(const Var& y, std::initializer_list<const Var*> inputs);
// True when v's gradient was so marked by the node recorded last on the current tape, and that node does not write
// into other's gradient.
bool gradient_read_only_by_last_node(const Var& v, const Var& other);

// For an op about to record its node, whose backward adds into x's gradient: b's gradient cell where x = add(a, b) is
// the node recorded last on the current tape and b's producer takes b's gradient as dy codes or its column sums
// (GradCell::residual_b). That backward is then the last to write x's gradient, which is b's too: it may leave b's as
// those codes, or write those sums. Else null.
std::weak_ptr<GradCell> residual_dy_cell(const Var& x);

// The tape ops record onto (thread-local); null means gradients are not recorded.
Tape* current_tape();
bool grad_enabled();

// Makes `tape` current for the scope's lifetime.
class TapeScope {
 public:
  explicit TapeScope(Tape* tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  Tape* prev_;
};

// Disables recording for the scope's lifetime (evaluation, recompute's first pass).
class NoGradScope {
 public:
  NoGradScope() : scope_(nullptr) {}

 private:
  TapeScope scope_;
};

// True when an op with these inputs must record a node.
template <typename... Vs>
bool needs_grad(const Vs&... vs) {
  return grad_enabled() && ((vs && vs->requires_grad) || ...);
}

// v's value, rebuilt first if it was released for recompute. Backward closures read the values of
// Vars they hold through this (see release_for_recompute).
const Tensor& value_of(const Var& v);
// Selective activation recompute: while recording, drops v's value now and keeps `fn`, which rebuilds
// it bit-identically, for the backward closures that read it. The caller must be done with v's value
// in the forward pass (consumers already ran). A no-op when no tape records. `form`, if given, is the
// compact form fn rebuilds the value from, kept as v->released_form for the backwards that read it directly.
void release_for_recompute(const Var& v, std::function<Tensor()> fn, std::any form = {});

// Activation recompute: runs fn(inputs) without recording, keeps only the inputs, and records one
// node that reruns fn on a private tape during backward and backpropagates through it.
Var checkpoint(const std::function<Var(const Var&)>& fn, const Var& input);

}  // namespace fp8t
