// FP8 storage of saved activations (fp8/saved.h) on the CPU: the per-row codes and scales against a
// hand-worked case and the host codec, the in-place save, and the ops that use it (GELU, attention):
// forward and backward must equal the plain op evaluated on the dequantized input, and the tape must
// keep 1 byte per element instead of the input.
#include <catch2/catch_test_macros.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/allocator.h"
#include "fp8/quantize.h"
#include "fp8/saved.h"
#include "ops/ops.h"

using namespace fp8t;

namespace {

Tensor randn(std::mt19937& rng, Shape shape, float stdev) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  std::normal_distribution<float> d(0.0f, stdev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

std::vector<float> values(const Tensor& t) { return t.to_float_vector(); }

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  c.copy_from(t);
  return c;
}

// y = op(x) and dx for the upstream gradient dy, on a fresh tape.
template <typename Op>
std::pair<std::vector<float>, std::vector<float>> run(Op op, const Tensor& x, const Tensor& dy) {
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
  return {values(y->value), values(vx->grad)};
}

}  // namespace

TEST_CASE("fp8_save: one scale per row, worked by hand", "[fp8][saved]") {
  // Rows: amax 7 (scale 448 / 7 = 64, exact); zeros; inf (scale 1, inf saturates to 448); NaN (scale 1,
  // NaN -> 0x7F); amax 1792 (scale 1/4); amax 1e-40 (448 / amax overflows f32: scale 1).
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::from_vector({7.0f, -3.5f, 0.25f, 0.0f, 0.0f, 0.0f, inf, 1.0f, -2.0f,  //
                                        nan, 0.5f, 3.0f, 1792.0f, 0.0f, -0.875f, 1e-40f, 0.0f, 0.0f},
                                       {2, 3, 3});
  Tensor rt;
  const QuantizedTensor s = fp8_save(x, &rt);
  REQUIRE(s.codes.dtype() == DType::e4m3);
  REQUIRE(s.codes.shape() == x.shape());
  REQUIRE(s.cols() == 3);
  REQUIRE(s.scale_inv.shape() == Shape{6});
  const std::vector<float> scale_inv{1.0f / 64, 1.0f, 1.0f, 1.0f, 4.0f, 1.0f};
  const std::vector<uint8_t> codes{0x7E, 0xF6, 0x58, 0x00, 0x00, 0x00, 0x7E, 0x38, 0xC0,
                                   0x7F, 0x30, 0x44, 0x7E, 0x00, 0xA6, 0x00, 0x00, 0x00};
  for (int r = 0; r < 6; ++r) CHECK(s.scale_inv.data<float>()[r] == scale_inv[size_t(r)]);
  for (size_t i = 0; i < codes.size(); ++i) {
    CAPTURE(i);
    CHECK(s.codes.data<uint8_t>()[i] == codes[i]);
  }
  const std::vector<float> want{7.0f, -3.5f, 0.25f, 0.0f, 0.0f, 0.0f, 448.0f, 1.0f, -2.0f,
                                nan,  0.5f,  3.0f,  1792.0f, 0.0f, -0.875f, 0.0f, 0.0f, 0.0f};
  const auto got = values(rt), restored = values(fp8_restore(s));
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK((std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i]));
    CHECK((std::isnan(want[i]) ? std::isnan(restored[i]) : restored[i] == want[i]));
  }
}

TEST_CASE("fp8_save: per-row scales and codes follow the host codec, round trip within E4M3's error", "[fp8][saved]") {
  std::mt19937 rng(7);
  const int64_t R = 9, C = 37;
  Tensor x = randn(rng, {R, C}, 1.0f);
  for (int64_t r = 0; r < R; ++r)  // magnitudes 1e-4 .. 1e4, one per row
    for (int64_t c = 0; c < C; ++c) x.data<float>()[r * C + c] *= std::pow(10.0f, float(r - 4));
  Tensor rt;
  const QuantizedTensor s = fp8_save(x, &rt);
  for (int64_t r = 0; r < R; ++r) {
    CAPTURE(r);
    const float* x_r = x.data<float>() + r * C;
    const float scale = 448.0f / fp8_amax(x_r, C);
    REQUIRE(s.scale_inv.data<float>()[r] == 1.0f / scale);
    std::vector<uint8_t> ref(static_cast<size_t>(C));
    fp8_quantize(x_r, C, scale, Fp8Format::e4m3, ref.data());
    std::vector<float> deq(ref.size());
    fp8_dequantize(ref.data(), C, 1.0f / scale, Fp8Format::e4m3, deq.data());
    for (int64_t c = 0; c < C; ++c) {
      REQUIRE(s.codes.data<uint8_t>()[r * C + c] == ref[size_t(c)]);
      REQUIRE(rt.data<float>()[r * C + c] == deq[size_t(c)]);
      // 3 mantissa bits: |error| <= |x| / 16 for normals, half the subnormal step (2^-10 / scale) below.
      const float v = x_r[c], bound = std::max(std::fabs(v) / 16, std::ldexp(1.0f, -10) / scale) * 1.001f;
      CHECK(std::fabs(rt.data<float>()[r * C + c] - v) <= bound);
    }
  }
  CHECK(values(fp8_restore(s)) == values(rt));
}

TEST_CASE("fp8_save_inplace equals fp8_save with a round trip", "[fp8][saved]") {
  std::mt19937 rng(5);
  for (const Shape& shape : {Shape{4, 3, 50}, Shape{17}, Shape{6, 1}}) {
    const Tensor x = randn(rng, shape, 2.0f);
    x.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    Tensor rt;
    const QuantizedTensor a = fp8_save(x, &rt);
    Tensor y = Tensor::empty(shape, DType::f32);
    y.copy_from(x);
    const QuantizedTensor b = fp8_save_inplace(y);
    CHECK(b.cols() == a.cols());
    CHECK(values(b.scale_inv) == values(a.scale_inv));
    CHECK(std::memcmp(a.codes.raw(), b.codes.raw(), a.codes.nbytes()) == 0);
    CHECK(std::memcmp(y.raw(), rt.raw(), rt.nbytes()) == 0);  // the same bits, NaN included
    CHECK(std::isnan(y.data<float>()[1]));
  }
}

TEST_CASE("GELU and attention with FP8 storage equal the plain ops on the dequantized input", "[fp8][saved][ops]") {
  std::mt19937 rng(11);
  {
    const Tensor x = randn(rng, {4, 5, 24}, 2.0f), dy = randn(rng, {4, 5, 24}, 1.0f);
    Tensor rt;
    fp8_save(x, &rt);
    const Tensor xs = copy_of(x);
    const auto stored = run([](const Var& v) { return gelu(v, true); }, xs, dy);
    CHECK(values(xs) == values(rt));  // the op replaced its input by the round trip, in place
    const auto plain = run([](const Var& v) { return gelu(v, false); }, rt, dy);
    CHECK(stored.first == plain.first);
    CHECK(stored.second == plain.second);
    const auto unquantized = run([](const Var& v) { return gelu(v, false); }, x, dy);
    CHECK(stored.first != unquantized.first);  // the storage really quantized
  }
  {
    const int B = 2, T = 9, C = 16, NH = 2;
    const Tensor qkv = randn(rng, {B, T, 3 * C}, 1.0f), dy = randn(rng, {B, T, C}, 1.0f);
    Tensor rt;
    fp8_save(qkv, &rt);
    const Tensor qs = copy_of(qkv);
    const auto stored = run([&](const Var& v) { return attention(v, NH, true); }, qs, dy);
    CHECK(values(qs) == values(rt));
    const auto plain = run([&](const Var& v) { return attention(v, NH, false); }, rt, dy);
    CHECK(stored.first == plain.first);
    CHECK(stored.second == plain.second);
  }
}

TEST_CASE("FP8 storage: the tape keeps 1-byte codes instead of the GELU input", "[fp8][saved][ops]") {
  std::mt19937 rng(3);
  const Tensor x = randn(rng, {64, 256}, 1.0f);
  auto kept_bytes = [&](bool store) {
    Allocator& a = allocator_for(Device::cpu());
    const int64_t before = a.stats().cur(MemCategory::activations);
    Tensor xc = Tensor::empty(x.shape(), DType::f32, Device::cpu(), MemCategory::activations);
    xc.copy_from(x);
    Var vx = make_var(std::move(xc), true);
    Tape tape;
    Var y;
    {
      TapeScope s(&tape);
      y = gelu(vx, store);
    }
    vx.reset();  // the caller drops its handle; only what the tape saved stays
    y->value = Tensor();
    return a.stats().cur(MemCategory::activations) - before;
  };
  const int64_t plain = kept_bytes(false), stored = kept_bytes(true);
  INFO("plain " << plain << " stored " << stored);
  CHECK(plain >= x.numel() * 4);
  CHECK(stored < x.numel() * 4 / 3);  // codes (1 byte each) and 4 bytes of scale per row
}
