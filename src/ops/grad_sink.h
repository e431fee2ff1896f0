// Internal to src/ops: a parameter gradient as the buffer an op accumulates into, whatever the
// gradient buffer's dtype (precision.grad_dtype).
#pragma once
#include "autograd/finite_watch.h"
#include "autograd/tape.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace fp8t::ops_detail {

// The ops' CPU references and some CUDA kernels (bias and LayerNorm column sums, the embedding's
// scatter) accumulate in `acc` (f32 on CUDA, the value dtype on the CPU). Where the gradient has that
// dtype, the sink is the gradient itself; where it is bf16, the op accumulates into a zeroed
// temporary and commit() adds that into the gradient, rounding once per op, as a GEMM with beta = 1
// on a bf16 output does. A parameter's armed accumulator (ParameterStore::arm_accumulators) serves as
// that temporary: zeroed once per micro-step for all of them, not once per op, and possibly added in
// one pass for all of them at the micro-step's end. A Var that needs no gradient gets an undefined
// sink, or with `scratch` a zeroed throwaway buffer (for kernels that always write one).
class GradSink {
 public:
  GradSink(const Var& v, DType acc, bool scratch = false) {
    if (!v) return;
    if (!v->requires_grad) {
      if (scratch) buf_ = Tensor::zeros(v->value.shape(), acc, v->value.device(), MemCategory::workspace);
      return;
    }
    Tensor& g = grad_of(v);
    if (g.dtype() == acc) {
      buf_ = g;
      return;
    }
    target_ = v;
    GradCell& cell = *v->grad_cell;
    if (cell.accumulator_armed && cell.accumulator.dtype() == acc && cell.accumulator.shape() == g.shape()) {
      cell.accumulator_armed = false;  // zero, as a fresh temporary: a second op this micro-step gets its own
      buf_ = cell.accumulator;
      accumulator_ = true;
      return;
    }
    buf_ = Tensor::zeros(g.shape(), acc, g.device(), MemCategory::workspace);
  }
  GradSink(const GradSink&) = delete;
  GradSink& operator=(const GradSink&) = delete;

  bool defined() const { return buf_.defined(); }
  Tensor& tensor() { return buf_; }
  // The buffer as F*, or null when undefined (the CPU references skip a null gradient).
  template <typename F>
  F* ptr() {
    return buf_.defined() ? buf_.data<F>() : nullptr;
  }
  // Adds the temporary into the gradient (nothing when the sink is the gradient or a scratch). A deferred
  // accumulator's add waits for ParameterStore::commit_accumulators, except under a FiniteWatch (a debug re-run
  // checks each node's gradients right after it).
  void commit() {
    if (!target_) return;
    GradCell& cell = *target_->grad_cell;
    if (accumulator_ && cell.accumulator_deferred && !finite_watch())
      cell.accumulator_pending = true;
    else
      add_(grad_of(target_), buf_);
    target_.reset();
  }

 private:
  Var target_;  // set while a temporary awaits commit()
  Tensor buf_;
  bool accumulator_ = false;  // buf_ is target_'s accumulator
};

}  // namespace fp8t::ops_detail
