// The lab's variants of the wgmma attention forward (kernels/lab/attention_wgmma_forward_variants.cuh) against the
// product's (for bf16 qkv the kernel fed by a loading warpgroup, for E4M3 codes the cp.async one): bit for bit (the same MMAs and
// softmax in the same order), and the CPU reference; a hidden [.bench] case times them.
#include <catch2/catch_test_macros.hpp>

#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/attention_wgmma.cuh"
#include "kernels/lab/attention_wgmma_forward_variants.cuh"
#include "kernels/stream.cuh"
#include "ops/attention_cuda.h"
#include "fp8/saved.h"
#include "util/attention_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

using bf16 = __nv_bfloat16;
constexpr int kHs = 64;
using Variant = void (*)(bf16*, float*, const bf16*, int, int, int, cudaStream_t);
constexpr std::pair<const char*, Variant> kVariants[] = {
    {"cp.async", kernels::lab::attention_forward_wgmma_cp_async},
    {"pingpong", kernels::lab::attention_forward_wgmma_pingpong},
    {"narrow", kernels::lab::attention_forward_wgmma_narrow},
};

// Elements whose bits differ (a NaN left from the poison counts, as its bits are not the product's).
int64_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

void check_variant(const char* name, Variant variant, int B, int T, int NH) {
  INFO(name << " B=" << B << " T=" << T << " NH=" << NH);
  const auto r = attention_forward_pair(B, T, NH, [&](bf16* out, float* lse, const bf16* qkv) {
    variant(out, lse, qkv, B, T, NH, kernels::compute_stream());
  });
  CHECK(bits_differ(r.got, r.want) == 0);
  CHECK(bits_differ(r.got_lse, r.want_lse) == 0);
  CHECK(rel_err(r.got, r.ref) < 1e-2);
  CHECK(rel_err(r.got_lse, r.ref_lse) < 1e-4);
}

// qkv as fp8_all keeps it (E4M3 codes, a scale per row): the lab's loading warpgroup that dequantizes against the
// product's cp.async kernel, and the CPU reference on the dequantized qkv.
void check_codes_ws(int B, int T, int NH) {
  INFO("codes_ws B=" << B << " T=" << T << " NH=" << NH);
  const int C = NH * kHs;
  const Tensor qkv = upload(round_bf16(randn(int64_t(B) * T * 3 * C)), {B, T, 3 * C}, DType::bf16);
  const QuantizedTensor saved = fp8_save(qkv, nullptr);
  REQUIRE(saved.layout == ScaleLayout::per_row);
  Tensor out = poisoned({B, T, C}, DType::bf16), lse = poisoned({B, NH, T}, DType::f32);
  Tensor pout = poisoned({B, T, C}, DType::bf16), plse = poisoned({B, NH, T}, DType::f32);
  kernels::AttentionQkv codes;
  codes.e4m3 = saved.codes.data<uint8_t>();
  codes.row_scale_inv = saved.scale_inv.data<float>();
  kernels::lab::attention_forward_wgmma_codes_ws(out.data<bf16>(), lse.data<float>(), codes, B, T, NH,
                                                 kernels::compute_stream());
  cuda_ops::attention_forward(pout, plse, saved, NH);
  const auto got = download(out), got_lse = download(lse);
  CHECK(bits_differ(got, download(pout)) == 0);
  CHECK(bits_differ(got_lse, download(plse)) == 0);
  const auto restored = download(fp8_restore(saved, MemCategory::workspace));
  std::vector<float> ref(got.size()), ref_lse(got_lse.size());
  cpu::attention_forward(ref.data(), ref_lse.data(), restored.data(), B, T, C, NH);
  CHECK(rel_err(got, ref) < 1e-2);
  CHECK(rel_err(got_lse, ref_lse) < 1e-4);
}

}  // namespace

TEST_CASE("lab attention wgmma forward variants", "[gpu][attention][lab]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  for (auto [name, variant] : kVariants) {
    for (int T : {1, 63, 64, 65, 77, 128, 130, 191, 333, 1024}) check_variant(name, variant, 2, T, 3);
    check_variant(name, variant, 4, 1024, 25);
    check_variant(name, variant, 1, 4096, 2);  // more key tiles than stages, many times over
  }
  for (int T : {1, 63, 64, 65, 77, 128, 130, 191, 333, 1024}) check_codes_ws(2, T, 3);
  check_codes_ws(4, 1024, 25);
  check_codes_ws(1, 4096, 2);
}

// Run: build/tests/fp8t_gpu_tests "lab attention wgmma forward variants throughput" (kernels/lab/README.md).
TEST_CASE("lab attention wgmma forward variants throughput", "[.bench][attention][lab]") {
  if (!kernels::attention_wgmma_available()) SKIP("no sm_90a build on a Hopper GPU");
  constexpr int T = 1024, kIters = 20;
  for (auto [B, NH] : {std::pair{32, 12}, std::pair{16, 25}}) {
    const int C = NH * kHs;
    const Tensor tqkv = upload(round_bf16(randn(int64_t(B) * T * 3 * C)), {B, T, 3 * C}, DType::bf16);
    Tensor out = Tensor::zeros({B, T, C}, DType::bf16, kGpu), lse = Tensor::zeros({B, NH, T}, DType::f32, kGpu);
    const double flops = 2.0 * B * NH * double(T) * T * kHs;  // the causal forward: half of 4 B NH T^2 HS
    auto report = [&](const char* name, float ms) {
      std::printf("lab attention forward B=%d NH=%d T=%d HS=%d %-12s %.3f ms %.1f TFLOP/s\n", B, NH, T, kHs, name, ms,
                  flops / ms / 1e9);
    };
    const QuantizedTensor saved = fp8_save(tqkv, nullptr);
    kernels::AttentionQkv codes;
    codes.e4m3 = saved.codes.data<uint8_t>();
    codes.row_scale_inv = saved.scale_inv.data<float>();
    for (int round = 0; round < 2; ++round) {  // interleaved, twice
      report("product", time_ms([&] { cuda_ops::attention_forward(out, lse, tqkv, NH); }, kIters));
      for (auto [name, variant] : kVariants)
        report(name, time_ms([&] { variant(out.data<bf16>(), lse.data<float>(), tqkv.data<bf16>(), B, T, NH,
                                           kernels::compute_stream()); }, kIters));
      report("codes", time_ms([&] { cuda_ops::attention_forward(out, lse, saved, NH); }, kIters));
      report("codes_ws", time_ms([&] { kernels::lab::attention_forward_wgmma_codes_ws(out.data<bf16>(),
                                           lse.data<float>(), codes, B, T, NH, kernels::compute_stream()); }, kIters));
    }
  }
}
