// One run of an add over runs (core/tensor_ops.h add_runs_, kernels/elementwise.cuh add_runs): a plain struct
// that host code and kernels share.
#pragma once
#include <cstdint>

namespace fp8t {

// dst[dst_offset + i] += src[src_offset + i] for 0 <= i < n.
struct AddRun {
  int64_t dst_offset;
  int32_t src_offset, n;
};

}  // namespace fp8t
