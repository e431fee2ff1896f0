// Fused softmax cross-entropy against the CPU reference; padded columns must get zero gradient.
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "util/gpu_test_util.h"
#include "autograd/tape.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/linear.h"
#include "ops/cross_entropy_cuda.h"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("cross-entropy forward and in-place backward", "[gpu][cross_entropy]") {
  struct Case { int64_t BT, V, Vp; };
  for (auto [BT, V, Vp] : {Case{1, 10, 16}, Case{77, 1000, 1024}, Case{64, 50257, 50304}, Case{5, 50257, 50257}, Case{300, 4099, 4104}}) {
    const auto logits = round_bf16(randn(BT * Vp, 3.0f));
    const auto targets = randint(BT, static_cast<int32_t>(V));
    Tensor tl = upload(logits, {BT, Vp}, DType::bf16);
    Tensor tt = upload_i32(targets, {BT});
    Tensor losses = poisoned({BT}, DType::f32), lse = poisoned({BT}, DType::f32), mean = poisoned({1}, DType::f32);
    cuda_ops::cross_entropy_forward(losses, lse, &mean, tl, tt, V);
    std::vector<float> rloss(BT);
    cpu::cross_entropy_forward(rloss.data(), logits.data(), targets.data(), BT, V, Vp);
    CHECK(rel_err(download(losses), rloss) < 1e-4);
    double rmean = 0.0;
    for (float l : rloss) rmean += l / double(BT);
    CHECK(std::abs(download(mean)[0] - rmean) < 1e-4 * std::abs(rmean));

    // The loss gradient comes from the device (as the tape's seed does), times 1 / BT.
    const float seed = 0.75f;
    std::vector<float> dl(BT, seed / BT), rgrad(BT * Vp, 0.0f);
    cpu::cross_entropy_backward(rgrad.data(), logits.data(), targets.data(), dl.data(), BT, V, Vp);
    Tensor dy = upload(std::vector<float>{seed}, {1}, DType::f32);
    Tensor dlogits = poisoned({BT, Vp}, DType::bf16);
    cuda_ops::cross_entropy_backward(dlogits, tl, lse, tt, dy, 1.0f / BT, V);
    CHECK(rel_err(download(dlogits), rgrad) < 1e-2);
    cuda_ops::cross_entropy_backward(tl, tl, lse, tt, dy, 1.0f / BT, V);  // in place, as the op runs
    const auto inplace = download(tl);
    CHECK(rel_err(inplace, rgrad) < 1e-2);
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t c = V; c < Vp; ++c) REQUIRE(inplace[r * Vp + c] == 0.0f);
  }
}

// The chunked head computes d(w) chunk by chunk during the forward pass: every chunk, and every
// micro-batch before it, must accumulate into w's gradient (a beta-0 GEMM would keep only the last chunk). A stale
// gradient (GradCell::stale, the trainer's deferred zeroing), here NaN, is overwritten by the first chunk only.
TEST_CASE("lm_head_loss on the GPU: the weight gradient sums every chunk and accumulates", "[gpu][cross_entropy]") {
  const int64_t B = 2, T = 48, C = 64, V = 500, Vp = 512;
  const auto h0 = round_bf16(randn(B * T * C, 1.0f)), w0 = round_bf16(randn(Vp * C, 0.3f));
  const auto targets = randint(B * T, static_cast<int32_t>(V));
  // Reference on the CPU in f32 from the same bf16 inputs: the full (B*T, Vp) head at once.
  std::vector<float> logits(B * T * Vp), dl(B * T, 1.0f / (B * T)), dlogits(B * T * Vp, 0.0f), dw_ref(Vp * C, 0.0f);
  cpu::matmul_forward<float>(logits.data(), h0.data(), w0.data(), nullptr, B * T, C, Vp);
  std::vector<float> losses(B * T);
  cpu::cross_entropy_forward<float>(losses.data(), logits.data(), targets.data(), B * T, V, Vp);
  cpu::cross_entropy_backward<float>(dlogits.data(), logits.data(), targets.data(), dl.data(), B * T, V, Vp);
  cpu::matmul_backward<float>(nullptr, dw_ref.data(), nullptr, dlogits.data(), h0.data(), nullptr, B * T, C, Vp);
  const Tensor tt = upload_i32(targets, {B, T});
  for (int64_t chunk : {int64_t{16}, int64_t{32}, B * T}) {
    for (bool stale : {false, true}) {
      INFO("chunk rows " << chunk << (stale ? ", stale gradient" : ""));
      Var h = make_var(upload(h0, {B, T, C}, DType::bf16), true);
      Var w = make_var(upload(w0, {Vp, C}, DType::bf16), true);
      w->grad = upload(std::vector<float>(Vp * C, stale ? std::nanf("") : 0.0f), {Vp, C}, DType::f32);
      w->grad_cell->stale = stale;
      for (int micro = 0; micro < 2; ++micro) {  // two micro-batches: the second adds to the first
        Tape tape;
        Var loss;
        {
          TapeScope s(&tape);
          loss = lm_head_loss(h, w, tt, V, chunk, 1.0f);
        }
        tape.backward(loss, 1.0f);
      }
      std::vector<float> twice(dw_ref.size());
      for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0f * dw_ref[i];
      CHECK(rel_err(download(w->grad), twice) < 2e-2);
      CHECK_FALSE(w->grad_cell->stale);
    }
  }
}
