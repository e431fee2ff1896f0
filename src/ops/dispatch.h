// Internal to src/ops: picks the CPU reference's element type from a dtype, and guards CUDA-only
// code so a build without CUDA rejects device tensors with a message instead of failing to link.
#pragma once
#include "autograd/variable.h"
#include "core/check.h"
#include "core/tensor.h"

#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_ops.h"
#define FP8T_ON_CUDA(op, ...) __VA_ARGS__
#else
#define FP8T_ON_CUDA(op, ...) \
  FP8T_FAIL("{}: tensor is on a CUDA device but this build has no CUDA (reconfigure with -DFP8T_CUDA=ON)", op)
#endif

namespace fp8t::ops_detail {

// Calls fn.template operator()<F>() with F = float for f32 and double for f64.
template <typename Fn>
void on_cpu(DType dt, const char* op, Fn&& fn) {
  switch (dt) {
    case DType::f32: fn.template operator()<float>(); return;
    case DType::f64: fn.template operator()<double>(); return;
    default:
      FP8T_FAIL("{}: CPU tensors must be f32 or f64, got {} (cast the inputs first)", op, dtype_name(dt));
  }
}

}  // namespace fp8t::ops_detail
