// FP8 scaling state against hand-worked cases (history roll, margin, max vs most_recent, current
// scaling, zero/inf/NaN amax) and host quantization (saturation counts, amax, round trip).
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <vector>

#include "fp8/quantize.h"
#include "fp8/scaling.h"

using namespace fp8t;

namespace {
Fp8Config scaling_cfg(int len, AmaxAlgo algo, int margin = 0, Fp8Scaling scaling = Fp8Scaling::delayed) {
  Fp8Config c;
  c.amax_history_len = len;
  c.amax_compute_algo = algo;
  c.margin = margin;
  c.scaling = scaling;
  return c;
}

// One step: a cast with amax `a` (the delayed scale it used is returned), then the end of the step.
float step(Fp8TensorMeta& m, float a) {
  const float used = m.scale_for_cast(a);
  m.record(a, 0);
  m.end_step();
  return used;
}
}  // namespace

TEST_CASE("fp8: formats per role follow the recipe", "[fp8]") {
  CHECK(Fp8RoleFormats::from(Fp8Formats::hybrid).forward == Fp8Format::e4m3);
  CHECK(Fp8RoleFormats::from(Fp8Formats::hybrid).backward == Fp8Format::e5m2);
  CHECK(Fp8RoleFormats::from(Fp8Formats::e4m3).forward == Fp8Format::e4m3);
  CHECK(Fp8RoleFormats::from(Fp8Formats::e4m3).backward == Fp8Format::e4m3);
}

TEST_CASE("fp8: delayed scaling with a length-3 history and amax_compute_algo max", "[fp8]") {
  Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::max));
  CHECK(m.scale == 1.0f);  // fresh: all-zero history, scale 1 (as Transformer Engine)
  // amax sequence 2, 7, 3.5, 1.75, 0.875, 0.5. Each cast uses the scale from the history BEFORE it;
  // after the step the new amax enters and the scale becomes 448 / max(history):
  //   after 2    : [0, 0, 2]            -> 448 / 2   = 224
  //   after 7    : [0, 2, 7]            -> 448 / 7   = 64
  //   after 3.5  : [2, 7, 3.5]          -> 64
  //   after 1.75 : [7, 3.5, 1.75]       -> 64
  //   after 0.875: [3.5, 1.75, 0.875]   -> 7 has rolled out: 448 / 3.5 = 128
  //   after 0.5  : [1.75, 0.875, 0.5]   -> 256
  CHECK(step(m, 2.0f) == 1.0f);
  CHECK(m.scale == 224.0f);
  CHECK(step(m, 7.0f) == 224.0f);  // the 7 is seen only by the next step's scale
  CHECK(m.scale == 64.0f);
  CHECK(m.history_oldest_first() == std::vector<float>{0.0f, 2.0f, 7.0f});
  CHECK(step(m, 3.5f) == 64.0f);
  CHECK(m.scale == 64.0f);
  CHECK(step(m, 1.75f) == 64.0f);
  CHECK(m.scale == 64.0f);
  CHECK(m.history_oldest_first() == std::vector<float>{7.0f, 3.5f, 1.75f});
  step(m, 0.875f);
  CHECK(m.scale == 128.0f);
  step(m, 0.5f);
  CHECK(m.scale == 256.0f);
  CHECK(m.scale_inv == 1.0f / 256.0f);
  CHECK(m.history_oldest_first() == std::vector<float>{1.75f, 0.875f, 0.5f});
  CHECK(m.last_amax == 0.5f);
}

TEST_CASE("fp8: amax_compute_algo most_recent uses only the last step", "[fp8]") {
  Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::most_recent));
  const float amax[] = {2.0f, 7.0f, 3.5f, 1.75f, 0.875f, 0.5f};
  const float want[] = {224.0f, 64.0f, 128.0f, 256.0f, 512.0f, 896.0f};
  for (int i = 0; i < 6; ++i) {
    step(m, amax[i]);
    CHECK(m.scale == want[i]);
  }
}

TEST_CASE("fp8: micro-batches of one step take the max amax", "[fp8]") {
  Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(4, AmaxAlgo::most_recent));
  m.record(1.0f, 2);
  m.record(7.0f, 1);
  m.record(3.0f, 0);
  CHECK(m.amax_this_step == 7.0f);
  CHECK(m.scale == 1.0f);  // unchanged until the end of the step
  m.end_step();
  CHECK(m.scale == 64.0f);
  CHECK(m.last_saturated == 3);
  CHECK(m.saturated_this_step == 0);
  CHECK(m.amax_this_step == 0.0f);
}

TEST_CASE("fp8: margin 1 halves the scale; E5M2 uses fmax 57344", "[fp8]") {
  Fp8TensorMeta m0(Fp8Format::e4m3, scaling_cfg(2, AmaxAlgo::max, 0));
  Fp8TensorMeta m1(Fp8Format::e4m3, scaling_cfg(2, AmaxAlgo::max, 1));
  Fp8TensorMeta m2(Fp8Format::e4m3, scaling_cfg(2, AmaxAlgo::max, 2));
  step(m0, 7.0f);
  step(m1, 7.0f);
  step(m2, 7.0f);
  CHECK(m0.scale == 64.0f);
  CHECK(m1.scale == 32.0f);
  CHECK(m2.scale == 16.0f);
  Fp8TensorMeta g(Fp8Format::e5m2, scaling_cfg(2, AmaxAlgo::max));
  step(g, 7.0f);
  CHECK(g.scale == 8192.0f);  // 57344 / 7
  CHECK(fp8_scale_from_amax(7.0f, 57344.0f, 1, 1.0f) == 4096.0f);
}

TEST_CASE("fp8: current scaling derives the scale from this cast's amax", "[fp8]") {
  Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::max, 0, Fp8Scaling::current));
  CHECK(m.scale_for_cast(7.0f) == 64.0f);
  CHECK(m.scale == 64.0f);
  CHECK(m.scale_inv == 1.0f / 64.0f);
  m.record(7.0f, 0);
  m.end_step();
  CHECK(m.scale == 64.0f);  // the history does not move a current scale
  CHECK(m.scale_for_cast(0.5f) == 896.0f);
  Fp8TensorMeta h(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::max, 1, Fp8Scaling::current));
  CHECK(h.scale_for_cast(7.0f) == 32.0f);
  CHECK(h.scale_for_cast(0.0f) == 32.0f);      // all-zero tensor: keep the scale
  CHECK(h.scale_for_cast(INFINITY) == 32.0f);  // Inf/NaN: keep the scale
  CHECK(h.scale_for_cast(NAN) == 32.0f);
}

TEST_CASE("fp8: zero - inf and NaN amax keep a finite scale", "[fp8]") {
  SECTION("zero amax keeps the previous scale") {
    Fp8TensorMeta fresh(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::max));
    step(fresh, 0.0f);
    CHECK(fresh.scale == 1.0f);
    Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::most_recent));
    step(m, 7.0f);
    step(m, 0.0f);  // a zero is a real observation: it enters the history but keeps the scale
    CHECK(m.scale == 64.0f);
    CHECK(m.history_oldest_first() == std::vector<float>{0.0f, 7.0f, 0.0f});
  }
  SECTION("inf amax is reported but enters neither history nor scale") {
    Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::max));
    step(m, 7.0f);
    step(m, INFINITY);
    CHECK(m.scale == 64.0f);
    CHECK(std::isinf(m.last_amax));
    CHECK(m.history_oldest_first() == std::vector<float>{0.0f, 0.0f, 7.0f});
    step(m, 14.0f);
    CHECK(m.scale == 32.0f);
  }
  SECTION("NaN sticks within a step whatever the order, and keeps the scale") {
    Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::max));
    step(m, 7.0f);
    m.record(NAN, 0);
    m.record(3.0f, 0);
    CHECK(std::isnan(m.amax_this_step));
    m.end_step();
    CHECK(m.scale == 64.0f);
    CHECK(std::isfinite(m.scale_inv));
    CHECK(std::isnan(m.last_amax));
    m.record(3.0f, 0);
    m.record(NAN, 0);
    CHECK(std::isnan(m.amax_this_step));
  }
  SECTION("a denormal amax whose scale would overflow keeps the scale") {
    CHECK(fp8_scale_from_amax(1e-45f, 448.0f, 0, 5.0f) == 5.0f);
    CHECK(fp8_scale_from_amax(-1.0f, 448.0f, 0, 5.0f) == 5.0f);
  }
  SECTION("a step without casts changes nothing") {
    Fp8TensorMeta m(Fp8Format::e4m3, scaling_cfg(3, AmaxAlgo::most_recent));
    step(m, 7.0f);
    m.end_step();
    CHECK(m.scale == 64.0f);
    CHECK(m.history_oldest_first() == std::vector<float>{0.0f, 0.0f, 7.0f});
  }
}

TEST_CASE("fp8: quantize counts saturated values and returns the unscaled amax", "[fp8]") {
  const std::vector<float> x = {1.0f, -2.0f, 500.0f, -1000.0f, INFINITY, 0.001f, 449.0f, 448.0f};
  std::vector<uint8_t> codes(x.size());
  Fp8CastStats s = fp8_quantize(x.data(), static_cast<int64_t>(x.size()), 1.0f, Fp8Format::e4m3, codes.data());
  CHECK(s.saturated == 4);  // 500, -1000, inf, 449 (449 rounds to 448 but did exceed fmax)
  CHECK(std::isinf(s.amax));
  CHECK(codes[2] == 0x7E);  // +448
  CHECK(codes[3] == 0xFE);  // -448
  CHECK(codes[4] == 0x7E);  // satfinite: inf -> +448
  CHECK(codes[7] == 0x7E);

  // The scale applies before the cast; the amax is of the unscaled input.
  const std::vector<float> y = {0.5f, -3.0f, 0.25f};
  s = fp8_quantize(y.data(), 3, 200.0f, Fp8Format::e4m3, codes.data());
  CHECK(s.amax == 3.0f);
  CHECK(s.saturated == 1);  // -600
  CHECK(fp8_to_float(codes[0], Fp8Format::e4m3) == 96.0f);  // 100 rounds to 96 in E4M3

  // E5M2 saturates at 57344.
  const std::vector<float> g = {600.0f, 500.0f, -0.01f, NAN};
  s = fp8_quantize(g.data(), 4, 100.0f, Fp8Format::e5m2, codes.data());
  CHECK(s.saturated == 1);  // 60000 > 57344; 50000 is in range
  CHECK(std::isnan(s.amax));
  CHECK(fp8_to_float(codes[0], Fp8Format::e5m2) == 57344.0f);
  CHECK(std::isnan(fp8_to_float(codes[3], Fp8Format::e5m2)));
  CHECK(std::isnan(fp8_amax(g.data(), 4)));
  CHECK(fp8_amax(g.data(), 3) == 600.0f);
}

TEST_CASE("fp8: tensor quantize stores one byte codes and dequantizes with scale_inv", "[fp8]") {
  Tensor x = Tensor::from_vector({0.5f, -1.5f, 3.0f, 0.0078125f, 7.0f, -7.0f}, {2, 3});
  Fp8CastStats s;
  const QuantizedTensor q = quantize(x, ScaleLayout::per_tensor, Fp8Format::e4m3, 64.0f, MemCategory::activations, &s);
  CHECK(q.codes.dtype() == DType::e4m3);
  CHECK(q.codes.nbytes() == 6);
  CHECK(q.codes.shape() == Shape{2, 3});
  CHECK(q.tensor_scale_inv() == 1.0f / 64.0f);
  CHECK(s.amax == 7.0f);
  CHECK(s.saturated == 0);
  // Every value here times 64 is exact in E4M3, so the round trip is exact.
  CHECK(dequantize(q).to_float_vector() == x.to_float_vector());
  CHECK(decode(q).to_float_vector() == std::vector<float>{32.0f, -96.0f, 192.0f, 0.5f, 448.0f, -448.0f});

  // Large tensors run threaded: same counts as the serial reference.
  std::vector<float> big(100000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::sin(float(i)) * 10.0f;
  big[777] = 1e6f;
  std::vector<uint8_t> codes(big.size());
  s = fp8_quantize(big.data(), static_cast<int64_t>(big.size()), 50.0f, Fp8Format::e4m3, codes.data());
  int64_t sat = 0;
  for (float v : big) sat += std::fabs(v * 50.0f) > 448.0f;
  CHECK(s.saturated == sat);
  CHECK(s.amax == 1e6f);
}
