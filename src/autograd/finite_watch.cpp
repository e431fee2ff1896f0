// FiniteWatch: the per-op and per-node checks of a debug re-run, and their messages.
#include "autograd/finite_watch.h"

#include <fmt/ranges.h>

#include "autograd/tape.h"
#include "core/tensor_ops.h"

namespace fp8t {

namespace {
thread_local FiniteWatch* g_watch = nullptr;

// Element i of t as a double (t may live on a device).
double element(const Tensor& t, int64_t i) {
  Tensor one = t.slice_flat(i, {1});
  if (!one.device().is_cpu()) one = one.to(Device::cpu(), MemCategory::workspace);
  return cast(one, DType::f64, MemCategory::workspace).data<double>()[0];
}

// "[0, 2, 5]": the multi-index of flat index i in shape.
std::string multi_index(const Shape& shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

// The gradient a cell holds: written, or pending (its operand); null when there is none yet.
const Tensor* held_grad(const GradCell& cell) {
  if (cell.grad.defined()) return &cell.grad;
  if (cell.pending.operand.defined()) return &cell.pending.operand;  // not a pending cast gradient (its codes)
  return nullptr;
}

[[noreturn]] void found(bool backward, bool incoming, const std::string& layer, const std::string& op,
                        std::string tensor, const Tensor& t, int64_t index, std::string context) {
  throw NonfiniteFound(NonfiniteSite{backward, incoming, layer, op, std::move(tensor), t.shape(), index,
                                     element(t, index), std::move(context)});
}
}  // namespace

std::string describe(const NonfiniteSite& s) {
  const std::string where = s.layer.empty() ? s.op : fmt::format("{} ({})", s.layer, s.op);
  const std::string what = !s.backward ? fmt::format("the {} of {}", s.tensor, where)
                           : s.incoming ? fmt::format("the gradient of {} reaching the backward of {}", s.tensor, where)
                                        : fmt::format("the backward of {} wrote the gradient of {}", where, s.tensor);
  const std::string shape = fmt::format("[{}]", fmt::join(s.shape, ", "));
  const std::string index =
      s.shape.size() > 1 ? fmt::format("{} {}", s.index, multi_index(s.shape, s.index)) : std::to_string(s.index);
  return fmt::format("{}, shape {}, element {} is {}{}{}", what, shape, index, s.value, s.context.empty() ? "" : "; ",
                     s.context);
}

FiniteWatch* finite_watch() { return g_watch; }

FiniteWatchScope::FiniteWatchScope(FiniteWatch* watch) : prev_(g_watch) { g_watch = watch; }
FiniteWatchScope::~FiniteWatchScope() { g_watch = prev_; }

void FiniteWatch::set_layer(std::string_view prefix, std::string_view name) {
  layer_.assign(prefix);
  layer_.append(name);
}

void FiniteWatch::after_op(const char* op, const Var& out, std::initializer_list<const Var*> inputs) {
  // An op that reads a weight is placed by it ("h.2.attn.c_proj.weight": h.2.attn.c_proj), others by the
  // model's last set_layer.
  std::string place = layer_;
  for (const Var* in : inputs)
    if (in && *in && (*in)->name.ends_with(".weight")) {
      place = (*in)->name.substr(0, (*in)->name.size() - std::string_view(".weight").size());
      break;
    }
  if (out->name.empty()) out->name = (place.empty() ? std::string(op) : place) + " output";
  auto name_of = [op](const Var& in, int k) {
    return in->name.empty() ? fmt::format("input {} of {}", k, op) : in->name;
  };
  if (!backward_) {
    if (const auto bad = first_nonfinite(out->value)) {
      // Earlier outputs were checked and the weights before the pass, so an input is non-finite only when
      // it came from outside the watched ops; say which.
      std::string context = "its inputs were finite";
      int k = 0;
      for (const Var* in : inputs) {
        ++k;
        if (!in || !*in || !(*in)->value.defined()) continue;
        if (const auto bad_in = first_nonfinite((*in)->value)) {
          context = fmt::format("its input {} was already non-finite (element {} is {})", name_of(*in, k), *bad_in,
                                element((*in)->value, *bad_in));
          break;
        }
      }
      found(false, false, place, op, "output", out->value, *bad, std::move(context));
    }
  }
  if (!out->requires_grad || !grad_enabled()) return;  // no node was recorded for this op
  auto check = std::make_shared<NodeCheck>();
  check->layer = place;
  check->op = op;
  check->output = {out->grad_cell, out->name};
  int k = 0;
  for (const Var* in : inputs) {
    ++k;
    if (in && *in && (*in)->requires_grad) check->inputs.push_back({(*in)->grad_cell, name_of(*in, k)});
  }
  current_tape()->attach_check(std::move(check));
}

void FiniteWatch::before_node(const NodeCheck& node) const {
  const Tensor* g = held_grad(*node.output.cell);
  if (!g) return;
  if (const auto bad = first_nonfinite(*g))
    found(true, true, node.layer, node.op, node.output.name, *g, *bad,
          "it was written non-finite by an op that is not checked");
}

void FiniteWatch::after_node(const NodeCheck& node) const {
  for (const NodeCheck::Grad& in : node.inputs) {
    const Tensor* g = held_grad(*in.cell);
    if (!g) continue;
    if (const auto bad = first_nonfinite(*g))
      found(true, false, node.layer, node.op, in.name, *g, *bad,
            fmt::format("the gradient it read (of {}) was finite", node.output.name));
  }
}

}  // namespace fp8t
