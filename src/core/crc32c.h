// CRC32C (Castagnoli polynomial, reflected 0x82F63B78), the checksum of checkpoint files: the SSE4.2
// crc32 instruction where the CPU has it, a slicing-by-8 table elsewhere; both give the same values.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fp8t {

// The CRC32C of `crc`'s bytes followed by data[0, n): crc is the value returned for the bytes before
// (0 for none), so a file's checksum can be computed chunk by chunk as it is written.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// The two implementations behind crc32c_extend, for tests and benchmarks. crc32c_extend_sse42 may be
// called only when crc32c_has_sse42() (always false off x86-64).
bool crc32c_has_sse42();
uint32_t crc32c_extend_sse42(uint32_t crc, const void* data, size_t n);
uint32_t crc32c_extend_table(uint32_t crc, const void* data, size_t n);

}  // namespace fp8t
