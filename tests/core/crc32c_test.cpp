// CRC32C: published check values, a bit-at-a-time reference from the polynomial, and the SSE4.2 and table
// paths agreeing on odd lengths, unaligned starts and chunked (streaming) use.
#include <catch2/catch_test_macros.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/crc32c.h"

using namespace fp8t;

namespace {

// The definition: reflected CRC-32 over polynomial 0x1EDC6F41, init and final xor 0xFFFFFFFF, one bit at
// a time (no tables, no instruction).
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int b = 0; b < 8; ++b) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

uint32_t of(const std::vector<unsigned char>& v) { return crc32c(v.data(), v.size()); }
uint32_t of(const std::string& s) { return crc32c(s.data(), s.size()); }

}  // namespace

TEST_CASE("crc32c: published check values", "[core][crc32c]") {
  CHECK(of(std::string()) == 0u);
  CHECK(of(std::string("a")) == 0xC1D04330u);
  CHECK(of(std::string("123456789")) == 0xE3069283u);  // the CRC catalogue's check value
  CHECK(of(std::string("The quick brown fox jumps over the lazy dog")) == 0x22620404u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of ones, ascending and descending.
  std::vector<unsigned char> v(32, 0);
  CHECK(of(v) == 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xFF);
  CHECK(of(v) == 0x62A8AB43u);
  std::iota(v.begin(), v.end(), 0);
  CHECK(of(v) == 0x46DD794Eu);
  for (size_t i = 0; i < 32; ++i) v[i] = static_cast<unsigned char>(31 - i);
  CHECK(of(v) == 0x113FDB5Cu);
}

TEST_CASE("crc32c: the table path and the bitwise definition agree on the check value", "[core][crc32c]") {
  const std::string s = "123456789";
  CHECK(crc32c_bitwise(reinterpret_cast<const unsigned char*>(s.data()), s.size()) == 0xE3069283u);
  CHECK(crc32c_extend_table(0, s.data(), s.size()) == 0xE3069283u);
  if (crc32c_has_sse42()) CHECK(crc32c_extend_sse42(0, s.data(), s.size()) == 0xE3069283u);
}

TEST_CASE("crc32c: both paths match the definition on odd lengths and unaligned starts", "[core][crc32c]") {
  std::mt19937_64 rng(20240520);
  std::vector<unsigned char> buf(5000 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const bool sse = crc32c_has_sse42();
  INFO("SSE4.2 available: " << sse);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t start = rng() % 16, n = trial < 40 ? static_cast<size_t>(trial) : rng() % 5000;
    const unsigned char* p = buf.data() + start;
    INFO("start " << start << " length " << n);
    const uint32_t want = crc32c_bitwise(p, n);
    REQUIRE(crc32c_extend_table(0, p, n) == want);
    if (sse) REQUIRE(crc32c_extend_sse42(0, p, n) == want);
    REQUIRE(crc32c(p, n) == want);
  }
}

TEST_CASE("crc32c: extending chunk by chunk equals the checksum of the whole", "[core][crc32c]") {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(100003);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint32_t whole = crc32c_bitwise(buf.data(), buf.size());
  for (int trial = 0; trial < 20; ++trial) {
    uint32_t table = 0, dispatched = 0;
    for (size_t at = 0; at < buf.size();) {
      const size_t n = std::min<size_t>(buf.size() - at, 1 + rng() % 9000);
      table = crc32c_extend_table(table, buf.data() + at, n);
      dispatched = crc32c_extend(dispatched, buf.data() + at, n);
      at += n;
    }
    REQUIRE(table == whole);
    REQUIRE(dispatched == whole);
  }
  // A flipped bit anywhere changes the checksum.
  buf[54321] ^= 0x10;
  CHECK(crc32c(buf.data(), buf.size()) != whole);
}
