// HostStaging on the CPU: the copy is a memcpy of the asked range, and a range past the end is refused.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <vector>

#include "core/host_staging.h"

using namespace fp8t;

TEST_CASE("host staging: on the CPU a copy is a memcpy of the range - past the end is refused", "[core]") {
  HostStaging staging(16, Device::cpu());
  REQUIRE(staging.size() == 16);
  auto* p = static_cast<unsigned char*>(staging.data());
  for (int i = 0; i < 16; ++i) p[i] = static_cast<unsigned char>(i + 1);
  staging.wait();  // nothing queued: returns at once
  std::vector<unsigned char> dst(8, 0);
  staging.copy_to(dst.data(), 4, 8);
  CHECK(dst == std::vector<unsigned char>{5, 6, 7, 8, 9, 10, 11, 12});
  CHECK_THROWS_WITH(staging.copy_to(dst.data(), 12, 8), Catch::Matchers::ContainsSubstring("bytes [12, 20) of 16"));
}
