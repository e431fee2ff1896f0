// The pools' block policy (the CUDA pool's best fit uses it) and the CPU allocator's accounting.
#include <catch2/catch_test_macros.hpp>

#include "core/allocator.h"

using namespace fp8t;

TEST_CASE("pool: a cached block serves a request only when it is not much larger", "[allocator]") {
  constexpr size_t MiB = size_t{1} << 20;
  CHECK(round_block_size(1) == 1024);
  CHECK(round_block_size(3 * MiB + 1) == 4 * MiB);
  CHECK_FALSE(pool_block_fits(1024, 2048));                       // too small
  CHECK(pool_block_fits(4096, 2048));                             // small blocks: up to twice
  CHECK_FALSE(pool_block_fits(8192, 2048));
  CHECK(pool_block_fits(64 * MiB, 64 * MiB));                     // large blocks: up to 1/8 more
  CHECK(pool_block_fits(72 * MiB, 64 * MiB));
  CHECK_FALSE(pool_block_fits(74 * MiB, 64 * MiB));
  CHECK_FALSE(pool_block_fits(size_t{4} << 30, size_t{2} << 30));  // the 2.1 GiB ask that found a 4 GiB block
}

TEST_CASE("cpu allocator: accounting by category and reuse of freed blocks", "[allocator]") {
  Allocator& a = allocator_for(Device::cpu());
  const MemoryStats before = a.stats();
  void* p = a.allocate(3 << 20, MemCategory::gradients);
  CHECK(a.stats().cur(MemCategory::gradients) - before.cur(MemCategory::gradients) == (3 << 20));
  const int64_t reserved = a.stats().reserved;
  a.deallocate(p, 3 << 20, MemCategory::gradients);
  CHECK(a.stats().cur(MemCategory::gradients) == before.cur(MemCategory::gradients));
  void* q = a.allocate(3 << 20, MemCategory::activations);
  CHECK(q != nullptr);
  CHECK(a.stats().reserved == reserved);  // served from the pool
  CHECK(a.stats().pk(MemCategory::activations) >= (3 << 20));
  a.deallocate(q, 3 << 20, MemCategory::activations);
}
