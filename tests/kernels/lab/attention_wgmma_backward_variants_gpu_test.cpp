// The lab's wgmma attention backward variants (kernels/lab/) against the product's backward and the CPU
// reference; a hidden [.bench] case times each against the product.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/lab/attention_wgmma_backward_variants.cuh"
#include "kernels/stream.cuh"
#include "ops/attention_cuda.h"
#include "ops/cpu/attention.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;
using kernels::lab::WgmmaBackwardVariant;

namespace {

using bf16 = __nv_bfloat16;
constexpr int kHs = 64;  // the wgmma kernels' only head size

// One backward problem at head size 64; out and lse from the product's forward.
struct Problem {
  int B, T, NH, C;
  std::vector<float> qkv, dout;
  Tensor tqkv, tdout, out, lse;
  Problem(int B_, int T_, int NH_, float dout_scale = 1.0f) : B(B_), T(T_), NH(NH_), C(NH_ * kHs) {
    qkv = round_bf16(randn(int64_t(B) * T * 3 * C));
    dout = round_bf16(randn(int64_t(B) * T * C, dout_scale));
    tqkv = upload(qkv, {B, T, 3 * C}, DType::bf16);
    tdout = upload(dout, {B, T, C}, DType::bf16);
    out = poisoned({B, T, C}, DType::bf16);
    lse = poisoned({B, NH, T}, DType::f32);
    cuda_ops::attention_forward(out, lse, tqkv, NH);
  }
  Shape qkv_shape() const { return {B, T, 3 * C}; }
};

// The scratch of one backward, poisoned: the passes must overwrite what they read.
struct Scratch {
  Tensor dq_accum, delta;
  explicit Scratch(const Problem& p)
      : dq_accum(poisoned({kernels::attention_dq_scratch_floats(p.B, p.T, p.NH, kHs)}, DType::f32)),
        delta(poisoned({p.B, p.NH, p.T}, DType::f32)) {}
};

// dqkv += the gradient, by the lab's backward with `variant`'s main pass.
void lab_backward(WgmmaBackwardVariant variant, const Problem& p, Tensor& dqkv, Scratch& s) {
  kernels::lab::attention_backward_wgmma(variant, dqkv.data<bf16>(), s.dq_accum.data<float>(), s.delta.data<float>(),
                                         p.tdout.data<bf16>(), p.tqkv.data<bf16>(), p.out.data<bf16>(),
                                         p.lse.data<float>(), p.B, p.T, p.NH, kernels::compute_stream());
}

// Every variant against the product (tight: they differ only in the order of f32 sums, hence at most one bf16
// rounding of dqkv0 + gradient) and against the CPU reference (the bound of the product's own test). dv_during_ds
// makes dS from P rounded to bf16, not the f32 P, so its dK and dQ leave the tight bound (by up to a few bf16 ulps,
// on 3-4% of the elements in the twenty-fifth session's run): the CPU reference's bound only.
void check_variants(int B, int T, int NH) {
  INFO("B=" << B << " T=" << T << " NH=" << NH);
  const Problem p(B, T, NH);
  const int64_t n = int64_t(B) * T * 3 * p.C;
  std::vector<float> rout(int64_t(B) * T * p.C), rlse(int64_t(B) * NH * T), want(n, 0.0f);
  cpu::attention_forward(rout.data(), rlse.data(), p.qkv.data(), B, T, p.C, NH);
  cpu::attention_backward(want.data(), p.dout.data(), p.qkv.data(), rout.data(), rlse.data(), B, T, p.C, NH);
  const auto dqkv0 = round_bf16(randn(n, float(rms(want))));
  for (int64_t i = 0; i < n; ++i) want[i] += dqkv0[i];

  Tensor product = upload(dqkv0, p.qkv_shape(), DType::bf16);
  cuda_ops::attention_backward(product, p.tdout, p.tqkv, p.out, p.lse, NH);
  const auto ref = download(product);
  std::vector<float> grad(n);
  for (int64_t i = 0; i < n; ++i) grad[i] = ref[i] - dqkv0[i];
  const double floor = 1e-3 * rms(grad);
  for (WgmmaBackwardVariant v : kernels::lab::kWgmmaBackwardVariants) {
    INFO("variant: " << kernels::lab::variant_name(v));
    Tensor dqkv = upload(dqkv0, p.qkv_shape(), DType::bf16);
    Scratch scratch(p);
    lab_backward(v, p, dqkv, scratch);
    const auto got = download(dqkv);
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; ++i) {
      const double diff = std::abs(double(got[i]) - ref[i]);
      const bool ok = diff <= std::ldexp(std::max(std::abs(got[i]), std::abs(ref[i])), -7) + floor;  // NaN: not ok
      if (!ok && bad++ == 0) first_bad = i;
    }
    INFO(bad << " elements off the product's; the first at " << first_bad);
    if (v != WgmmaBackwardVariant::dv_during_ds) CHECK(bad == 0);
    CHECK(rel_err(got, want) < 2e-2);
  }
}

// The dy codes of one backward and their statistics (kernels/fp8_cast.cuh's layout), poisoned / zeroed.
struct DyBuffers {
  Tensor codes, codes_t, stats;
  int64_t amax_index;
  DyBuffers(int64_t M, int C3)
      : codes(poisoned({M, C3}, DType::e5m2)),
        codes_t(poisoned({C3, M}, DType::e5m2)),
        stats(Tensor::zeros({kernels::cast_stats_floats(C3)}, DType::f32, kGpu)),
        amax_index(kernels::cast_stats_amax_index(C3)) {}
  kernels::Fp8CastOutputs outputs() {
    float* s = stats.data<float>();
    return {s + amax_index, reinterpret_cast<unsigned long long*>(s + amax_index + 2), s};
  }
};

// Each lab main pass writing dy codes (the 64-key kernel, the 128-key one with cp.async loads) against the plain E5M2
// cast of the product's bf16 gradient (the 64-key kernel's added into a zeroed dqkv): the same codes
// bit for bit (a zero's sign aside), the same amax and saturation count, column sums within 1e-5 of |x|'s.
void check_dy_codes(int B, int T, int NH) {
  INFO("B=" << B << " T=" << T << " NH=" << NH);
  const Problem p(B, T, NH);
  const int64_t M = int64_t(B) * T;
  const int C3 = 3 * p.C;
  for (bool keys64 : {true, false}) {
    INFO((keys64 ? "64 keys, 3 blocks/SM" : "128 keys, cp.async loads"));
    Tensor dqkv = Tensor::zeros(p.qkv_shape(), DType::bf16, kGpu);
    if (keys64) {
      Scratch scratch(p);
      lab_backward(WgmmaBackwardVariant::keys64_3_blocks, p, dqkv, scratch);
    } else {
      cuda_ops::attention_backward(dqkv, p.tdout, p.tqkv, p.out, p.lse, NH, false);
    }
    const std::vector<float> g = download(dqkv);
    float amax = 0.0f;
    for (float v : g) amax = std::max(amax, std::fabs(v));
    REQUIRE(amax > 0.0f);
    const Tensor scale = upload({57344.0f / amax * 0.5f}, {1}, DType::f32);
    DyBuffers want(M, C3), got(M, C3);
    kernels::fp8_cast(dqkv.raw(), DType::bf16, M, C3, want.codes.data<uint8_t>(), want.codes_t.data<uint8_t>(),
                      Fp8Format::e5m2, scale.data<float>(), want.outputs(), kernels::compute_stream());
    const kernels::AttentionDyCodes dy{.codes = got.codes.data<uint8_t>(), .codes_t = got.codes_t.data<uint8_t>(),
                                       .scale = scale.data<float>(), .stats = got.outputs()};
    Scratch scratch(p);
    kernels::lab::attention_backward_wgmma_dy(keys64, dy, scratch.dq_accum.data<float>(), scratch.delta.data<float>(),
                                              p.tdout.data<bf16>(), p.tqkv.data<bf16>(), p.out.data<bf16>(),
                                              p.lse.data<float>(), B, T, NH, kernels::compute_stream());
    CHECK(code_mismatches_but_zero_sign(download_bytes(got.codes), download_bytes(want.codes)) == 0);
    CHECK(code_mismatches_but_zero_sign(download_bytes(got.codes_t), download_bytes(want.codes_t)) == 0);
    const std::vector<float> gs = download(got.stats), ws = download(want.stats);
    check_same_kept_stats(gs, ws, want.amax_index);
    int64_t colsum_bad = 0;
    for (int c = 0; c < C3; ++c) {
      double abs_sum = 0.0;
      for (int64_t r = 0; r < M; ++r) abs_sum += std::fabs(g[r * C3 + c]);
      colsum_bad += !(std::fabs(double(gs[c]) - ws[c]) <= 1e-5 * abs_sum + 1e-30);
    }
    CHECK(colsum_bad == 0);
  }
}

}  // namespace

TEST_CASE("lab attention wgmma backward variants", "[gpu][attention][lab]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  for (int T : {1, 77, 130, 333, 1024}) check_variants(2, T, 3);
  // A deep grid (at least 8 blocks per resident block slot): the blocks run in bands and groups of heads.
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  check_variants((32 * sms / 4 + 5 + 2) / 3, 256, 3);
}

TEST_CASE("lab attention wgmma backward dy codes", "[gpu][attention][lab][fp8]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  for (int T : {8, 80, 333, 1024}) check_dy_codes(2, T, 3);
}

// Run: build/tests/fp8t_gpu_tests "lab attention wgmma backward throughput" (kernels/lab/README.md).
TEST_CASE("lab attention wgmma backward throughput", "[.bench][attention][lab]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  constexpr int T = 1024, kIters = 10;
  for (auto [B, NH] : {std::pair{32, 12}, std::pair{16, 25}}) {
    const Problem p(B, T, NH);
    Tensor dqkv = Tensor::zeros(p.qkv_shape(), DType::bf16, kGpu);
    Scratch scratch(p);
    const double flops = 2.5 * 2.0 * B * NH * double(T) * T * kHs;  // the backward: 2.5 x the causal forward
    auto report = [&](const char* name, float ms) {
      std::printf("lab attention backward B=%d NH=%d T=%d HS=%d %-24s %.3f ms %.1f TFLOP/s\n", B, NH, T, kHs, name, ms,
                  flops / ms / 1e9);
    };
    report("product", time_ms([&] { cuda_ops::attention_backward(dqkv, p.tdout, p.tqkv, p.out, p.lse, NH); }, kIters));
    // As in training (qkv's gradient written, not added to: src/ops/attention.cpp); the variants all add.
    report("product, written",
           time_ms([&] { cuda_ops::attention_backward(dqkv, p.tdout, p.tqkv, p.out, p.lse, NH, false); }, kIters));
    // FP8 training's case: dK and dV (and dQ) leave as the qkv linear's E5M2 dy codes, row-major and transposed, with
    // their column sums (kernels/attention_dy_codes.cuh); the codes' buffers come from the caching allocator.
    if (cuda_ops::attention_writes_dy_codes(p.qkv_shape(), NH)) {
      const Tensor dy_scale = upload({1.0f}, {1}, DType::f32);
      const Fp8DyRequest request{.scale = dy_scale.data<float>(), .codes = true, .codes_t = true, .colsum = true};
      const cuda_ops::AttentionSaved forms{.qkv = &p.tqkv, .out = &p.out};
      report("product, dy codes", time_ms([&] {
               (void)cuda_ops::attention_backward_dy_codes(request, p.tdout, forms, p.lse, NH);
             }, kIters));
      // The same passes from the lab: the 64-key main pass (three blocks per SM) and the 128-key one with cp.async
      // loads (the product's until the forty-sixth session).
      const int64_t M = int64_t(B) * T;
      DyBuffers dyb(M, 3 * p.C);
      const kernels::AttentionDyCodes dy{.codes = dyb.codes.data<uint8_t>(), .codes_t = dyb.codes_t.data<uint8_t>(),
                                         .scale = dy_scale.data<float>(), .stats = dyb.outputs()};
      for (bool keys64 : {true, false})
        report(keys64 ? "64 keys, dy codes" : "128 cp.async, dy codes", time_ms([&] {
                 kernels::lab::attention_backward_wgmma_dy(keys64, dy, scratch.dq_accum.data<float>(),
                                                           scratch.delta.data<float>(), p.tdout.data<bf16>(),
                                                           p.tqkv.data<bf16>(), p.out.data<bf16>(),
                                                           p.lse.data<float>(), B, T, NH, kernels::compute_stream());
               }, kIters));
    }
    for (WgmmaBackwardVariant v : kernels::lab::kWgmmaBackwardVariants)
      report(kernels::lab::variant_name(v), time_ms([&] { lab_backward(v, p, dqkv, scratch); }, kIters));
  }
}
