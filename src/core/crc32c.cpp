// CRC32C: the SSE4.2 path and the table path, and the runtime choice between them.
#include "core/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace fp8t {

namespace {

static_assert(std::endian::native == std::endian::little, "the slicing-by-8 loads assume little-endian words");

constexpr uint32_t kPolyReflected = 0x82F63B78u;

// kTable[0][b]: the CRC of the single byte b; kTable[k][b]: of b followed by k zero bytes, so eight
// bytes fold into the CRC with eight lookups (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPolyReflected : 0u);
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}
constexpr Tables kTable = make_tables();

uint32_t load_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

uint32_t crc32c_extend_table(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = c ^ load_u32(p), hi = load_u32(p + 4);
    c = kTable[7][lo & 0xFFu] ^ kTable[6][(lo >> 8) & 0xFFu] ^ kTable[5][(lo >> 16) & 0xFFu] ^ kTable[4][lo >> 24] ^
        kTable[3][hi & 0xFFu] ^ kTable[2][(hi >> 8) & 0xFFu] ^ kTable[1][(hi >> 16) & 0xFFu] ^ kTable[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ kTable[0][(c ^ *p) & 0xFFu];
  return ~c;
}

#if defined(__x86_64__)

bool crc32c_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n > 0 && reinterpret_cast<uintptr_t>(p) % 8 != 0; --n, ++p) c = _mm_crc32_u8(c, *p);  // to alignment
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof word);
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
  return ~c;
}

#else

bool crc32c_has_sse42() { return false; }

uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t n) { return crc32c_extend_table(crc, data, n); }

#endif

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  return crc32c_has_sse42() ? crc32c_extend_sse42(crc, data, n) : crc32c_extend_table(crc, data, n);
}

}  // namespace fp8t
