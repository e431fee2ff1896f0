// Fused softmax cross-entropy against the CPU reference; padded columns must get zero gradient.
#include <catch2/catch_test_macros.hpp>

#include "gpu_test_util.h"
#include "ops/cpu/reference.h"
#include "ops/cuda_ops.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("cross-entropy forward and in-place backward", "[gpu][classifier]") {
  struct Case { int64_t BT, V, Vp; };
  for (auto [BT, V, Vp] : {Case{1, 10, 16}, Case{77, 1000, 1024}, Case{64, 50257, 50304}}) {
    const auto logits = round_bf16(randn(BT * Vp, 3.0f));
    const auto targets = randint(BT, static_cast<int32_t>(V));
    Tensor tl = upload(logits, {BT, Vp}, DType::bf16);
    Tensor tt = upload_i32(targets, {BT});
    Tensor losses = poisoned({BT}, DType::f32);
    cuda_ops::crossentropy_forward(losses, tl, tt, V);
    std::vector<float> rloss(BT);
    cpu::crossentropy_forward(rloss.data(), logits.data(), targets.data(), BT, V, Vp);
    CHECK(rel_err(download(losses), rloss) < 1e-4);

    const float dloss = 1.0f / BT;
    std::vector<float> dl(BT, dloss), rgrad(BT * Vp, 0.0f);
    cpu::crossentropy_backward(rgrad.data(), logits.data(), targets.data(), dl.data(), BT, V, Vp);
    Tensor dlogits = poisoned({BT, Vp}, DType::bf16);
    cuda_ops::crossentropy_backward(dlogits, tl, tt, dloss, V);
    CHECK(rel_err(download(dlogits), rgrad) < 1e-2);
    cuda_ops::crossentropy_backward(tl, tl, tt, dloss, V);  // in place, as the fused classifier runs
    const auto inplace = download(tl);
    CHECK(rel_err(inplace, rgrad) < 1e-2);
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t c = V; c < Vp; ++c) REQUIRE(inplace[r * Vp + c] == 0.0f);
  }
}
