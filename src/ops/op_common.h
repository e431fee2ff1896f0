// Internal to src/ops: what the op files (src/ops/<op>.cpp) share: the argument checks, the device dispatch and
// the gradient buffers they hand to the CPU references (src/ops/cpu/<op>.h) and the CUDA launchers
// (src/ops/<op>_cuda.h).
#pragma once
#include <utility>
#include <vector>

#include "autograd/finite_watch.h"
#include "core/tensor_ops.h"
#include "fp8/saved.h"
#include "ops/dispatch.h"
#include "ops/grad_sink.h"
#include "ops/op_checks.h"
#include "ops/ops.h"

namespace fp8t::ops_detail {

inline Var make_output(Tensor value) { return make_var(std::move(value)); }

// The gradient of v as F* for the CPU reference, or null when v needs none.
template <typename F>
F* grad_ptr(const Var& v, const char* op) {
  if (!v || !v->requires_grad) return nullptr;
  Tensor& g = grad_of(v);
  const Tensor& value = value_of(v);
  FP8T_CHECK(g.device().is_cpu() && g.dtype() == value.dtype() && g.numel() == value.numel(),
             "{}: gradient {} does not match its value {} (CPU ops need same-dtype gradients)", op, g.str(),
             value.str());
  return g.data<F>();
}

// The CUDA launchers take gradients by reference; an input that needs none gets a throwaway buffer.
inline Tensor grad_or_scratch(const Var& v, DType scratch_dtype) {
  if (v->requires_grad) return grad_of(v);
  return zeros_like(v->value, scratch_dtype);
}

// The CUDA launchers take optional gradients as pointers: null for one that is not wanted (undefined).
inline Tensor* or_null(Tensor& t) { return t.defined() ? &t : nullptr; }

// The gradient of v for an op that can overwrite or accumulate: one that does not exist yet is
// allocated uninitialised, or a parameter's stale one (GradCell::stale) taken as it is, and `accumulate` is false,
// so the op writes it without a zero fill.
inline Tensor grad_for_write(const Var& v, bool& accumulate) {
  if (v->grad_cell->stale) {
    clear_stale(*v->grad_cell);
    accumulate = false;
    return v->grad;
  }
  accumulate = grad_exists(v);
  if (!accumulate) {
    const Tensor& value = value_of(v);
    v->grad = Tensor::empty(value.shape(), value.dtype(), value.device(), MemCategory::activations);
  }
  return v->grad;
}

// A linear's bias gradient from the column sums of its output's gradient that the op finishing that gradient wrote
// (GradCell::dy_colsum, handed over once; the linear asked with dy_colsum_request): db += them, and db is left
// undefined so that the linear does not sum dy's columns again. Without such sums db stays as it is.
inline void take_dy_colsum(const GradRef& y, Tensor& db) {
  Tensor sums = std::exchange(y.cell->dy_colsum, Tensor());
  if (!sums.defined() || !db.defined()) return;
  add_(db, sums);
  db = Tensor();
}

// The LayerNorm op's output Var from x, its weight and bias, the output value and its row statistics (computed by
// layernorm or by an add that wrote them in its pass), with the backward node recorded where one is needed.
Var layernorm_output(const Var& x, const Var& w, const Var& b, Tensor out, Tensor mean, Tensor rstd);

template <typename F>
const F* cptr(const Tensor& t) {
  return t.data<F>();
}

}  // namespace fp8t::ops_detail
