// Variable: a tensor in the autograd graph, with its gradient and whether it needs one.
#pragma once
#include <memory>
#include <string>

#include "core/tensor.h"

namespace fp8t {

struct VarImpl {
  Tensor value;
  Tensor grad;  // allocated on first accumulation, or bound to a view of the flat gradient buffer
  bool requires_grad = false;
  std::string name;
};
using Var = std::shared_ptr<VarImpl>;

inline Var make_var(Tensor value, bool requires_grad = false, std::string name = {}) {
  auto v = std::make_shared<VarImpl>();
  v->value = std::move(value);
  v->requires_grad = requires_grad;
  v->name = std::move(name);
  return v;
}

// The gradient buffer of v, zero-filled on first use (category activations for intermediates).
Tensor& grad_of(const Var& v);

}  // namespace fp8t
