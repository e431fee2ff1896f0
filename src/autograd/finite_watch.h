// Locating the first NaN/Inf of a step: while a FiniteWatch is installed (a debug re-run of a failed
// step), every op checks its output right after it runs, in forward order, and every tape node the
// gradient it reads and those it writes, in backward order; the first non-finite value ends the pass.
#pragma once
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/variable.h"

namespace fp8t {

// Where the first non-finite value appeared.
struct NonfiniteSite {
  bool backward = false;  // found in the backward pass (else forward)
  bool incoming = false;  // backward: in the gradient the node reads (else in one it wrote)
  std::string layer;      // the model's name for the op's place (GPT: "h.2.attn.c_proj"); may be empty
  std::string op;         // "linear", "attention", ...
  std::string tensor;     // forward: "output"; backward: whose gradient ("h.2.attn.c_attn output", "wte")
  Shape shape;
  int64_t index = 0;      // flat index of the first non-finite element
  double value = 0;       // that element: NaN or +-Inf
  std::string context;    // what was checked about the op's inputs, e.g. "its inputs were finite"
};

// "the output of h.2.attn.c_proj (linear), shape [4, 16, 32], element 37 [0, 1, 5] is inf; its inputs were
// finite", "the backward of h.1.mlp.c_proj (linear) wrote the gradient of h.1.mlp.gelu output, ...".
std::string describe(const NonfiniteSite& site);

// Thrown by the watch at the first non-finite value, to stop the pass there.
class NonfiniteFound : public std::exception {
 public:
  explicit NonfiniteFound(NonfiniteSite site) : site_(std::move(site)), text_(describe(site_)) {}
  const NonfiniteSite& site() const { return site_; }
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  NonfiniteSite site_;
  std::string text_;
};

// What the watch checks around one node's backward: the gradient it reads and those it writes.
struct NodeCheck {
  struct Grad {
    std::shared_ptr<GradCell> cell;
    std::string name;  // the Var's name: a parameter's, or "<layer> output" for an op's output
  };
  std::string layer, op;
  Grad output;
  std::vector<Grad> inputs;  // those that require a gradient
};

class FiniteWatch {
 public:
  // From ops (watch_op): `out` was computed from `inputs` and, when it requires a gradient under a
  // recording tape, its node was just recorded. Names `out` for later messages, checks it (forward
  // pass only) and attaches a NodeCheck to the node.
  void after_op(const char* op, const Var& out, std::initializer_list<const Var*> inputs);
  // From models (watch_layer): the place of the ops that follow and read no weight (an op that reads
  // a parameter "X.weight" is placed at X).
  void set_layer(std::string_view prefix, std::string_view name);
  // Ends the forward checks: backward's recompute reruns forward ops bit for bit, their nodes are checked.
  void begin_backward() { backward_ = true; }
  void before_node(const NodeCheck& node) const;
  void after_node(const NodeCheck& node) const;

 private:
  std::string layer_;
  bool backward_ = false;
};

// The watch of this thread, null outside a debug re-run (the fast path).
FiniteWatch* finite_watch();

// Installs `watch` for the scope's lifetime.
class FiniteWatchScope {
 public:
  explicit FiniteWatchScope(FiniteWatch* watch);
  ~FiniteWatchScope();
  FiniteWatchScope(const FiniteWatchScope&) = delete;
  FiniteWatchScope& operator=(const FiniteWatchScope&) = delete;

 private:
  FiniteWatch* prev_;
};

// Ops call this last, after recording their node (null inputs are skipped). Without a watch: one test.
inline void watch_op(const char* op, const Var& out, std::initializer_list<const Var*> inputs) {
  if (FiniteWatch* w = finite_watch()) w->after_op(op, out, inputs);
}

// Models call this to name the place of the ops that follow: prefix + name ("h.2." + "attn").
inline void watch_layer(std::string_view prefix, std::string_view name) {
  if (FiniteWatch* w = finite_watch()) w->set_layer(prefix, name);
}

}  // namespace fp8t
