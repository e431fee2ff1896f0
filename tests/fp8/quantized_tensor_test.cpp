// QuantizedTensor (fp8/quantized_tensor.h) on the CPU: scale shapes of every layout, hand-worked codes and
// scales for per-tensor, per-row, 1x128 and 128x128 blocks, round-trip bounds, and the recipes of
// fp8/recipe.h (their properties, checkpoint state, the step's amax reduction).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/check.h"
#include "fp8/quantize.h"
#include "fp8/quantized_tensor.h"
#include "fp8/recipe.h"
#include "fp8/scaling.h"

using namespace fp8t;

namespace {

Tensor host(const std::vector<float>& v, Shape shape) { return Tensor::from_vector(v, std::move(shape)); }

std::vector<float> values(const Tensor& t) { return t.to_float_vector(); }

Fp8Config config(Fp8Scaling scaling) {
  Fp8Config c;
  c.scaling = scaling;
  c.amax_history_len = 4;
  return c;
}

}  // namespace

TEST_CASE("quantized tensor: scale shapes per layout", "[fp8]") {
  CHECK(scale_shape(ScaleLayout::per_tensor, 300, 200) == Shape{1});
  CHECK(scale_shape(ScaleLayout::per_row, 300, 200) == Shape{300});
  CHECK(scale_shape(ScaleLayout::block_1x128, 300, 200) == Shape{300, 2});
  CHECK(scale_shape(ScaleLayout::block_128x128, 300, 200) == Shape{3, 2});
  CHECK(scale_shape(ScaleLayout::block_128x128, 128, 128) == Shape{1, 1});
  CHECK(std::string(scale_layout_name(ScaleLayout::block_1x128)) == "block_1x128");
}

TEST_CASE("quantized tensor: per-tensor codes with the given scale, hand-worked", "[fp8]") {
  // scale 2: 1.5 -> 3 (exact); -100 -> -200, halfway between the E4M3 neighbours 192 and 208 (step 16 in
  // [128, 256)), so it rounds to the even mantissa, 192; 300 -> 600 saturates to 448.
  Fp8CastStats st;
  const QuantizedTensor q =
      quantize(host({1.5f, -100.0f, 300.0f, 0.0f}, {2, 2}), ScaleLayout::per_tensor, Fp8Format::e4m3, 2.0f,
               MemCategory::workspace, &st);
  CHECK(q.shape == Shape{2, 2});
  CHECK(q.rows() == 2);
  CHECK(q.cols() == 2);
  CHECK(q.tensor_scale_inv() == 0.5f);
  CHECK(values(decode(q)) == std::vector<float>{3.0f, -192.0f, 448.0f, 0.0f});
  CHECK(values(dequantize(q)) == std::vector<float>{1.5f, -96.0f, 224.0f, 0.0f});
  CHECK(st.amax == 300.0f);
  CHECK(st.saturated == 1);
}

TEST_CASE("quantized tensor: per-row scales are 448 / amax of each row, hand-worked", "[fp8]") {
  // Row 0: amax 4 -> scale 112, codes 448 and -112 (both exact in E4M3): round trip exact.
  // Row 1: all zeros -> scale 1. Row 2: amax 0.5 -> scale 896.
  const QuantizedTensor q = quantize(host({4.0f, -1.0f, 0.0f, 0.0f, 0.5f, 0.25f}, {3, 2}), ScaleLayout::per_row,
                                     Fp8Format::e4m3, /*scale, unused=*/123.0f, MemCategory::workspace);
  CHECK(values(q.scale_inv) == std::vector<float>{1.0f / 112.0f, 1.0f, 1.0f / 896.0f});
  CHECK(values(decode(q)) == std::vector<float>{448.0f, -112.0f, 0.0f, 0.0f, 448.0f, 224.0f});
  CHECK(values(dequantize(q)) == std::vector<float>{4.0f, -1.0f, 0.0f, 0.0f, 0.5f, 0.25f});
}

TEST_CASE("quantized tensor: 1x128 and 128x128 blocks, hand-worked", "[fp8]") {
  // (2, 130): columns 0..127 form block 0 of each row, 128..129 block 1. Row 0 block 0 holds 8 at column 5
  // (scale 56), block 1 holds 2 (scale 224); row 1 is all 1 (scale 448 in both blocks).
  std::vector<float> v(2 * 130, 0.0f);
  v[5] = 8.0f;
  v[128] = 2.0f;
  v[129] = -0.5f;
  for (int c = 0; c < 130; ++c) v[130 + c] = 1.0f;
  const Tensor x = host(v, {2, 130});
  const QuantizedTensor a = quantize(x, ScaleLayout::block_1x128, Fp8Format::e4m3, 1.0f, MemCategory::workspace);
  CHECK(a.scale_inv.shape() == Shape{2, 2});
  CHECK(values(a.scale_inv) == std::vector<float>{1.0f / 56.0f, 1.0f / 224.0f, 1.0f / 448.0f, 1.0f / 448.0f});
  const std::vector<float> ad = values(decode(a));
  CHECK(ad[5] == 448.0f);
  CHECK(ad[128] == 448.0f);
  CHECK(ad[129] == -112.0f);
  CHECK(ad[130] == 448.0f);
  CHECK(values(dequantize(a)) == v);  // every value is exact on its block's grid

  // 128x128: one block in rows (2 < 128), two in columns; block (0, 0) has amax 8, block (0, 1) amax 2.
  const QuantizedTensor b = quantize(x, ScaleLayout::block_128x128, Fp8Format::e4m3, 1.0f, MemCategory::workspace);
  CHECK(b.scale_inv.shape() == Shape{1, 2});
  CHECK(values(b.scale_inv) == std::vector<float>{1.0f / 56.0f, 1.0f / 224.0f});
  const std::vector<float> bd = values(decode(b));
  CHECK(bd[130] == 56.0f);  // row 1's 1.0 in block (0, 0): scale 56
  CHECK(bd[130 + 128] == 224.0f);
  CHECK(values(dequantize(b)) == v);
}

TEST_CASE("quantized tensor: round trip within half an E4M3 step of each block's scale", "[fp8]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t R = 200, C = 300;
  std::vector<float> v(static_cast<size_t>(R * C));
  for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * (i % 97 == 0 ? 50.0f : 1.0f);  // outliers
  const Tensor x = host(v, {R, C});
  for (ScaleLayout layout : {ScaleLayout::per_row, ScaleLayout::block_1x128, ScaleLayout::block_128x128}) {
    INFO(scale_layout_name(layout));
    const QuantizedTensor q = quantize(x, layout, Fp8Format::e4m3, 1.0f, MemCategory::workspace);
    const std::vector<float> d = values(dequantize(q));
    for (size_t i = 0; i < v.size(); ++i) {
      // E4M3 keeps 3 mantissa bits: the relative error of a normal value is at most 2^-4; values far below
      // their block's amax may be subnormal, whose absolute step is 2^-9 / scale.
      REQUIRE(std::fabs(d[i] - v[i]) <= std::fabs(v[i]) * 0.0625f + 1e-3f);
    }
  }
}

TEST_CASE("quantized tensor: non-finite values keep the scales finite", "[fp8]") {
  const QuantizedTensor q = quantize(host({NAN, 1.0f, INFINITY, 2.0f}, {2, 2}), ScaleLayout::per_row, Fp8Format::e4m3,
                                     1.0f, MemCategory::workspace);
  CHECK(values(q.scale_inv) == std::vector<float>{1.0f, 1.0f});  // amax NaN / inf -> scale 1
}

TEST_CASE("scaling recipes: properties and end of step", "[fp8]") {
  const Fp8ScalingRecipe& delayed = fp8_scaling_recipe(Fp8Scaling::delayed);
  const Fp8ScalingRecipe& current = fp8_scaling_recipe(Fp8Scaling::current);
  CHECK(std::string(delayed.name()) == "delayed");
  CHECK_FALSE(delayed.scale_from_tensor());
  CHECK(current.scale_from_tensor());
  CHECK(delayed.layout() == ScaleLayout::per_tensor);

  Fp8TensorMeta d(Fp8Format::e4m3, config(Fp8Scaling::delayed)), c(Fp8Format::e4m3, config(Fp8Scaling::current));
  CHECK(d.recipe == &delayed);
  CHECK(c.recipe == &current);
  // A cast: delayed keeps the step's scale (1), current takes 448 / 7.
  const float x[3] = {1.0f, -7.0f, 2.0f};
  CHECK(d.host_cast_scale(x, 3) == 1.0f);
  CHECK(c.host_cast_scale(x, 3) == 448.0f / 7.0f);
  d.record(7.0f, 0);
  c.record(7.0f, 0);
  d.end_step();
  c.end_step();
  CHECK(d.scale == 64.0f);                // delayed: the next step's scale from the history
  CHECK(c.scale == 448.0f / 7.0f);        // current: what the last cast used
  CHECK(c.amax_history[0] == 7.0f);       // both keep the history
  c.recipe->take_device_scale(c, 2.0f, 0.5f);
  CHECK(c.scale == 2.0f);
  d.recipe->take_device_scale(d, 2.0f, 0.5f);
  CHECK(d.scale == 64.0f);  // delayed scales live on the host
}

TEST_CASE("scaling recipes: checkpoint state round trip and damaged state", "[fp8]") {
  Fp8TensorMeta a(Fp8Format::e5m2, config(Fp8Scaling::delayed));
  a.record(3.0f, 0);
  a.end_step();
  a.record(5.0f, 0);
  a.end_step();
  const nlohmann::json j = a.recipe->state(a);
  Fp8TensorMeta b(Fp8Format::e5m2, config(Fp8Scaling::delayed));
  b.recipe->load_state(b, j, "h.0.attn.c_attn input");
  CHECK(b.scale == a.scale);
  CHECK(b.scale_inv == a.scale_inv);
  CHECK(b.pos == a.pos);
  CHECK(b.amax_history == a.amax_history);

  nlohmann::json bad = j;
  bad["pos"] = 9;
  CHECK_THROWS_WITH(b.recipe->load_state(b, bad, "lm_head weight"),
                    Catch::Matchers::ContainsSubstring("lm_head weight: amax history position 9 is outside [0, 4)"));
  bad = j;
  bad["scale"] = -1.0;
  CHECK_THROWS_WITH(b.recipe->load_state(b, bad, "x"), Catch::Matchers::ContainsSubstring("not a finite positive"));
  bad = j;
  bad.erase("amax_history");
  CHECK_THROWS_WITH(b.recipe->load_state(b, bad, "x"), Catch::Matchers::ContainsSubstring("has no 'amax_history'"));
}

TEST_CASE("scaling recipes: the step's amax reduction sends NaN as inf and names non-finite tensors", "[fp8]") {
  Fp8TensorMeta a(Fp8Format::e4m3, config(Fp8Scaling::delayed)), b = a, c = a;
  a.record(2.0f, 0);
  b.record(NAN, 0);
  // c records nothing this step: its 0 is reduced but never reported.
  std::vector<float> sent;
  const std::vector<std::string> names = {"l1 input", "l2 input", "l3 input"};
  const auto name_of = [&names](size_t i) { return names[i]; };
  const std::string bad = reduce_step_amax({&a, &b, &c}, name_of, [&](std::vector<float>& v) {
    sent = v;
    v[0] = 6.0f;  // another rank saw 6
  });
  CHECK(sent == std::vector<float>{2.0f, INFINITY, 0.0f});
  CHECK(a.amax_this_step == 6.0f);
  CHECK(bad == "l2 input amax is inf");
  // Without a reduction (one rank), NaN stays NaN in the report.
  Fp8TensorMeta d(Fp8Format::e4m3, config(Fp8Scaling::delayed));
  d.record(NAN, 0);
  CHECK(reduce_step_amax({&d}, [](size_t) { return std::string("l4 weight"); }, nullptr) == "l4 weight amax is nan");
}
