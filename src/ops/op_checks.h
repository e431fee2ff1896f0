// Internal to src/ops: the argument checks the ops and their CUDA launchers (src/ops/<op>_cuda.cpp) share.
// They stay on in release builds and throw with a message naming the op, the argument and what it should be.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "core/launch_limits.h"
#include "core/tensor.h"

namespace fp8t::ops_detail {

// A CUDA launcher's argument: defined, on a CUDA device, of this dtype.
inline void expect(const Tensor& t, DType dtype, const char* op, const char* name) {
  FP8T_CHECK(t.defined(), "{}: {} is undefined", op, name);
  FP8T_CHECK(t.device().is_cuda(), "{}: {} must be on a CUDA device, got {}", op, name, t.str());
  FP8T_CHECK(t.dtype() == dtype, "{}: {} must be {}, got {}", op, name, dtype_name(dtype), t.str());
}

// A CUDA launcher's argument that may be f32 or bf16.
inline void expect_float(const Tensor& t, const char* op, const char* name) {
  FP8T_CHECK(t.defined() && t.device().is_cuda(), "{}: {} must be a CUDA tensor", op, name);
  FP8T_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "{}: {} must be f32 or bf16, got {}", op, name,
             t.str());
}

inline void expect_shape(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  FP8T_CHECK(t.shape() == shape, "{}: {} has shape {}, expected {}", op, name, shape_str(t.shape()), shape_str(shape));
}

inline void expect_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  FP8T_CHECK(t.numel() == n, "{}: {} has {} elements ({}), expected {}", op, name, t.numel(), shape_str(t.shape()), n);
}

// A single dimension the kernels take as int (their offsets are 64-bit: only each dimension must fit).
inline int to_int(int64_t v, const char* op, const char* what) { return checked_int(v, op, what); }

// Leading dimensions flattened: (..., last) -> rows.
inline int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.numel() / std::max<int64_t>(t.dim(-1), 1); }

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  FP8T_CHECK(a.device() == b.device(), "{}: {} and {} are on different devices; move them to one device", op,
             a.str(), b.str());
}

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  FP8T_CHECK(a.dtype() == b.dtype(), "{}: {} and {} have different dtypes; cast them to one dtype", op, a.str(),
             b.str());
}

}  // namespace fp8t::ops_detail
