// The attention backward writing qkv's gradient as the E5M2 dy codes of the FP8 linear that made qkv
// (AttentionDyCodes, Fp8DyRequest): the codes, statistics and column sums the bf16 gradient and the linear's own
// cast give, and that linear's gradients unchanged.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "autograd/tape.h"
#include "fp8/device_meta.h"
#include "kernels/attention.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/attention_cuda.h"
#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "util/attention_test_util.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

bool writes_dy_codes() { return cuda_ops::attention_writes_dy_codes({1, 1, 3 * 64}, 1); }

// One backward of attention over random qkv (B, T, 3C) in each of its forms, twice: into a NaN-poisoned bf16 dqkv
// then kernels::fp8_cast to E5M2 (the reference), and as dy codes. dy_scale = fmax / amax * headroom: > 1 saturates.
void check_dy_codes(int B, int T, int NH, bool qkv_codes, bool out_codes, float headroom) {
  INFO("B=" << B << " T=" << T << " NH=" << NH << (qkv_codes ? ", qkv as codes" : ", qkv bf16")
            << (out_codes ? ", O as codes" : ", O bf16") << ", headroom " << headroom);
  const AttentionBackwardCase ac = make_attention_case(B, T, NH, qkv_codes, out_codes);
  const int C = ac.C;
  const int64_t M = ac.M;
  const std::vector<float> g = ac.plain_dqkv();
  const Tensor dqkv = upload(g, {B, T, 3 * C}, DType::bf16);  // the reference cast's input
  float amax = 0.0f;
  for (float v : g) amax = std::max(amax, std::fabs(v));
  REQUIRE(std::isfinite(amax));
  REQUIRE(amax > 0.0f);
  const Tensor scale = upload({57344.0f / amax * headroom}, {1}, DType::f32);

  // The reference: the plain cast of the bf16 gradient, statistics and column sums from zero.
  Tensor codes = poisoned({M, 3 * C}, DType::e5m2), codes_t = poisoned({3 * C, M}, DType::e5m2);
  Tensor stats = Tensor::zeros({kernels::cast_stats_floats(3 * C)}, DType::f32, kGpu);
  float* s = stats.data<float>();
  const int64_t a = kernels::cast_stats_amax_index(3 * C);
  kernels::fp8_cast(dqkv.raw(), DType::bf16, M, 3 * C, codes.data<uint8_t>(), codes_t.data<uint8_t>(),
                    Fp8Format::e5m2, scale.data<float>(),
                    {s + a, reinterpret_cast<unsigned long long*>(s + a + 2), s}, kernels::compute_stream());

  // The codes path; its buffers come from the caching allocator: poison blocks of their sizes first, so that an
  // element the kernels skip holds the E5M2 NaN code 0x7F, which no finite gradient gives.
  for (Shape shape : {Shape{M, 3 * C}, Shape{3 * C, M}}) {
    Tensor p = Tensor::empty(shape, DType::e5m2, kGpu, MemCategory::workspace);
    CUDA_CHECK(cudaMemset(p.raw(), 0x7F, p.nbytes()));
  }
  const Fp8DyRequest request{.scale = scale.data<float>(), .codes = true, .codes_t = true};
  const PendingGrad p = cuda_ops::attention_backward_dy_codes(request, ac.dout, ac.forms(), ac.lse, NH);
  REQUIRE(p.dy_codes.shape() == Shape{M, 3 * C});
  REQUIRE(p.dy_codes_t.shape() == Shape{3 * C, M});
  CHECK(code_mismatches_but_zero_sign(download_bytes(p.dy_codes), download_bytes(codes)) == 0);
  CHECK(code_mismatches_but_zero_sign(download_bytes(p.dy_codes_t), download_bytes(codes_t)) == 0);

  const std::vector<float> got = download(p.dy_stats), want = download(stats);
  check_same_kept_stats(got, want, a);
  if (headroom > 1.0f) CHECK(kept_saturated(want, a) > 0);
  // Column sums: f32 sums in another order; each within 1e-5 of its column's sum of |x|.
  int64_t colsum_bad = 0;
  for (int c = 0; c < 3 * C; ++c) {
    double abs_sum = 0.0;
    for (int64_t r = 0; r < M; ++r) abs_sum += std::fabs(g[r * 3 * C + c]);
    colsum_bad += !(std::fabs(double(got[c]) - want[c]) <= 1e-5 * abs_sum + 1e-30);
  }
  CHECK(colsum_bad == 0);
}

}  // namespace

TEST_CASE("attention backward writes qkv's gradient as the E5M2 codes the cast gives", "[gpu][attention][fp8]") {
  if (!writes_dy_codes()) SKIP("dy codes need the warpgroup-MMA kernels (head size 64 on a Hopper, sm_90a build)");
  // T ragged against the 64-row tiles, and (333) not a multiple of 16: the transposed codes' byte path.
  for (auto [B, T, NH] : {std::tuple{2, 8, 3}, std::tuple{3, 80, 3}, std::tuple{1, 333, 5}, std::tuple{2, 1024, 2}})
    for (bool qkv_codes : {false, true})
      for (bool out_codes : {false, true}) {
        if (out_codes && int64_t(B) * T % 16 != 0) continue;  // O's transposed codes need B * T a multiple of 16
        check_dy_codes(B, T, NH, qkv_codes, out_codes, 0.5f);
      }
  check_dy_codes(2, 80, 3, false, false, 8.0f);  // a scale that saturates: the counts agree too
}

namespace {

struct StepResult {
  std::vector<float> dx, dw, db;
  Fp8DeviceSlot dy_slot;
};
struct StepInputs {
  std::vector<float> x, w, b, dout;
};

// x (B, T, IC) -> fp8_linear (qkv) -> attention -> dout, two steps (the second with delayed scales from the first);
// `fused`: the attention backward writes the linear's dy codes, else the request is withdrawn and the linear casts.
std::vector<StepResult> run_block(int B, int T, int NH, int IC, ActivationStorage storage, bool fused,
                                  const std::vector<StepInputs>& inputs) {
  const int C = NH * 64;
  std::vector<StepResult> steps;
  Fp8Config cfg;
  cfg.activation_storage = storage;
  Fp8LinearState st("h.0.attn.c_attn", cfg);
  for (const auto& [x, w, b, dout] : inputs) {
    Var xv = make_var(upload(x, {B, T, IC}, DType::bf16), true);
    Var wv = make_var(upload(w, {3 * C, IC}, DType::bf16), true), bv = make_var(upload(b, {3 * C}, DType::bf16), true);
    wv->grad = Tensor::zeros({3 * C, IC}, DType::f32, kGpu, MemCategory::gradients);
    bv->grad = Tensor::zeros({3 * C}, DType::f32, kGpu, MemCategory::gradients);
    Tape tape;
    Var out;
    {
      TapeScope scope(&tape);
      Var qkv = fp8_linear(xv, wv, bv, st);
      REQUIRE(qkv->grad_cell->fp8_dy);  // delayed scaling, E5M2 gradients: the linear asks
      if (!fused) qkv->grad_cell->fp8_dy.reset();
      out = attention(qkv, NH, storage == ActivationStorage::fp8_all);
    }
    grad_of(out).copy_from(upload(dout, {B, T, C}, DType::bf16));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    StepResult r{download(grad_of(xv)), download(wv->grad), download(bv->grad), {}};
    CUDA_CHECK(cudaMemcpy(&r.dy_slot, st.device.slots(kGpu, st.metas()) + static_cast<int>(Fp8Role::grad_output),
                          sizeof(Fp8DeviceSlot), cudaMemcpyDeviceToHost));
    steps.push_back(std::move(r));
    st.on_optimizer_step();
  }
  return steps;
}

}  // namespace

TEST_CASE("attention backward's dy codes: the FP8 qkv linear's gradients as with its own cast - storages",
          "[gpu][attention][fp8]") {
  if (!writes_dy_codes()) SKIP("dy codes need the warpgroup-MMA kernels (head size 64 on a Hopper, sm_90a build)");
  for (auto storage : {ActivationStorage::fp8, ActivationStorage::fp8_all})
    for (auto [B, T, NH] : {std::tuple{2, 80, 3}, std::tuple{1, 336, 2}}) {
      INFO("B=" << B << " T=" << T << " NH=" << NH << " storage " << static_cast<int>(storage));
      const int IC = 96, C = NH * 64;
      const int64_t M = int64_t(B) * T;
      std::vector<StepInputs> inputs;  // fresh for each case, the same for both runs
      for (int step = 0; step < 2; ++step)
        inputs.push_back({round_bf16(randn(M * IC)), round_bf16(randn(int64_t(3) * C * IC, 0.05f)),
                          round_bf16(randn(3 * C, 0.1f)), round_bf16(randn(M * C, 1e-2f))});
      const auto fused = run_block(B, T, NH, IC, storage, true, inputs);
      const auto cast = run_block(B, T, NH, IC, storage, false, inputs);
      for (size_t step = 0; step < fused.size(); ++step) {
        INFO("step " << step);
        CHECK(fused[step].dx == cast[step].dx);  // dgrad and wgrad read the same codes: bit for bit
        CHECK(fused[step].dw == cast[step].dw);
        CHECK(rel_err(fused[step].db, cast[step].db) < 1e-5);  // column sums in another order
        CHECK(fused[step].dy_slot.amax == cast[step].dy_slot.amax);
        CHECK(fused[step].dy_slot.saturated == cast[step].dy_slot.saturated);
        CHECK(fused[step].dy_slot.scale == cast[step].dy_slot.scale);
      }
    }
}
