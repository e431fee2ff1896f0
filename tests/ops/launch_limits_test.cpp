// The launch-size checks of core/launch_limits.h that the CUDA launchers run before a launch (tensors
// of more than 2^31 elements are fine; a dimension past int32 or a grid past its limit is an error
// naming the op, the size and the limit, never a wrapped int).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "core/check.h"
#include "core/launch_limits.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("launch limits: 64-bit block counts", "[ops][launch]") {
  STATIC_REQUIRE(ceil_div64(0, 8) == 0);
  STATIC_REQUIRE(ceil_div64(1, 8) == 1);
  STATIC_REQUIRE(ceil_div64(8, 8) == 1);
  STATIC_REQUIRE(ceil_div64(9, 8) == 2);
  // The MLP hidden of 700 x 1024 tokens at C = 768: 2.2e9 elements, 8.6e6 blocks of 256.
  STATIC_REQUIRE(ceil_div64(int64_t{700} * 1024 * 3072, 256) == int64_t{8601600});
  // Past 2^31 blocks, where an int ceil_div wraps.
  STATIC_REQUIRE(ceil_div64(int64_t{1} << 40, 256) == int64_t{1} << 32);
}

TEST_CASE("launch limits: checked_int accepts int32 sizes and names what overflows", "[ops][launch]") {
  CHECK(checked_int(0, "op", "rows") == 0);
  CHECK(checked_int(kMaxInt32, "op", "rows") == 0x7fffffff);
  CHECK_THROWS_WITH(checked_int(kMaxInt32 + 1, "matmul_forward", "M"),
                    ContainsSubstring("matmul_forward: M = 2147483648") && ContainsSubstring("2147483647"));
  CHECK_THROWS_WITH(checked_int(int64_t{700} * 1024 * 3072, "fp8_linear (h0.mlp.fc2)", "in features"),
                    ContainsSubstring("fp8_linear (h0.mlp.fc2): in features = 2202009600"));
  CHECK_THROWS_AS(checked_int(-1, "op", "rows"), Error);
}

TEST_CASE("launch limits: checked_grid enforces the x and y grid limits", "[ops][launch]") {
  CHECK(checked_grid(1, kMaxGridX, "op", "rows") == 1u);
  CHECK(checked_grid(kMaxGridX, kMaxGridX, "op", "rows") == 0x7fffffffu);
  CHECK(checked_grid(65535, kMaxGridYZ, "op", "rows") == 65535u);
  // embedding: one block per token; 2^21 sequences of 1024 tokens is one block too many.
  CHECK_THROWS_WITH(checked_grid(int64_t{1} << 31, kMaxGridX, "embedding_forward", "B*T tokens (one block each)"),
                    ContainsSubstring("embedding_forward: B*T tokens (one block each) needs a grid of 2147483648 blocks") &&
                        ContainsSubstring("2147483647"));
  // fp8_cast's tiled kernel: 128 rows per grid row, at most 65535 grid rows.
  CHECK_NOTHROW(checked_grid(ceil_div64(int64_t{65535} * 128, 128), kMaxGridYZ, "fp8_cast", "rows"));
  CHECK_THROWS_WITH(checked_grid(ceil_div64(int64_t{65535} * 128 + 1, 128), kMaxGridYZ, "fp8_cast (tiled)",
                                 "rows (128 per tile)"),
                    ContainsSubstring("fp8_cast (tiled): rows (128 per tile) needs a grid of 65536 blocks") &&
                        ContainsSubstring("65535"));
  // Rows whose int tile count would wrap to a negative number (which passed the old `<= 65535` check).
  CHECK_THROWS_AS(checked_grid(ceil_div64(int64_t{1} << 38, 128), kMaxGridYZ, "fp8_cast", "rows"), Error);
  CHECK_THROWS_AS(checked_grid(0, kMaxGridX, "op", "rows"), Error);
}
