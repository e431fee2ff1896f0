// The cross-entropy backward writing dlogits as the E5M2 dy codes of the FP8 lm_head that made the logits
// (Fp8DyRequest): the codes and statistics the bf16 dlogits and the linear's own cast give, and that linear's
// gradients unchanged.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "autograd/tape.h"
#include "fp8/device_meta.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/cross_entropy_cuda.h"
#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("cross-entropy backward writes dlogits as the E5M2 codes the cast gives", "[gpu][cross_entropy][fp8]") {
  struct Case {
    int64_t BT, V, Vp;
    float headroom;  // the scale is 57344 / amax * headroom: > 1 saturates
  };
  for (auto [BT, V, Vp, headroom] : {Case{16, 1000, 1024, 0.5f}, Case{64, 50257, 50304, 0.5f},
                                     Case{48, 4099, 4104, 4.0f}}) {
    INFO("BT=" << BT << " V=" << V << " Vp=" << Vp << " headroom " << headroom);
    const Tensor logits = upload(round_bf16(randn(BT * Vp, 3.0f)), {BT, Vp}, DType::bf16);
    const Tensor targets = upload_i32(randint(BT, static_cast<int32_t>(V)), {BT});
    Tensor losses = poisoned({BT}, DType::f32), lse = poisoned({BT}, DType::f32);
    cuda_ops::cross_entropy_forward(losses, lse, nullptr, logits, targets, V);
    const Tensor dy = upload(std::vector<float>{0.75f}, {1}, DType::f32);
    const std::vector<uint8_t> logits_before = download_bytes(logits);

    Tensor dlogits = poisoned({BT, Vp}, DType::bf16);
    cuda_ops::cross_entropy_backward(dlogits, logits, lse, targets, dy, 1.0f / BT, V);
    float amax = 0.0f;
    for (float v : download(dlogits)) amax = std::max(amax, std::fabs(v));
    REQUIRE(amax > 0.0f);
    const Tensor scale = upload({57344.0f / amax * headroom}, {1}, DType::f32);
    Tensor codes = poisoned({BT, Vp}, DType::e5m2), codes_t = poisoned({Vp, BT}, DType::e5m2);
    Tensor stats = Tensor::zeros({kernels::cast_stats_floats(Vp)}, DType::f32, kGpu);
    float* a = stats.data<float>() + kernels::cast_stats_amax_index(Vp);
    kernels::fp8_cast(dlogits.raw(), DType::bf16, BT, Vp, codes.data<uint8_t>(), codes_t.data<uint8_t>(),
                      Fp8Format::e5m2, scale.data<float>(), {a, reinterpret_cast<unsigned long long*>(a + 2)},
                      kernels::compute_stream());

    const Fp8DyRequest request{.scale = scale.data<float>(), .codes = true, .codes_t = true};
    REQUIRE(cuda_ops::cross_entropy_writes_dy_codes(request, logits));
    const PendingGrad p = cuda_ops::cross_entropy_backward_dy_codes(request, logits, lse, targets, dy, 1.0f / BT, V);
    CHECK(code_mismatches_but_zero_sign(download_bytes(p.dy_codes), download_bytes(codes)) == 0);
    CHECK(code_mismatches_but_zero_sign(download_bytes(p.dy_codes_t), download_bytes(codes_t)) == 0);
    const std::vector<float> got = download(p.dy_stats), want = download(stats);
    const int64_t ai = kernels::cast_stats_amax_index(Vp);
    check_same_kept_stats(got, want, ai);
    if (headroom > 1.0f) CHECK(kept_saturated(want, ai) > 0);
    CHECK(download_bytes(logits) == logits_before);  // the logits are not overwritten
  }
  // A request with column sums (an lm_head with a bias) is not taken: the op casts as before.
  const Tensor logits = upload(round_bf16(randn(16 * 1024)), {16, 1024}, DType::bf16);
  const Tensor one = upload({1.0f}, {1}, DType::f32);
  CHECK_FALSE(cuda_ops::cross_entropy_writes_dy_codes(
      Fp8DyRequest{.scale = one.data<float>(), .codes = true, .codes_t = true, .colsum = true}, logits));
}

namespace {

struct HeadResult {
  std::vector<float> dh, dw;
  Fp8DeviceSlot dy_slot;
};

// h (B, T, C) -> FP8 lm_head (no bias) -> cross_entropy, two steps; `fused`: the loss's backward writes the
// lm_head's dy codes, else the request is withdrawn and the linear casts dlogits itself.
std::vector<HeadResult> run_head(int B, int T, int C, int Vp, int V, bool fused, const std::vector<float>& h0,
                                 const std::vector<float>& w0, const std::vector<int32_t>& targets) {
  Fp8LinearState st("lm_head", Fp8Config{});
  std::vector<HeadResult> steps;
  for (int step = 0; step < 2; ++step) {
    Var hv = make_var(upload(h0, {B, T, C}, DType::bf16), true);
    Var wv = make_var(upload(w0, {Vp, C}, DType::bf16), true);
    wv->grad = Tensor::zeros({Vp, C}, DType::f32, kGpu, MemCategory::gradients);
    Tape tape;
    Var loss;
    {
      TapeScope scope(&tape);
      Var logits = fp8_linear(hv, wv, Var(), st);
      REQUIRE(logits->grad_cell->fp8_dy);
      if (!fused) logits->grad_cell->fp8_dy.reset();
      loss = cross_entropy(logits, upload_i32(targets, {B, T}), V);
    }
    tape.backward(loss, 1.0f);
    HeadResult r{download(grad_of(hv)), download(wv->grad), {}};
    CUDA_CHECK(cudaMemcpy(&r.dy_slot, st.device.slots(kGpu, st.metas()) + static_cast<int>(Fp8Role::grad_output),
                          sizeof(Fp8DeviceSlot), cudaMemcpyDeviceToHost));
    steps.push_back(std::move(r));
    st.on_optimizer_step();
  }
  return steps;
}

}  // namespace

TEST_CASE("cross-entropy's dy codes: the FP8 lm_head's gradients as with its own cast", "[gpu][cross_entropy][fp8]") {
  const int B = 2, T = 48, C = 64, Vp = 1024, V = 1000;
  const auto h = round_bf16(randn(int64_t(B) * T * C)), w = round_bf16(randn(int64_t(Vp) * C, 0.05f));
  const auto targets = randint(int64_t(B) * T, V);
  const auto fused = run_head(B, T, C, Vp, V, true, h, w, targets);
  const auto cast = run_head(B, T, C, Vp, V, false, h, w, targets);
  for (size_t step = 0; step < fused.size(); ++step) {
    INFO("step " << step);
    CHECK(fused[step].dh == cast[step].dh);  // dgrad and wgrad read the same codes: bit for bit
    CHECK(fused[step].dw == cast[step].dw);
    CHECK(fused[step].dy_slot.amax == cast[step].dy_slot.amax);
    CHECK(fused[step].dy_slot.saturated == cast[step].dy_slot.saturated);
    CHECK(fused[step].dy_slot.scale == cast[step].dy_slot.scale);
  }
}
