// Variable: a tensor in the autograd graph, with its gradient and whether it needs one.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace fp8t {

struct VarImpl {
  Tensor value;
  // The gradient lives in a cell of its own so a backward closure can hold it (GradRef) without
  // keeping `value` alive: an op's output is then freed as soon as no node saved it for backward.
  std::shared_ptr<Tensor> grad_cell = std::make_shared<Tensor>();
  Tensor& grad = *grad_cell;  // allocated on first accumulation, or a view of the flat gradient buffer
  bool requires_grad = false;
  std::string name;
  // Set when `value` was released after the forward pass to save memory: rebuilds it (without
  // recording) the first time a backward closure asks for it (value_of in autograd/tape.h).
  std::function<Tensor()> recompute;
};
using Var = std::shared_ptr<VarImpl>;

// A handle on a Var's gradient alone (shape, dtype and device to create it lazily).
struct GradRef {
  std::shared_ptr<Tensor> cell;
  Shape shape;
  DType dtype;
  Device device;
  bool requires_grad;
};
inline GradRef grad_ref(const Var& v) {
  return {v->grad_cell, v->value.shape(), v->value.dtype(), v->value.device(), v->requires_grad};
}

inline Var make_var(Tensor value, bool requires_grad = false, std::string name = {}) {
  auto v = std::make_shared<VarImpl>();
  v->value = std::move(value);
  v->requires_grad = requires_grad;
  v->name = std::move(name);
  return v;
}

// The gradient buffer of v, zero-filled on first use (category activations for intermediates).
Tensor& grad_of(const Var& v);
Tensor& grad_of(const GradRef& g);

}  // namespace fp8t
