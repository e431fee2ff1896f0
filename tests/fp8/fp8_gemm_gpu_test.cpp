// FP8 GEMMs on the GPU: fprop, dgrad and wgrad through cuBLASLt against a double GEMM over the same
// FP8 codes and scales (bf16 outputs within bf16 rounding, f32 outputs within 1e-3 in norm), and the
// argument checks (sizes not multiples of 16, E5M2 x E5M2, unaligned scales, block scales).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "fp8/quantize.h"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

Tensor upload_codes(const std::vector<uint8_t>& codes, Shape shape, Fp8Format f) {
  Tensor h = Tensor::empty(std::move(shape), fp8_dtype(f));
  std::memcpy(h.raw(), codes.data(), codes.size());
  return h.to(kGpu);
}

// Host-quantized random matrix: codes, their decoded values (unscaled) and scale_inv.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<double> values;
  float scale_inv;
};

Quantized quantize_random(int64_t n, float stdev, Fp8Format f) {
  const auto x = randn(static_cast<size_t>(n), stdev);
  const float scale = fp8_max(f) / fp8_amax(x.data(), n);
  Quantized q{std::vector<uint8_t>(static_cast<size_t>(n)), std::vector<double>(static_cast<size_t>(n)), 1.0f / scale};
  fp8_quantize(x.data(), n, scale, f, q.codes.data());
  for (int64_t i = 0; i < n; ++i) q.values[i] = fp8_to_float(q.codes[i], f);
  return q;
}

// bf16 outputs: cuBLASLt rounds the scaled product and adds the bias / C (beta = 1) around a bf16
// rounding, so an element may differ from the exact value by half a bf16 ulp of each of the product,
// the addend and the result (an ulp is at most 2^-7 relative), plus the tensor cores' FP8
// accumulation error (~1e-4). Counted per element with a 2x margin; the f32-output runs of the same
// GEMMs carry the 1e-3 norm check.
int64_t beyond_bf16_rounding(const std::vector<float>& out, const std::vector<double>& ref,
                             const std::vector<double>& addend) {
  std::vector<float> ref_f(ref.begin(), ref.end());
  const double floor = 1e-4 * rms(ref_f);
  int64_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double product = ref[i] - addend[i];
    const double bound = std::ldexp(std::fabs(product) + std::fabs(addend[i]) + std::fabs(ref[i]), -7) + floor;
    if (!(std::fabs(double(out[i]) - ref[i]) <= bound)) ++bad;
  }
  return bad;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct Dims { int M, K, N; };
const Dims kGemmShapes[] = {{16, 16, 16}, {128, 768, 2304}, {1024, 256, 768}, {48, 1600, 80}};

}  // namespace

TEST_CASE("fp8 gemm: fprop dgrad wgrad match a double GEMM on the same codes and scales", "[gpu][fp8]") {
  const cudaStream_t s = kernels::compute_stream();
  for (auto [M, K, N] : kGemmShapes) {
    INFO("M=" << M << " K=" << K << " N=" << N);
    const Quantized x = quantize_random(int64_t{M} * K, 1.0f, Fp8Format::e4m3);
    const Quantized w = quantize_random(int64_t{N} * K, 0.02f, Fp8Format::e4m3);
    const Quantized dy = quantize_random(int64_t{M} * N, 1e-4f, Fp8Format::e5m2);
    const auto bias = round_bf16(randn(N, 0.5f));
    Tensor sx = device_floats({x.scale_inv}), sw = device_floats({w.scale_inv}), sdy = device_floats({dy.scale_inv});

    {  // fprop: out (M, N) = x (M, K) @ w (N, K)^T * sx * sw + bias, bf16 out, fast accumulation
      std::vector<double> ref(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double acc = 0;
          for (int k = 0; k < K; ++k) acc += x.values[size_t(m) * K + k] * w.values[size_t(n) * K + k];
          ref[size_t(m) * N + n] = acc * x.scale_inv * w.scale_inv + bias[n];
        }
      Tensor tx = upload_codes(x.codes, {M, K}, Fp8Format::e4m3), tw = upload_codes(w.codes, {N, K}, Fp8Format::e4m3);
      Tensor tb = upload(bias, {N}, DType::bf16), out = poisoned({M, N}, DType::bf16);
      kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(), {tx.raw(), DType::e4m3, sx.data<float>()},
                                  {tw.raw(), DType::e4m3, sw.data<float>()}, tb.data<__nv_bfloat16>(), M, K, N, s);
      const auto got = download(out);
      std::vector<double> bias_rows(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) bias_rows[i] = bias[i % N];
      CHECK(rel_err(got, to_float(ref)) < 5e-3);
      // Fast accumulation (fprop only, as in Transformer Engine) keeps partial sums at reduced
      // precision between promotions: on the H200 about 1 element in 25,000 lands just beyond the
      // bf16-rounding bound at K 768 (12 of 294,912 seen), more at K 1600 (4 of 3,840 seen once). Allow 1 in
      // 200: a wrong GEMM misses on nearly every element, and the norm bound above holds.
      CHECK(beyond_bf16_rounding(got, ref, bias_rows) <= static_cast<int64_t>(ref.size() / 200));
      // The same GEMM (same layout) with an f32 output: the 1e-3 norm check.
      std::vector<double> ref_nb(ref);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) ref_nb[size_t(m) * N + n] -= bias[n];
      Tensor out32 = poisoned({M, N}, DType::f32);
      kernels::matmul_cublaslt(out32.raw(), DType::f32, {tw.raw(), DType::e4m3, sw.data<float>()}, true,
                               {tx.raw(), DType::e4m3, sx.data<float>()}, false, N, M, K, 1.0f, 0.0f,
                               kernels::MatmulEpilogue::none, nullptr, nullptr, s);
      CHECK(rel_err(download(out32), to_float(ref_nb)) < 1e-3);
    }
    {  // dgrad: dx (M, K) += dy (M, N) @ w (N, K), from w^T (K, N); bf16 out
      const auto dx0 = round_bf16(randn(size_t(M) * K, 1e-4f));
      std::vector<double> ref(size_t(M) * K);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < K; ++k) {
          double acc = 0;
          for (int n = 0; n < N; ++n) acc += dy.values[size_t(m) * N + n] * w.values[size_t(n) * K + k];
          ref[size_t(m) * K + k] = dx0[size_t(m) * K + k] + acc * dy.scale_inv * w.scale_inv;
        }
      Tensor tdy = upload_codes(dy.codes, {M, N}, Fp8Format::e5m2);
      Tensor twt = upload_codes(transpose_codes(w.codes, N, K), {K, N}, Fp8Format::e4m3);
      Tensor dx = upload(dx0, {M, K}, DType::bf16);
      kernels::matmul_fp8_backward_input(dx.data<__nv_bfloat16>(), {tdy.raw(), DType::e5m2, sdy.data<float>()},
                                         {twt.raw(), DType::e4m3, sw.data<float>()}, M, K, N, true, s);
      const auto got = download(dx);
      CHECK(rel_err(got, to_float(ref)) < 5e-3);
      // The f32 sum in a different order than the double reference can tip a value lying within
      // ~1e-7 of a bf16 rounding boundary to the other side (seen: 1 of 262,144 on the H200).
      // Allow 1 in 10,000; the norm bound above holds.
      CHECK(beyond_bf16_rounding(got, ref, std::vector<double>(dx0.begin(), dx0.end())) <=
            static_cast<int64_t>(ref.size() / 10000));
      // The same GEMM with an f32 output accumulated onto dx0: the 1e-3 norm check.
      Tensor dx32 = upload(dx0, {M, K}, DType::f32);
      kernels::matmul_cublaslt(dx32.raw(), DType::f32, {twt.raw(), DType::e4m3, sw.data<float>()}, true,
                               {tdy.raw(), DType::e5m2, sdy.data<float>()}, false, K, M, N, 1.0f, 1.0f,
                               kernels::MatmulEpilogue::none, nullptr, nullptr, s);
      CHECK(rel_err(download(dx32), to_float(ref)) < 1e-3);
      // With fast accumulation (precision.fp8.fast_accum: dgrad): the forward's bounds.
      Tensor dxf = upload(dx0, {M, K}, DType::bf16);
      kernels::matmul_fp8_backward_input(dxf.data<__nv_bfloat16>(), {tdy.raw(), DType::e5m2, sdy.data<float>()},
                                         {twt.raw(), DType::e4m3, sw.data<float>()}, M, K, N, true, s, true);
      const auto gotf = download(dxf);
      CHECK(rel_err(gotf, to_float(ref)) < 5e-3);
      CHECK(beyond_bf16_rounding(gotf, ref, std::vector<double>(dx0.begin(), dx0.end())) <=
            static_cast<int64_t>(ref.size() / 200));
    }
    {  // wgrad: dw (N, K) += dy^T (N, M) @ x (M, K), from dy^T and x^T (K, M); f32 out, beta = 1
      const auto dw0 = randn(size_t(N) * K, 1e-4f);
      std::vector<float> ref(size_t(N) * K);
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {
          double acc = 0;
          for (int m = 0; m < M; ++m) acc += dy.values[size_t(m) * N + n] * x.values[size_t(m) * K + k];
          ref[size_t(n) * K + k] = static_cast<float>(dw0[size_t(n) * K + k] + acc * dy.scale_inv * x.scale_inv);
        }
      Tensor tdyt = upload_codes(transpose_codes(dy.codes, M, N), {N, M}, Fp8Format::e5m2);
      Tensor txt = upload_codes(transpose_codes(x.codes, M, K), {K, M}, Fp8Format::e4m3);
      Tensor dw = upload(dw0, {N, K}, DType::f32);
      kernels::matmul_fp8_backward_weight(dw.data<float>(), DType::f32, {tdyt.raw(), DType::e5m2, sdy.data<float>()},
                                          {txt.raw(), DType::e4m3, sx.data<float>()}, M, K, N, true, s);
      CHECK(rel_err(download(dw), ref) < 1e-3);
      // With fast accumulation (precision.fp8.fast_accum: wgrad), K = M here: the forward's norm bound.
      Tensor dwf = upload(dw0, {N, K}, DType::f32);
      kernels::matmul_fp8_backward_weight(dwf.data<float>(), DType::f32, {tdyt.raw(), DType::e5m2, sdy.data<float>()},
                                          {txt.raw(), DType::e4m3, sx.data<float>()}, M, K, N, true, s, true);
      CHECK(rel_err(download(dwf), ref) < 5e-3);
    }
  }
}

TEST_CASE("fp8 gemm: rejects sizes that are not multiples of 16 - E5M2 x E5M2 - unaligned scales - block scales",
          "[gpu][fp8]") {
  Tensor a = Tensor::zeros({32, 32}, DType::e4m3, kGpu), b = Tensor::zeros({32, 32}, DType::e5m2, kGpu);
  Tensor out = Tensor::zeros({32, 32}, DType::bf16, kGpu), one = device_floats({1.0f, 1.0f});
  const cudaStream_t s = kernels::compute_stream();
  CHECK_THROWS_WITH(kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(), {a.raw(), DType::e4m3, one.data<float>()},
                                                {a.raw(), DType::e4m3, one.data<float>()}, nullptr, 24, 32, 32, s),
                    Catch::Matchers::ContainsSubstring("multiple of 16"));
  CHECK_THROWS_WITH(kernels::matmul_fp8_backward_input(out.data<__nv_bfloat16>(),
                                                       {b.raw(), DType::e5m2, one.data<float>()},
                                                       {b.raw(), DType::e5m2, one.data<float>()}, 32, 32, 32, true, s),
                    Catch::Matchers::ContainsSubstring("E5M2 x E5M2"));
  // Seen on the H200 (cuBLASLt 13): scale pointers at a 4-byte offset make cublasLtMatmul return
  // "not supported"; the wrapper says why instead.
  CHECK_THROWS_WITH(kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(),
                                                {a.raw(), DType::e4m3, one.data<float>() + 1},
                                                {a.raw(), DType::e4m3, one.data<float>()}, nullptr, 32, 32, 32, s),
                    Catch::Matchers::ContainsSubstring("16-byte aligned"));
  // Scale layouts other than per-tensor are part of the operand (and of the plan key) but not wired yet.
  CHECK_THROWS_WITH(
      kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(),
                                  {a.raw(), DType::e4m3, one.data<float>(), ScaleLayout::block_1x128},
                                  {a.raw(), DType::e4m3, one.data<float>()}, nullptr, 32, 32, 32, s),
      Catch::Matchers::ContainsSubstring("not wired to cuBLASLt yet"));
}
