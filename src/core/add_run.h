// One run of an add or a zero fill over runs (core/tensor_ops.h add_runs_ and zero_runs_, kernels/elementwise.cuh):
// plain structs that host code and kernels share.
#pragma once
#include <cstdint>

namespace fp8t {

// dst[dst_offset + i] += src[src_offset + i] for 0 <= i < n.
struct AddRun {
  int64_t dst_offset;
  int32_t src_offset, n;
};

// dst[offset + i] = 0 for 0 <= i < n.
struct ZeroRun {
  int64_t offset, n;
};

}  // namespace fp8t
