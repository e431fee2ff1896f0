// The NCCL communicator on one rank (one GPU is all a test machine has): every collective, the all-gather with
// per-rank counts (a group of broadcasts) on BF16 and FP8 bytes included, leaves the data as it was and returns
// in stream order. Several ranks run in the trainer's multi-GPU jobs only.
#include <catch2/catch_test_macros.hpp>
#include <cstring>
#include <vector>

#include "dist/comm.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using test::kGpu;

#ifdef FP8T_HAVE_NCCL
TEST_CASE("nccl: one rank - all_gather_v of bf16 and fp8 bytes, all_reduce, broadcast keep the data", "[gpu][dist]") {
  auto comm = make_nccl_communicator(0, 1, 0, 60, [](std::span<char>) {});
  REQUIRE(comm->size() == 1);
  for (const DType dt : {DType::bf16, DType::e4m3}) {
    const int64_t n = 1000 + 3;
    Tensor host = Tensor::empty({n}, dt);
    std::vector<uint8_t> want(host.nbytes());
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(test::rng()() & 0xFF);
    if (dt == DType::bf16)  // finite bf16 values only: NaN payloads are not promised to survive
      for (size_t i = 1; i < want.size(); i += 2) want[i] &= 0x3F;
    std::memcpy(host.raw(), want.data(), want.size());
    Tensor t = host.to(kGpu);
    comm->all_gather_v(t, {0, n});
    const Tensor back = t.to(Device::cpu());
    CHECK(std::memcmp(back.raw(), want.data(), want.size()) == 0);
    CHECK_THROWS(comm->all_gather_v(t, {0, n + 1}));  // past the tensor
    CHECK_THROWS(comm->all_gather_v(t, {0, 5, n}));   // cuts for two ranks
  }
  Tensor f = test::upload({1.5f, -2.0f, 3.25f}, {3}, DType::f32);
  comm->all_reduce(f, ReduceOp::max);
  comm->broadcast(f, 0);
  CHECK(f.to_float_vector() == std::vector<float>{1.5f, -2.0f, 3.25f});
}
#endif
