// Internal to src/ops: the one device dispatch of every op. A CUDA tensor runs the op's CUDA branch, a CPU
// tensor its CPU branch typed by the dtype (float for f32, double for f64).
#pragma once
#include <type_traits>

#include "core/check.h"
#include "core/tensor.h"

namespace fp8t::ops_detail {

#ifdef FP8T_HAVE_CUDA
inline constexpr bool kHaveCuda = true;
#else
inline constexpr bool kHaveCuda = false;
#endif

[[noreturn]] inline void fail_without_cuda(const char* op) {
  FP8T_FAIL("{}: tensor is on a CUDA device but this build has no CUDA (reconfigure with -DFP8T_CUDA=ON)", op);
}

// cuda_branch(), for a path that only CUDA has. In a build without CUDA the branch is never called, so its
// body (an inline lambda) is never emitted and nothing links against the CUDA launchers, of which that
// build sees only the declarations (src/ops/<op>_cuda.h); the call fails with a message instead.
template <typename CudaFn>
std::invoke_result_t<CudaFn&> on_cuda(const char* op, CudaFn&& cuda_branch) {
  if constexpr (kHaveCuda) {
    return cuda_branch();
  } else {
    (void)cuda_branch;
    fail_without_cuda(op);
  }
}

// cuda_branch() when t is on a CUDA device, else cpu_branch.template operator()<F>() with F = float for f32
// and double for f64; the branches return the same type. `op` names the op in the error messages.
//   dispatch("gelu", x, [&] { cuda_ops::gelu_forward(out, x); },
//            [&]<typename F>() { cpu::gelu_forward<F>(out.data<F>(), x.data<F>(), x.numel()); });
template <typename CudaFn, typename CpuFn>
std::invoke_result_t<CudaFn&> dispatch(const char* op, const Tensor& t, CudaFn&& cuda_branch, CpuFn&& cpu_branch) {
  if (t.device().is_cuda()) return on_cuda(op, cuda_branch);
  switch (t.dtype()) {
    case DType::f32: return cpu_branch.template operator()<float>();
    case DType::f64: return cpu_branch.template operator()<double>();
    default:
      FP8T_FAIL("{}: CPU tensors must be f32 or f64, got {} (cast the inputs first)", op, dtype_name(t.dtype()));
  }
}

}  // namespace fp8t::ops_detail
