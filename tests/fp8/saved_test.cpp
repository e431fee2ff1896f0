// FP8 storage of saved activations (fp8/saved.h) on the CPU: the codes and scale against the host
// codec, the edge cases of the scale, and the ops that use it (GELU, attention): forward and backward
// must equal the plain op evaluated on the dequantized input, and the tape must keep 1 byte per
// element instead of the input.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
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

TEST_CASE("fp8_save keeps E4M3 codes with the tensor's own current scale", "[fp8][saved]") {
  std::mt19937 rng(7);
  const Tensor x = randn(rng, {33, 17}, 3.0f);
  Tensor rt;
  const Fp8Saved s = fp8_save(x, &rt);
  REQUIRE(s.codes.dtype() == DType::e4m3);
  REQUIRE(s.codes.shape() == x.shape());
  const float amax = fp8_amax(x.data<float>(), x.numel());
  const float scale = 448.0f / amax;
  CHECK(s.scales.data<float>()[0] == amax);
  CHECK(s.scales.data<float>()[1] == scale);
  CHECK(s.scales.data<float>()[2] == 1.0f / scale);
  std::vector<uint8_t> ref(static_cast<size_t>(x.numel()));
  fp8_quantize(x.data<float>(), x.numel(), scale, Fp8Format::e4m3, ref.data());
  std::vector<float> deq(ref.size());
  fp8_dequantize(ref.data(), x.numel(), 1.0f / scale, Fp8Format::e4m3, deq.data());
  for (int64_t i = 0; i < x.numel(); ++i) {
    REQUIRE(s.codes.data<uint8_t>()[i] == ref[i]);
    REQUIRE(rt.data<float>()[i] == deq[i]);
  }
  CHECK(values(fp8_restore(s)) == deq);
  // The largest magnitude maps to 448 exactly; E4M3 keeps 3 mantissa bits (relative error <= 2^-4).
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.data<float>()[i];
    if (std::fabs(v) * scale >= 1.0f / 64) CHECK(std::fabs(rt.data<float>()[i] - v) <= std::fabs(v) / 16);
  }
}

TEST_CASE("fp8_save of zeros or non-finite values keeps a finite scale", "[fp8][saved]") {
  Tensor z = Tensor::zeros({8}, DType::f32);
  Tensor rt;
  Fp8Saved s = fp8_save(z, &rt);
  CHECK(s.scales.data<float>()[1] == 1.0f);
  for (float v : values(rt)) CHECK(v == 0.0f);
  Tensor bad = Tensor::from_vector({1.0f, std::numeric_limits<float>::quiet_NaN(), -2.0f, 0.5f}, {4});
  s = fp8_save(bad, &rt);
  CHECK(std::isnan(s.scales.data<float>()[0]));  // the NaN shows in the amax
  CHECK(s.scales.data<float>()[1] == 1.0f);       // but the scale stays finite
  const auto r = values(rt);
  CHECK(r[0] == 1.0f);
  CHECK(std::isnan(r[1]));
  CHECK(r[2] == -2.0f);
  CHECK(r[3] == 0.5f);
}

TEST_CASE("GELU and attention with FP8 storage equal the plain ops on the dequantized input", "[fp8][saved][ops]") {
  std::mt19937 rng(11);
  {
    const Tensor x = randn(rng, {4, 5, 24}, 2.0f), dy = randn(rng, {4, 5, 24}, 1.0f);
    Tensor rt;
    fp8_save(x, &rt);
    const auto stored = run([](const Var& v) { return gelu(v, true); }, x, dy);
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
    const auto stored = run([&](const Var& v) { return attention(v, NH, true); }, qkv, dy);
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
  CHECK(stored < x.numel() * 4 / 3);  // codes (1 byte each) and 16 bytes of scales
}
