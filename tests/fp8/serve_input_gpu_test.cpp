// One FP8 copy for two readers: the transposed dequantize against the host codec, and an FP8 linear that
// serves its input to a later reader (fp8_linear's serve_input) from its saved codes: the linear's own
// results unchanged, the served value the dequantized codes, and attention's backward reading it; and the
// cast that reads a saved tensor's codes (saved_gelu) against fp8_restore then the gelu cast.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>

#include "config/config.h"
#include "core/cuda_check.h"
#include "fp8/saved.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear.h"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {
float bf16_rn(float v) { return round_bf16({v})[0]; }
}  // namespace

TEST_CASE("fp8 dequantize transposed: equals the host codec element for element - ragged tiles - both formats",
          "[gpu][fp8]") {
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{130, 200}, {64, 64}, {1, 77}, {333, 5}}) {
      INFO("format " << static_cast<int>(format) << " rows " << rows << " cols " << cols);
      std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
      for (auto& c : codes) c = static_cast<uint8_t>(rng()() & 0xFF);
      const float scale_inv = 0.0371f;
      Tensor d_codes = Tensor::empty({rows, cols}, fp8_dtype(format), kGpu);
      Tensor d_scale = upload({scale_inv}, {1}, DType::f32);
      CUDA_CHECK(cudaMemcpy(d_codes.raw(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
      Tensor out = poisoned({cols, rows}, DType::bf16);
      kernels::fp8_dequantize_transposed(d_codes.data<uint8_t>(), format, rows, cols, d_scale.data<float>(),
                                         out.data<__nv_bfloat16>(), kernels::compute_stream());
      const std::vector<float> got = download(out);
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float ref = bf16_rn(fp8_to_float(codes[static_cast<size_t>(r * cols + c)], format) * scale_inv);
          const float g = got[static_cast<size_t>(c * rows + r)];
          const bool same = std::isnan(ref) ? std::isnan(g) : std::memcmp(&g, &ref, sizeof g) == 0;
          bad += !same;
        }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("fp8 linear serve_input: the linear's results are unchanged and the served input is its dequantized codes",
          "[gpu][fp8]") {
  // M = 272 and C = 208 leave partial tiles. Delayed scaling: the step's input scale is the host
  // meta's, so the served value can be checked against the host codec.
  const int64_t M = 272, C = 208, OC = 96;
  const auto x = round_bf16(randn(M * C, 2.0f)), w = round_bf16(randn(OC * C, 0.05f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 1e-3f));
  struct Result {
    std::vector<float> y, dx, dw;
  };
  Fp8Config cfg;
  cfg.scaling = Fp8Scaling::delayed;
  Fp8LinearState served("served", cfg), plain("plain", cfg);
  auto run = [&](Fp8LinearState& st, bool serve, std::vector<float>* served_value) {
    Var xv = make_var(upload(x, {M / 16, 16, C}, DType::bf16), true);
    Var wv = make_var(upload(w, {OC, C}, DType::bf16), true), bv = make_var(upload(b, {OC}, DType::bf16), true);
    wv->grad = Tensor::zeros({OC, C}, DType::f32, kGpu, MemCategory::gradients);
    bv->grad = Tensor::zeros({OC}, DType::f32, kGpu, MemCategory::gradients);
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      y = fp8_linear(xv, wv, bv, st, serve);
    }
    CHECK(xv->value.defined() == !serve);  // served: dropped until a reader asks
    if (served_value) *served_value = download(value_of(xv));
    grad_of(y).copy_from(upload(dy, {M / 16, 16, OC}, DType::bf16));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return Result{y->value.to_float_vector(), grad_of(xv).to_float_vector(), wv->grad.to_float_vector()};
  };
  const float scale = served.input.scale, scale_inv = served.input.scale_inv;
  std::vector<float> xs;
  const Result s = run(served, true, &xs), p = run(plain, false, nullptr);
  CHECK(s.y == p.y);
  CHECK(s.dx == p.dx);
  CHECK(s.dw == p.dw);
  REQUIRE(xs.size() == x.size());
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float ref = bf16_rn(fp8_to_float(float_to_fp8(x[i] * scale, Fp8Format::e4m3), Fp8Format::e4m3) * scale_inv);
    bad += std::memcmp(&xs[i], &ref, sizeof ref) != 0;
  }
  CHECK(bad == 0);
}

TEST_CASE("attention then a serving projection: attention's backward reads the served output", "[gpu][fp8]") {
  // qkv -> attention -> proj (serve_input) against the same with the attention output replaced, for the
  // backward, by what the projection served: attention's backward must give identical qkv gradients.
  const int B = 2, T = 64, C = 128, NH = 2;
  const auto qkv = round_bf16(randn(B * T * 3 * C, 1.0f)), w = round_bf16(randn(C * C, 0.05f));
  const auto dy = round_bf16(randn(B * T * C, 1e-2f));
  Fp8Config cfg;
  cfg.scaling = Fp8Scaling::delayed;
  Fp8LinearState st_served("served", cfg), st_plain("plain", cfg);
  std::vector<float> served_o;
  auto run = [&](Fp8LinearState& st, bool serve) {
    Var q = make_var(upload(qkv, {B, T, 3 * C}, DType::bf16), true);
    Var wv = make_var(upload(w, {C, C}, DType::bf16), true);
    wv->grad = Tensor::zeros({C, C}, DType::f32, kGpu, MemCategory::gradients);
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      Var o = attention(q, NH);
      y = fp8_linear(o, wv, Var(), st, serve);
      if (serve) {
        served_o = download(value_of(o));
      } else {  // the reference: attention's saved output replaced by the served values
        REQUIRE(served_o.size() == static_cast<size_t>(B * T * C));
        o->value.copy_from(upload(served_o, {B, T, C}, DType::bf16));
      }
    }
    grad_of(y).copy_from(upload(dy, {B, T, C}, DType::bf16));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return grad_of(q).to_float_vector();
  };
  const std::vector<float> d_served = run(st_served, true), d_ref = run(st_plain, false);
  // dK and dV are summed in registers (the same bits every run); dQ through f32 atomics in varying order,
  // then rounded to bf16: within a few bf16 ulps.
  std::vector<float> q_served, q_ref, kv_served, kv_ref;
  for (size_t i = 0; i < d_served.size(); ++i) {
    const bool is_q = static_cast<int>(i % (3 * C)) < C;
    (is_q ? q_served : kv_served).push_back(d_served[i]);
    (is_q ? q_ref : kv_ref).push_back(d_ref[i]);
  }
  CHECK(rms(kv_served) > 0.0);
  CHECK(kv_served == kv_ref);
  CHECK(rel_err(q_served, q_ref) < 1e-2);
}

TEST_CASE("fp8 cast: the saved_gelu prologue equals fp8_restore then the gelu cast bit for bit - ragged shapes",
          "[gpu][fp8]") {
  // cols 200 takes the 16-byte path, 203 the element path; rows 130 leaves a partial tile.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{130, 200}, {64, 203}, {256, 64}}) {
    INFO("rows " << rows << " cols " << cols);
    const Tensor pre = upload(round_bf16(randn(static_cast<size_t>(rows * cols), 3.0f)), {rows, cols}, DType::bf16);
    const QuantizedTensor saved = fp8_save(pre, nullptr);
    const Tensor restored = fp8_restore(saved, MemCategory::workspace);
    const Tensor scale = upload({7.5f}, {1}, DType::f32);
    auto cast = [&](bool from_codes, std::vector<float>* amax) {
      Tensor out = poisoned({rows, cols}, DType::e4m3), out_t = poisoned({cols, rows}, DType::e4m3);
      Tensor a = Tensor::zeros({1}, DType::f32, kGpu);
      kernels::Fp8CastOperands ops;
      if (from_codes) {
        ops.pre_codes = saved.codes.data<uint8_t>();
        ops.row_scale_inv = saved.scale_inv.data<float>();
      }
      kernels::fp8_cast(from_codes ? nullptr : restored.raw(), DType::bf16, rows, cols, out.data<uint8_t>(),
                        out_t.data<uint8_t>(), Fp8Format::e4m3, scale.data<float>(), {a.data<float>(), nullptr},
                        kernels::compute_stream(),
                        from_codes ? kernels::Fp8CastInput::saved_gelu : kernels::Fp8CastInput::gelu, ops);
      *amax = download(a);
      return std::pair{download_codes(out), download_codes(out_t)};
    };
    std::vector<float> amax_codes, amax_ref;
    const auto [c_out, c_out_t] = cast(true, &amax_codes);
    const auto [r_out, r_out_t] = cast(false, &amax_ref);
    CHECK(code_mismatches(c_out, r_out) == 0);
    CHECK(code_mismatches(c_out_t, r_out_t) == 0);
    CHECK(amax_codes == amax_ref);
    CHECK(amax_ref[0] > 0.0f);
  }
}

TEST_CASE("fp8 cast: the saved_dgelu prologue equals the dgelu prologue over the restored input - colsum - ragged",
          "[gpu][fp8]") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{130, 200}, {64, 203}}) {
    INFO("rows " << rows << " cols " << cols);
    const Tensor pre = upload(round_bf16(randn(static_cast<size_t>(rows * cols), 3.0f)), {rows, cols}, DType::bf16);
    const Tensor dy = upload(round_bf16(randn(static_cast<size_t>(rows * cols), 1e-2f)), {rows, cols}, DType::bf16);
    const QuantizedTensor saved = fp8_save(pre, nullptr);
    const Tensor restored = fp8_restore(saved, MemCategory::workspace);
    const Tensor scale = upload({900.0f}, {1}, DType::f32);
    auto cast = [&](bool from_codes, std::vector<float>* amax, std::vector<float>* colsum) {
      Tensor out = poisoned({rows, cols}, DType::e5m2), out_t = poisoned({cols, rows}, DType::e5m2);
      Tensor a = Tensor::zeros({1}, DType::f32, kGpu), cs = Tensor::zeros({cols}, DType::f32, kGpu);
      kernels::Fp8CastOperands ops;
      if (from_codes) {
        ops.pre_codes = saved.codes.data<uint8_t>();
        ops.row_scale_inv = saved.scale_inv.data<float>();
      } else {
        ops.pre = restored.data<__nv_bfloat16>();
      }
      kernels::Fp8CastOutputs stats{a.data<float>(), nullptr, cs.data<float>()};
      kernels::fp8_cast(dy.raw(), DType::bf16, rows, cols, out.data<uint8_t>(), out_t.data<uint8_t>(),
                        Fp8Format::e5m2, scale.data<float>(), stats, kernels::compute_stream(),
                        from_codes ? kernels::Fp8CastInput::saved_dgelu : kernels::Fp8CastInput::dgelu, ops);
      *amax = download(a);
      *colsum = download(cs);
      return std::pair{download_codes(out), download_codes(out_t)};
    };
    std::vector<float> amax_codes, amax_ref, cs_codes, cs_ref;
    const auto [c_out, c_out_t] = cast(true, &amax_codes, &cs_codes);
    const auto [r_out, r_out_t] = cast(false, &amax_ref, &cs_ref);
    CHECK(code_mismatches(c_out, r_out) == 0);
    CHECK(code_mismatches(c_out_t, r_out_t) == 0);
    CHECK(amax_codes == amax_ref);
    CHECK(amax_ref[0] > 0.0f);
    CHECK(reordered_mismatches(cs_codes, cs_ref) == 0);  // atomics: f32 order varies
  }
}
