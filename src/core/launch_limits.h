// Host-side checks of kernel launch sizes. The kernels index memory with 64-bit offsets, so a tensor
// may hold more than 2^31 elements; what must still fit are the sizes a launcher passes as int (one
// dimension: rows, columns, a row length) and the block counts of its grid. A launcher checks them
// here and fails with a message naming the op, the size and the limit, instead of letting a narrowing
// conversion wrap. Plain C++ (defined in launch_limits.cpp, so .cu files need not see fmt), built in
// every configuration so that the CPU tests exercise it too.
#pragma once
#include <cstdint>

namespace fp8t {

inline constexpr int64_t kMaxInt32 = 0x7fffffff;  // the largest size a kernel takes as int
inline constexpr int64_t kMaxGridX = 0x7fffffff;  // gridDim.x
inline constexpr int64_t kMaxGridYZ = 65535;      // gridDim.y and gridDim.z

// ceil(a / b) in 64 bits, for a >= 0 and b > 0 (kernels/cuda_common.cuh's ceil_div returns int: for
// counts known to fit).
constexpr int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// v as int, after checking 0 <= v <= 2^31 - 1; `op` names the launcher and `what` the size.
int checked_int(int64_t v, const char* op, const char* what);

// `blocks` as a grid dimension, after checking 1 <= blocks <= limit (kMaxGridX for x, kMaxGridYZ for
// y and z); `what` says what the blocks cover.
unsigned checked_grid(int64_t blocks, int64_t limit, const char* op, const char* what);

}  // namespace fp8t
