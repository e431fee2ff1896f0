// Fused softmax cross-entropy against the CPU reference; padded columns must get zero gradient.
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "gpu_test_util.h"
#include "ops/cpu/reference.h"
#include "ops/cuda_ops.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("cross-entropy forward and in-place backward", "[gpu][classifier]") {
  struct Case { int64_t BT, V, Vp; };
  for (auto [BT, V, Vp] : {Case{1, 10, 16}, Case{77, 1000, 1024}, Case{64, 50257, 50304}, Case{5, 50257, 50257}, Case{300, 4099, 4104}}) {
    const auto logits = round_bf16(randn(BT * Vp, 3.0f));
    const auto targets = randint(BT, static_cast<int32_t>(V));
    Tensor tl = upload(logits, {BT, Vp}, DType::bf16);
    Tensor tt = upload_i32(targets, {BT});
    Tensor losses = poisoned({BT}, DType::f32), lse = poisoned({BT}, DType::f32), mean = poisoned({1}, DType::f32);
    cuda_ops::crossentropy_forward(losses, lse, &mean, tl, tt, V);
    std::vector<float> rloss(BT);
    cpu::crossentropy_forward(rloss.data(), logits.data(), targets.data(), BT, V, Vp);
    CHECK(rel_err(download(losses), rloss) < 1e-4);
    double rmean = 0.0;
    for (float l : rloss) rmean += l / double(BT);
    CHECK(std::abs(download(mean)[0] - rmean) < 1e-4 * std::abs(rmean));

    // The loss gradient comes from the device (as the tape's seed does), times 1 / BT.
    const float seed = 0.75f;
    std::vector<float> dl(BT, seed / BT), rgrad(BT * Vp, 0.0f);
    cpu::crossentropy_backward(rgrad.data(), logits.data(), targets.data(), dl.data(), BT, V, Vp);
    Tensor dy = upload(std::vector<float>{seed}, {1}, DType::f32);
    Tensor dlogits = poisoned({BT, Vp}, DType::bf16);
    cuda_ops::crossentropy_backward(dlogits, tl, lse, tt, dy, 1.0f / BT, V);
    CHECK(rel_err(download(dlogits), rgrad) < 1e-2);
    cuda_ops::crossentropy_backward(tl, tl, lse, tt, dy, 1.0f / BT, V);  // in place, as the fused classifier runs
    const auto inplace = download(tl);
    CHECK(rel_err(inplace, rgrad) < 1e-2);
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t c = V; c < Vp; ++c) REQUIRE(inplace[r * Vp + c] == 0.0f);
  }
}
