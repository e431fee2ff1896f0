// The lab's pipelined wgmma attention forward (kernels/lab/) against the product's forward and the CPU reference; a
// hidden [.bench] case times both.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/attention_wgmma.cuh"
#include "kernels/lab/attention_wgmma_forward_pipelined.cuh"
#include "kernels/stream.cuh"
#include "ops/attention_cuda.h"
#include "util/attention_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

using bf16 = __nv_bfloat16;
constexpr int kHs = 64;

void check_pipelined(int B, int T, int NH) {
  INFO("B=" << B << " T=" << T << " NH=" << NH);
  const auto r = attention_forward_pair(B, T, NH, [&](bf16* out, float* lse, const bf16* qkv) {
    kernels::lab::attention_forward_wgmma_pipelined(out, lse, qkv, B, T, NH, kernels::compute_stream());
  });
  // The product rescales O before adding P V, the pipelined kernel after: f32 sums in another order, then one bf16
  // rounding, so at most a bf16 ulp or two apart; lse from the same maxima and sums (f32 order aside).
  int64_t bad = 0, first_bad = -1;
  for (size_t i = 0; i < r.got.size(); ++i) {
    const double diff = std::abs(double(r.got[i]) - r.want[i]);
    const bool ok = diff <= std::ldexp(std::max(std::abs(r.got[i]), std::abs(r.want[i])), -7) + 1e-4;  // NaN: not ok
    if (!ok && bad++ == 0) first_bad = static_cast<int64_t>(i);
  }
  INFO(bad << " outputs off the product's; the first at " << first_bad);
  CHECK(bad == 0);
  double lse_diff = 0.0;
  for (size_t i = 0; i < r.got_lse.size(); ++i)
    lse_diff = std::max(lse_diff, std::abs(double(r.got_lse[i]) - r.want_lse[i]));
  CHECK(lse_diff < 1e-4);  // NaN fails too
  CHECK(rel_err(r.got, r.ref) < 1e-2);
  CHECK(rel_err(r.got_lse, r.ref_lse) < 1e-4);
}

}  // namespace

TEST_CASE("lab attention wgmma forward, pipelined", "[gpu][attention][lab]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  for (int T : {1, 63, 64, 65, 77, 128, 130, 333, 1024}) check_pipelined(2, T, 3);
  check_pipelined(4, 1024, 25);
}

// Run: build/tests/fp8t_gpu_tests "lab attention wgmma forward throughput" (kernels/lab/README.md).
TEST_CASE("lab attention wgmma forward throughput", "[.bench][attention][lab]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  constexpr int T = 1024, kIters = 20;
  for (auto [B, NH] : {std::pair{32, 12}, std::pair{16, 25}}) {
    const int C = NH * kHs;
    const Tensor tqkv = upload(round_bf16(randn(int64_t(B) * T * 3 * C)), {B, T, 3 * C}, DType::bf16);
    Tensor out = Tensor::zeros({B, T, C}, DType::bf16, kGpu), lse = Tensor::zeros({B, NH, T}, DType::f32, kGpu);
    const double flops = 2.0 * B * NH * double(T) * T * kHs;  // the causal forward: half of 4 B NH T^2 HS
    auto report = [&](const char* name, float ms) {
      std::printf("lab attention forward B=%d NH=%d T=%d HS=%d %-10s %.3f ms %.1f TFLOP/s\n", B, NH, T, kHs, name, ms,
                  flops / ms / 1e9);
    };
    report("product", time_ms([&] { cuda_ops::attention_forward(out, lse, tqkv, NH); }, kIters));
    auto pipelined = [&] {
      kernels::lab::attention_forward_wgmma_pipelined(out.data<bf16>(), lse.data<float>(), tqkv.data<bf16>(), B, T, NH,
                                                      kernels::compute_stream());
    };
    report("pipelined", time_ms(pipelined, kIters));
  }
}
