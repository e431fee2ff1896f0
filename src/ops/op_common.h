// Internal to src/ops: what the op files (src/ops/<op>.cpp) share: the argument checks and the gradient
// buffers they hand to the CPU references and the CUDA launchers.
#pragma once
#include <algorithm>
#include <vector>

#include "autograd/finite_watch.h"
#include "fp8/saved.h"
#include "ops/cpu/reference.h"
#include "ops/dispatch.h"
#include "ops/grad_sink.h"
#include "ops/ops.h"

namespace fp8t::ops_detail {


inline Var make_output(Tensor value) { return make_var(std::move(value)); }

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  FP8T_CHECK(a.device() == b.device(), "{}: {} and {} are on different devices; move them to one device", op,
             a.str(), b.str());
}

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  FP8T_CHECK(a.dtype() == b.dtype(), "{}: {} and {} have different dtypes; cast them to one dtype", op, a.str(),
             b.str());
}

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

#ifdef FP8T_HAVE_CUDA
// cuda_ops take gradients by reference; an input that needs none gets a throwaway buffer.
inline Tensor grad_or_scratch(const Var& v, DType scratch_dtype) {
  if (v->requires_grad) return grad_of(v);
  return zeros_like(v->value, scratch_dtype);
}

// cuda_ops take optional gradients as pointers: null for one that is not wanted (undefined).
inline Tensor* or_null(Tensor& t) { return t.defined() ? &t : nullptr; }
#endif

#ifdef FP8T_HAVE_CUDA
// The gradient of v for an op that can overwrite or accumulate: one that does not exist yet is
// allocated uninitialised and `accumulate` is false, so the op writes it without a zero fill.
inline Tensor grad_for_write(const Var& v, bool& accumulate) {
  accumulate = grad_exists(v);
  if (!accumulate) {
    const Tensor& value = value_of(v);
    v->grad = Tensor::empty(value.shape(), value.dtype(), value.device(), MemCategory::activations);
  }
  return v->grad;
}
#endif

template <typename F>
const F* cptr(const Tensor& t) {
  return t.data<F>();
}

}  // namespace fp8t::ops_detail
