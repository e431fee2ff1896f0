// Launch-size checks (see launch_limits.h).
#include "core/launch_limits.h"

#include "core/check.h"

namespace fp8t {

int checked_int(int64_t v, const char* op, const char* what) {
  FP8T_CHECK(v >= 0 && v <= kMaxInt32, "{}: {} = {} exceeds the kernel's 32-bit limit of {}", op, what, v, kMaxInt32);
  return static_cast<int>(v);
}

unsigned checked_grid(int64_t blocks, int64_t limit, const char* op, const char* what) {
  FP8T_CHECK(blocks >= 1 && blocks <= limit, "{}: {} needs a grid of {} blocks, outside the limit [1, {}]", op, what,
             blocks, limit);
  return static_cast<unsigned>(blocks);
}

}  // namespace fp8t
