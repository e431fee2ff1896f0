// The caching device allocator: accounting by category, reuse without cudaMalloc, and the OOM report.
#include <catch2/catch_test_macros.hpp>

#include <string>

#include "core/check.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("device allocator accounts by category and reuses blocks", "[gpu][allocator]") {
  Allocator& a = allocator_for(kGpu);
  const MemoryStats before = a.stats();
  void* p = a.allocate(3 << 20, MemCategory::gradients);
  MemoryStats s = a.stats();
  CHECK(s.cur(MemCategory::gradients) - before.cur(MemCategory::gradients) == (3 << 20));
  CHECK(s.reserved >= before.reserved);
  const int64_t reserved = s.reserved;
  a.deallocate(p, 3 << 20, MemCategory::gradients);
  CHECK(a.stats().cur(MemCategory::gradients) == before.cur(MemCategory::gradients));
  void* q = a.allocate(3 << 20, MemCategory::activations);  // same rounded size: served from the pool
  CHECK(q != nullptr);
  CHECK(a.stats().reserved == reserved);  // no cudaMalloc
  CHECK(a.stats().pk(MemCategory::gradients) >= (3 << 20));
  a.deallocate(q, 3 << 20, MemCategory::activations);
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::f32, kGpu, MemCategory::optimizer);
    CHECK(a.stats().cur(MemCategory::optimizer) - before.cur(MemCategory::optimizer) == 4 << 20);
  }
  CHECK(a.stats().cur(MemCategory::optimizer) == before.cur(MemCategory::optimizer));
}

TEST_CASE("device allocator keeps large cached blocks for large requests", "[gpu][allocator]") {
  Allocator& a = allocator_for(kGpu);
  a.release_cached();
  void* big = a.allocate(64 << 20, MemCategory::activations);
  a.deallocate(big, 64 << 20, MemCategory::activations);
  const int64_t reserved = a.stats().reserved;
  void* small = a.allocate(40 << 20, MemCategory::activations);  // must not take the 64 MiB block
  CHECK(small != big);
  CHECK(a.stats().reserved == reserved + (40 << 20));
  void* again = a.allocate(64 << 20, MemCategory::activations);  // which is still there
  CHECK(again == big);
  a.deallocate(small, 40 << 20, MemCategory::activations);
  a.deallocate(again, 64 << 20, MemCategory::activations);
}

TEST_CASE("device out-of-memory report names the category and what to change", "[gpu][allocator]") {
  Allocator& a = allocator_for(kGpu);
  const size_t pib = size_t{1} << 50;
  std::string msg;
  try {
    a.allocate(pib, MemCategory::activations);
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  CHECK(msg.find("activations") != std::string::npos);
  CHECK(msg.find("micro_batch") != std::string::npos);
  CHECK(msg.find("zero_stage") != std::string::npos);
  CHECK(msg.find("free") != std::string::npos);
  // The device still works afterwards.
  Tensor t = Tensor::zeros({16}, DType::f32, kGpu);
  CHECK(download(t)[0] == 0.0f);
}
