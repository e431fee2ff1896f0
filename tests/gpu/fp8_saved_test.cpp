// FP8 storage of saved activations on the GPU: the dequantize kernel bit-exact against the host codec
// on every code, fp8_save/fp8_restore against the host path, and GELU/attention with FP8 storage
// equal to the plain ops on the restored input.
#include <catch2/catch_test_macros.hpp>
#include <cmath>

#include "fp8/quantize.h"
#include "fp8/saved.h"
#include "gpu_test_util.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("fp8 dequantize kernel matches the host codec on every code", "[gpu][fp8][saved]") {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (int64_t n : {int64_t{256}, int64_t{255}, int64_t{8 * 1000 + 3}}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) codes[size_t(i)] = static_cast<uint8_t>((i * 37 + 11) % 256);
      const float scale_inv = 0.0371f;
      Tensor tc = Tensor::empty({n}, DType::e4m3, kGpu, MemCategory::activations);
      CUDA_CHECK(cudaMemcpy(tc.raw(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
      Tensor ts = upload(std::vector<float>{scale_inv}, {1}, DType::f32);
      Tensor out = poisoned({n}, DType::bf16);
      kernels::fp8_dequantize(tc.data<uint8_t>(), f, n, ts.data<float>(), out.data<__nv_bfloat16>(),
                              kernels::compute_stream());
      std::vector<float> ref(static_cast<size_t>(n));
      fp8_dequantize(codes.data(), n, scale_inv, f, ref.data());
      const auto got = download(out);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float r = bf16_to_float(float_to_bf16(ref[size_t(i)]));
        const bool same = std::isnan(r) ? std::isnan(got[size_t(i)]) : got[size_t(i)] == r;
        bad += same ? 0 : 1;
      }
      INFO("format " << (f == Fp8Format::e4m3 ? "e4m3" : "e5m2") << " n " << n);
      CHECK(bad == 0);
    }
}

TEST_CASE("fp8_save on the GPU matches the host path", "[gpu][fp8][saved]") {
  const int64_t R = 77, C = 96;
  const auto x = round_bf16(randn(R * C, 3.0f));
  Tensor tx = upload(x, {R, C}, DType::bf16);
  Tensor rt;
  const Fp8Saved g = fp8_save(tx, &rt);
  Tensor hx = Tensor::from_vector(x, {R, C});
  Tensor hrt;
  const Fp8Saved h = fp8_save(hx, &hrt);
  CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor gcodes = g.codes.to(Device::cpu()), gscales = g.scales.to(Device::cpu());
  for (int k = 0; k < 3; ++k) CHECK(gscales.data<float>()[k] == h.scales.data<float>()[k]);
  int64_t bad = 0;
  for (int64_t i = 0; i < R * C; ++i) bad += gcodes.data<uint8_t>()[i] != h.codes.data<uint8_t>()[i];
  CHECK(bad == 0);
  const auto got = download(rt);
  for (int64_t i = 0; i < R * C; ++i) REQUIRE(got[size_t(i)] == bf16_to_float(float_to_bf16(hrt.data<float>()[i])));
}

TEST_CASE("GELU and attention with FP8 storage on the GPU equal the plain ops on the restored input",
          "[gpu][fp8][saved]") {
  auto run = [](auto op, const Tensor& x, const Tensor& dy) {
    Var vx = make_var(x, true);
    Tape tape;
    Var y;
    {
      TapeScope s(&tape);
      y = op(vx);
    }
    grad_of(y).copy_from(dy);
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    return std::make_pair(download(y->value), download(vx->grad));
  };
  {
    const int64_t n = 4 * 33 * 64;
    Tensor x = upload(round_bf16(randn(n, 2.0f)), {4, 33, 64}, DType::bf16);
    Tensor dy = upload(round_bf16(randn(n)), {4, 33, 64}, DType::bf16);
    Tensor rt;
    fp8_save(x, &rt);
    const auto stored = run([](const Var& v) { return gelu(v, true); }, x, dy);
    const auto plain = run([](const Var& v) { return gelu(v, false); }, rt, dy);
    CHECK(stored.first == plain.first);
    CHECK(stored.second == plain.second);
  }
  {
    const int B = 2, T = 77, C = 128, NH = 2;
    Tensor qkv = upload(round_bf16(randn(int64_t{B} * T * 3 * C)), {B, T, 3 * C}, DType::bf16);
    Tensor dy = upload(round_bf16(randn(int64_t{B} * T * C)), {B, T, C}, DType::bf16);
    Tensor rt;
    fp8_save(qkv, &rt);
    const auto stored = run([&](const Var& v) { return attention(v, NH, true); }, qkv, dy);
    const auto plain = run([&](const Var& v) { return attention(v, NH, false); }, rt, dy);
    CHECK(stored.first == plain.first);
    CHECK(rel_err(stored.second, plain.second) < 1e-3);  // dQ sums with atomics: order may differ
  }
}
