// Flash attention forward/backward against the CPU reference; a hidden [.bench] case reports TFLOP/s.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

#include "util/gpu_test_util.h"
#include "kernels/attention.cuh"
#include "kernels/attention_wgmma.cuh"
#include "fp8/saved.h"
#include "kernels/stream.cuh"
#include "ops/attention_cuda.h"
#include "ops/cpu/attention.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

// Row by row (one head of one token, per part): a key block, query step or ragged tail that the kernel skipped
// shows here even where the norms over the whole tensor average it away. Bound per row: 10% of its own
// gradient, 5% of the part's typical row (rows whose gradient nearly cancels), 2^-8 of the stored value
// (bf16 rounding of dqkv0 + gradient, once for dk and dv, twice for dq) and `floor` per element (for parts that
// are zero up to rounding, as dq and dk at T = 1, written over the buffer rather than added to a stored value).
void check_rows(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& base,
                int64_t BT, int C, int HS, double floor) {
  const int NH = C / HS;
  auto norm = [&](int64_t i0, auto f) {
    double s = 0.0;
    for (int64_t i = i0; i < i0 + HS; ++i) s += f(i) * f(i);
    return std::sqrt(s);
  };
  for (int part = 0; part < 3; ++part) {
    double sum_sq = 0.0;
    for (int64_t bt = 0; bt < BT; ++bt)
      for (int c = 0; c < C; ++c) {
        const int64_t i = bt * 3 * C + int64_t(part) * C + c;
        sum_sq += double(want[i] - base[i]) * (want[i] - base[i]);
      }
    const double typical = std::sqrt(sum_sq / (double(BT) * NH));
    int64_t bad = 0, worst_row = -1;
    double worst = 0.0;
    for (int64_t bt = 0; bt < BT; ++bt)
      for (int h = 0; h < NH; ++h) {
        const int64_t i0 = bt * 3 * C + int64_t(part) * C + int64_t(h) * HS;
        const double err = norm(i0, [&](int64_t i) { return double(got[i]) - want[i]; });
        const double grad = norm(i0, [&](int64_t i) { return double(want[i]) - base[i]; });
        const double stored = norm(i0, [&](int64_t i) { return double(want[i]); });
        const double ratio = err / (0.1 * grad + 0.05 * typical + std::ldexp(stored, -8) + floor * std::sqrt(HS));
        bad += !(ratio <= 1.0);  // NaN counts as bad
        if (ratio > worst) {
          worst = ratio;
          worst_row = bt * NH + h;
        }
      }
    INFO("part " << part << ": " << bad << " rows over the bound; worst (b*T + t)*NH + h = " << worst_row << " at "
                 << worst << " of its bound");
    CHECK(bad == 0);
  }
}

// Where O reaches the backward: as the forward's bf16 output, or as the transposed E4M3 codes that the projection
// keeps of it (fp8_linear's serve_input), one scale.
enum class OutForm { bf16, fp8_codes_t };

// The forward's output rout (host, (M, C)) cast per tensor to E4M3 with scale 448 / amax, transposed to (C, M):
// on the device as the backward takes it, and on the host dequantized in f32 (*deq, (M, C)) as the CPU reads it.
QuantizedTensor out_codes_t(const std::vector<float>& rout, int64_t M, int C, std::vector<float>* deq) {
  float amax = 0.0f;
  for (float v : rout) amax = std::max(amax, std::fabs(v));
  const float scale = 448.0f / amax, scale_inv = 1.0f / scale;
  Tensor codes_t = Tensor::empty({C, M}, DType::e4m3);
  deq->assign(rout.size(), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int c = 0; c < C; ++c) {
      const uint8_t code = float_to_fp8(rout[m * C + c] * scale, Fp8Format::e4m3);
      codes_t.data<uint8_t>()[int64_t(c) * M + m] = code;
      (*deq)[m * C + c] = fp8_to_float(code, Fp8Format::e4m3) * scale_inv;
    }
  QuantizedTensor q;
  q.codes_t = codes_t.to(kGpu);
  q.scale_inv = upload({scale_inv}, {1}, DType::f32);
  q.layout = ScaleLayout::per_tensor;
  q.shape = {M, C};
  return q;
}

// accumulate: the backward adds into a random dqkv; otherwise it writes over a NaN-poisoned one.
void check_attention(int B, int T, int NH, int HS, const kernels::AttentionKernels& kernels = {},
                     OutForm form = OutForm::bf16, bool accumulate = true) {
  const int C = NH * HS;
  const int64_t n_qkv = int64_t(B) * T * 3 * C, n_out = int64_t(B) * T * C;
  const auto qkv = round_bf16(randn(n_qkv, 1.0f));
  Tensor tqkv = upload(qkv, {B, T, 3 * C}, DType::bf16);
  Tensor out = poisoned({B, T, C}, DType::bf16), lse = poisoned({B, NH, T}, DType::f32);
  cuda_ops::attention_forward(out, lse, tqkv, NH, kernels);
  std::vector<float> rout(n_out), rlse(int64_t(B) * NH * T);
  cpu::attention_forward(rout.data(), rlse.data(), qkv.data(), B, T, C, NH);
  INFO("B=" << B << " T=" << T << " NH=" << NH << " HS=" << HS);
  CHECK(rel_err(download(out), rout) < 1e-2);
  CHECK(rel_err(download(lse), rlse) < 1e-3);

  const auto dout = round_bf16(randn(n_out));
  // With O as codes, both sides read the same dequantized O: the reference takes it in place of its own output.
  std::vector<float> rout_read = rout;
  QuantizedTensor out_q;
  if (form == OutForm::fp8_codes_t) out_q = out_codes_t(rout, int64_t(B) * T, C, &rout_read);
  std::vector<float> g(n_qkv, 0.0f);
  cpu::attention_backward(g.data(), dout.data(), qkv.data(), rout_read.data(), rlse.data(), B, T, C, NH);
  const double floor = 1e-3 * rms(g);  // the per-element floor of check_rows
  INFO((accumulate ? "accumulating" : "writing over NaN"));
  auto dqkv0 = accumulate ? round_bf16(randn(n_qkv, float(rms(g)))) : std::vector<float>(n_qkv, 0.0f);
  Tensor dqkv = accumulate ? upload(dqkv0, {B, T, 3 * C}, DType::bf16) : poisoned({B, T, 3 * C}, DType::bf16);
  const Tensor tdout = upload(dout, {B, T, C}, DType::bf16);
  if (form == OutForm::fp8_codes_t)
    cuda_ops::attention_backward(dqkv, tdout, tqkv, out_q, lse, NH, kernels, accumulate);
  else
    cuda_ops::attention_backward(dqkv, tdout, tqkv, out, lse, NH, kernels, accumulate);
  for (int64_t i = 0; i < n_qkv; ++i) g[i] += dqkv0[i];
  const auto got = download(dqkv);
  CHECK(rel_err(got, g) < 2e-2);
  // Each of dq, dk, dv separately (dq comes through a different path than dk, dv).
  for (int part = 0; part < 3; ++part) {
    std::vector<float> a, r;
    for (int64_t bt = 0; bt < int64_t(B) * T; ++bt)
      for (int c = 0; c < C; ++c) {
        const int64_t i = bt * 3 * C + int64_t(part) * C + c;
        a.push_back(got[i] - dqkv0[i]);
        r.push_back(g[i] - dqkv0[i]);
      }
    INFO("part " << part);
    // T = 1: the softmax is exactly 1, so dS = P (dP - delta) = dO.V - dO.O = 0: dq and dk are zero up to
    // rounding and only an absolute bound means anything (a relative one failed by chance for each).
    double diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) diff += (double(a[i]) - r[i]) * (double(a[i]) - r[i]);
    const double diff_rms = std::sqrt(diff / double(std::max<size_t>(1, a.size())));
    CHECK((rel_err(a, r) < 4e-2 || (T == 1 && part < 2 && diff_rms < 1e-3 * rms(g))));
  }
  check_rows(got, g, dqkv0, int64_t(B) * T, C, HS, floor);
}

}  // namespace

TEST_CASE("attention head size 64", "[gpu][attention]") {
#ifdef FP8T_CUDA_SM90A
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major == 9 && minor == 0) REQUIRE(kernels::attention_wgmma_available());  // so the cases below test it
#endif
  for (int T : {1, 77, 130, 256, 333, 1024}) check_attention(2, T, 3, 64);
}

// The default HS 64 kernels on a Hopper are the wgmma ones; the mma.sync ones (every other GPU) are checked too.
TEST_CASE("attention head size 64 on the mma.sync kernels", "[gpu][attention]") {
  INFO("wgmma kernels available: " << kernels::attention_wgmma_available());
  const kernels::AttentionKernels mma_sync{.wgmma = false};
  for (int T : {1, 77, 130, 256, 333, 1024}) check_attention(2, T, 3, 64, mma_sync);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  check_attention((32 * sms / 4 + 5 + 2) / 3, 256, 3, 64, mma_sync);
}

// With no gradient yet the op has the kernels write dqkv (no zero fill): every element, whatever it held.
TEST_CASE("attention backward writes dqkv over NaN when not accumulating", "[gpu][attention]") {
  const kernels::AttentionKernels mma_sync{.wgmma = false};
  for (int T : {1, 77, 256, 1024}) {
    check_attention(2, T, 3, 64, {}, OutForm::bf16, false);
    check_attention(2, T, 3, 64, mma_sync, OutForm::bf16, false);
    check_attention(2, T, 2, 128, {}, OutForm::bf16, false);
  }
  check_attention(3, 80, 3, 64, {}, OutForm::fp8_codes_t, false);
  check_attention(3, 80, 3, 64, mma_sync, OutForm::fp8_codes_t, false);
}

// The dQ scratch as the caching allocator may hand it over: NaN, then what the previous backward left there (its
// sums). Every main pass adds dQ into it, so a zeroing missed shows as NaN or as dQ counted twice.
TEST_CASE("attention backward over a dirty dQ scratch", "[gpu][attention]") {
  for (int T : {333, 1024}) {
    const int B = 2, NH = 3, HS = 64, C = NH * HS;
    const int64_t n_qkv = int64_t(B) * T * 3 * C, n_out = int64_t(B) * T * C;
    const auto qkv = round_bf16(randn(n_qkv, 1.0f)), dout = round_bf16(randn(n_out));
    const Tensor tqkv = upload(qkv, {B, T, 3 * C}, DType::bf16), tdout = upload(dout, {B, T, C}, DType::bf16);
    Tensor out = poisoned({B, T, C}, DType::bf16), lse = poisoned({B, NH, T}, DType::f32);
    cuda_ops::attention_forward(out, lse, tqkv, NH);
    std::vector<float> rout(n_out), rlse(int64_t(B) * NH * T), g(n_qkv, 0.0f);
    cpu::attention_forward(rout.data(), rlse.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(g.data(), dout.data(), qkv.data(), rout.data(), rlse.data(), B, T, C, NH);
    Tensor dq_accum = poisoned({kernels::attention_dq_scratch_floats(B, T, NH, HS)}, DType::f32);
    Tensor delta = poisoned({B, NH, T}, DType::f32);
    for (int run = 0; run < 2; ++run) {
      INFO("T=" << T << " run " << run << " (wgmma kernels: " << kernels::attention_wgmma_available() << ")");
      Tensor dqkv = poisoned({B, T, 3 * C}, DType::bf16);
      using bf16 = __nv_bfloat16;
      kernels::attention_backward(dqkv.data<bf16>(), dq_accum.data<float>(), delta.data<float>(), tdout.data<bf16>(),
                                  kernels::AttentionQkv{.bf16 = tqkv.data<bf16>()},
                                  kernels::AttentionOut{.bf16 = out.data<bf16>()}, lse.data<float>(), B, T, NH, HS,
                                  kernels::compute_stream(), {}, false);
      check_rows(download(dqkv), g, std::vector<float>(n_qkv, 0.0f), int64_t(B) * T, C, HS, 1e-3 * rms(g));
    }
  }
}

TEST_CASE("attention head size 128", "[gpu][attention]") {
  for (int T : {1, 77, 130, 256, 333, 1024}) check_attention(2, T, 2, 128);
}

// delta = rowsum(dO * O) read from O's transposed E4M3 codes (the projection's, under fp8_all storage): B * T a
// multiple of 16 (the codes' rows are 16-byte aligned), T ragged against the 64-row tiles.
TEST_CASE("attention backward reads O from its transposed FP8 codes", "[gpu][attention][fp8]") {
  const kernels::AttentionKernels mma_sync{.wgmma = false};
  for (auto [B, T] : {std::pair{2, 8}, std::pair{3, 80}, std::pair{2, 1024}}) {
    check_attention(B, T, 3, 64, {}, OutForm::fp8_codes_t);
    check_attention(B, T, 3, 64, mma_sync, OutForm::fp8_codes_t);
    check_attention(B, T, 2, 128, {}, OutForm::fp8_codes_t);
  }
  // The codes must be per-tensor E4M3 of shape (C, B * T): anything else is refused, naming what it got.
  const int B = 2, T = 16, NH = 1, C = 64;
  Tensor qkv = upload(round_bf16(randn(int64_t(B) * T * 3 * C, 1.0f)), {B, T, 3 * C}, DType::bf16);
  Tensor out = poisoned({B, T, C}, DType::bf16), lse = poisoned({B, NH, T}, DType::f32);
  cuda_ops::attention_forward(out, lse, qkv, NH);
  Tensor dqkv = Tensor::zeros({B, T, 3 * C}, DType::bf16, kGpu);
  const Tensor dout = upload(randn(int64_t(B) * T * C), {B, T, C}, DType::bf16);
  QuantizedTensor wrong;
  wrong.codes_t = Tensor::zeros({B * T, C}, DType::e4m3, kGpu);  // not transposed
  wrong.scale_inv = upload({1.0f}, {1}, DType::f32);
  wrong.shape = {B * T, C};
  CHECK_THROWS_WITH(cuda_ops::attention_backward(dqkv, dout, qkv, wrong, lse, NH),
                    Catch::Matchers::ContainsSubstring("transposed to (64, 32)"));
}

namespace {

// fp8_all's saved qkv read by the kernels themselves must give what the bf16 kernels give on fp8_restore of it:
// the forward's out and lse bit for bit, the backward's dK and dV bit for bit (dQ is summed over key blocks by
// asynchronous adds in no fixed order, so a bf16 rounding may differ), in both backward forms of O, adding and writing over NaN.
void check_codes_match_restore(int B, int T, int NH) {
  const int HS = 64, C = NH * HS;
  const int64_t n_qkv = int64_t(B) * T * 3 * C, n_out = int64_t(B) * T * C;
  auto qkv = randn(n_qkv, 1.0f);
  for (int64_t r = 0; r < int64_t(B) * T; ++r)  // rows of very different sizes: each has its own scale
    for (int c = 0; c < 3 * C; ++c) qkv[r * 3 * C + c] *= std::ldexp(1.0f, int(r % 7) - 3);
  const Tensor tqkv = upload(round_bf16(qkv), {B, T, 3 * C}, DType::bf16);
  const QuantizedTensor saved = fp8_save(tqkv, nullptr);
  const Tensor restored = fp8_restore(saved, MemCategory::workspace);
  INFO("B=" << B << " T=" << T << " NH=" << NH);
  Tensor out_c = poisoned({B, T, C}, DType::bf16), lse_c = poisoned({B, NH, T}, DType::f32);
  Tensor out_b = poisoned({B, T, C}, DType::bf16), lse_b = poisoned({B, NH, T}, DType::f32);
  cuda_ops::attention_forward(out_c, lse_c, saved, NH);
  cuda_ops::attention_forward(out_b, lse_b, restored, NH);
  const auto out_host = download(out_b);
  CHECK(download(out_c) == out_host);  // NaN (a poisoned element left) fails ==
  CHECK(download(lse_c) == download(lse_b));

  const Tensor dout = upload(round_bf16(randn(n_out)), {B, T, C}, DType::bf16);
  std::vector<float> out_deq;
  const QuantizedTensor out_q = out_codes_t(out_host, int64_t(B) * T, C, &out_deq);
  for (const bool accumulate : {true, false})
    for (const bool o_codes : {false, true}) {
      if (o_codes && int64_t(B) * T % 16 != 0) continue;  // O's transposed codes need B * T a multiple of 16
      INFO((accumulate ? "accumulating" : "writing over NaN") << (o_codes ? ", O as codes" : ", O as bf16"));
      const auto dqkv0 = round_bf16(randn(n_qkv, 0.1f));
      Tensor g_c = accumulate ? upload(dqkv0, {B, T, 3 * C}, DType::bf16) : poisoned({B, T, 3 * C}, DType::bf16);
      Tensor g_b = accumulate ? upload(dqkv0, {B, T, 3 * C}, DType::bf16) : poisoned({B, T, 3 * C}, DType::bf16);
      if (o_codes) {
        cuda_ops::attention_backward(g_c, dout, saved, out_q, lse_c, NH, accumulate);
        cuda_ops::attention_backward(g_b, dout, restored, out_q, lse_b, NH, accumulate);
      } else {
        cuda_ops::attention_backward(g_c, dout, saved, out_c, lse_c, NH, accumulate);
        cuda_ops::attention_backward(g_b, dout, restored, out_b, lse_b, NH, accumulate);
      }
      const auto got = download(g_c), want = download(g_b);
      std::vector<float> dq_got, dq_want;
      int64_t kv_differ = 0, nonfinite = 0;
      for (int64_t r = 0; r < int64_t(B) * T; ++r)
        for (int c = 0; c < 3 * C; ++c) {
          const int64_t i = r * 3 * C + c;
          nonfinite += !std::isfinite(got[i]);
          if (c < C) {
            dq_got.push_back(got[i]);
            dq_want.push_back(want[i]);
          } else {
            kv_differ += !(got[i] == want[i]);
          }
        }
      CHECK(nonfinite == 0);
      CHECK(kv_differ == 0);
      CHECK(rel_err(dq_got, dq_want) < 1e-3);
    }
}

}  // namespace

TEST_CASE("attention reads fp8_all's saved qkv codes as fp8_restore gives them", "[gpu][attention][fp8][saved]") {
  Tensor probe = Tensor::empty({1, 1, 3 * 64}, DType::bf16, kGpu);
  if (!cuda_ops::attention_reads_codes(probe, 1)) SKIP("the codes path needs the warpgroup-MMA kernels (a Hopper)");
  for (auto [B, T, NH] : {std::tuple{2, 8, 3}, std::tuple{3, 80, 3}, std::tuple{2, 1024, 2}, std::tuple{1, 333, 5}})
    check_codes_match_restore(B, T, NH);
  // Head size 128 runs the mma.sync kernels, which take bf16 only; a per-tensor form is refused, naming it.
  const int B = 2, T = 16;
  Tensor x128 = upload(round_bf16(randn(int64_t(B) * T * 3 * 128)), {B, T, 3 * 128}, DType::bf16);
  CHECK_FALSE(cuda_ops::attention_reads_codes(x128, 1));
  Tensor out = poisoned({B, T, 128}, DType::bf16), lse = poisoned({B, 1, T}, DType::f32);
  CHECK_THROWS_WITH(cuda_ops::attention_forward(out, lse, fp8_save(x128, nullptr), 1),
                    Catch::Matchers::ContainsSubstring("needs the warpgroup-MMA kernels"));
  QuantizedTensor per_tensor = fp8_save(x128, nullptr);
  per_tensor.layout = ScaleLayout::per_tensor;
  CHECK_THROWS_WITH(cuda_ops::attention_forward(out, lse, per_tensor, 2),
                    Catch::Matchers::ContainsSubstring("scale_inv per row"));
}

// Deep grids (at least 8 blocks per resident block slot) run the backward's blocks in bands of key blocks and
// groups of heads. Sized for up to 4 resident blocks per SM: T = 256 (HS 64) and 385 (HS 128, ragged) give 4 key
// blocks, so the first band holds two; 3 B heads leave a partial last group (42 heads per group at HS 64, 14
// at HS 128) on 132 SMs.
TEST_CASE("attention backward over a deep grid", "[gpu][attention]") {
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int B = (32 * sms / 4 + 5 + 2) / 3;
  check_attention(B, 256, 3, 64);
  check_attention(B, 385, 3, 128);
}

TEST_CASE("attention at T = 4096", "[gpu][attention]") {
  check_attention(1, 4096, 1, 64);
  check_attention(1, 4096, 1, 128);
}

TEST_CASE("attention throughput", "[.bench][attention]") {
  // wgmma: the warpgroup-MMA kernels (Hopper only), else the mma.sync ones. The wgmma backward's variants kept
  // for comparison run in the lab's benchmark (kernels/lab/README.md).
  struct Case { int B, NH, T, HS; bool wgmma; };
  std::vector<Case> cases;
  for (auto [B, NH] : {std::pair{32, 12}, std::pair{16, 25}})
    for (bool wgmma : {true, false}) cases.push_back({B, NH, 1024, 64, wgmma});
  cases.push_back({8, 16, 4096, 128, false});
  for (auto [B, NH, T, HS, wgmma] : cases) {
    if (wgmma && !kernels::attention_wgmma_available()) continue;
    const kernels::AttentionKernels k{.wgmma = wgmma};
    const int C = NH * HS;
    const int64_t n_qkv = int64_t(B) * T * 3 * C, n_out = int64_t(B) * T * C;
    Tensor qkv = upload(randn(n_qkv), {B, T, 3 * C}, DType::bf16);
    Tensor dout = upload(randn(n_out), {B, T, C}, DType::bf16);
    Tensor out = Tensor::empty({B, T, C}, DType::bf16, kGpu), lse = Tensor::empty({B, NH, T}, DType::f32, kGpu);
    Tensor dqkv = Tensor::zeros({B, T, 3 * C}, DType::bf16, kGpu);
    constexpr int kIters = 10;
    const float fwd_ms = time_ms([&] { cuda_ops::attention_forward(out, lse, qkv, NH, k); }, kIters);
    const float bwd_ms = time_ms([&] { cuda_ops::attention_backward(dqkv, dout, qkv, out, lse, NH, k); }, kIters);
    const double flops = 2.0 * B * NH * double(T) * T * HS;  // causal: half of 4 B NH T^2 HS
    std::printf("attention B=%d NH=%d T=%d HS=%d %s: fwd %.3f ms %.1f TFLOP/s, bwd %.3f ms %.1f TFLOP/s\n", B, NH, T,
                HS, wgmma ? "wgmma" : "mma.sync", fwd_ms, flops / fwd_ms / 1e9, bwd_ms, 2.5 * flops / bwd_ms / 1e9);
  }
}
