// GPT::load_fp8_state past the cases of tests/fp8/fp8_linear_test.cpp: positions that do not fit an int,
// a missing or renamed layer, and values beyond f32 (whose conversion would be undefined) are refused.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "nn/gpt.h"
#include "tests/util/model_test_util.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;

namespace {
std::unique_ptr<GPT> fp8_model() {
  const ModelConfig m = test::small_model(1);
  PrecisionConfig p;
  p.compute = ComputeMode::fp8;
  p.fp8.amax_history_len = 4;
  auto g = std::make_unique<GPT>(m, Device::cpu(), DType::f32, 1, p);
  g->init(1);
  return g;
}
}  // namespace

TEST_CASE("fp8 state: out-of-range positions - missing layers and values past f32 are refused", "[nn][fp8][checkpoint]") {
  const std::unique_ptr<GPT> model = fp8_model();
  GPT& g = *model;
  const nlohmann::json good = g.fp8_state();
  REQUIRE(good.contains("h.0.attn.c_attn"));
  g.load_fp8_state(good);

  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> damage;
    const char* words;
  };
  const Case cases[] = {
      {"negative pos", [](auto& j) { j["h.0.attn.c_attn"]["input"]["pos"] = -1; },
       "FP8 state of h.0.attn.c_attn input: amax history position -1 is outside [0, 4)"},
      {"pos past int64", [](auto& j) { j["h.0.mlp.c_fc"]["weight"]["pos"] = 18446744073709551615ull; },
       "amax history position 18446744073709551615 is outside [0, 4)"},
      {"pos past int", [](auto& j) { j["h.0.mlp.c_fc"]["weight"]["pos"] = 4294967296ll; },
       "amax history position 4294967296 is outside [0, 4)"},
      {"missing layer", [](auto& j) { j.erase("h.0.mlp.c_proj"); }, "FP8 state has 3 layers but this model has 4"},
      {"renamed layer", [](auto& j) { j["h.9.mlp.c_proj"] = j["h.0.mlp.c_proj"]; j.erase("h.0.mlp.c_proj"); },
       "FP8 state has no entry for layer h.0.mlp.c_proj"},
      {"short history", [](auto& j) { j["h.0.attn.c_attn"]["input"]["amax_history"] = {1.0, 2.0}; },
       "has an amax history of 2 entries, the config asks for 4"},
      {"amax past f32", [](auto& j) { j["h.0.attn.c_attn"]["input"]["amax_history"][1] = 1e300; },
       "amax history entry 1e+300 is not a finite amax >= 0 (in f32 range)"},
      {"scale past f32", [](auto& j) { j["h.0.attn.c_attn"]["weight"]["scale"] = 1e300; },
       "scale 1e+300 is not a finite positive number"},
      {"scale below f32", [](auto& j) { j["h.0.attn.c_attn"]["weight"]["scale"] = 1e-300; },
       "scale 1e-300 is not a finite positive number"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    nlohmann::json bad = good;
    c.damage(bad);
    REQUIRE_THROWS_WITH(g.load_fp8_state(bad), ContainsSubstring(c.words));
    g.load_fp8_state(good);
  }
  // After every refusal the model still steps (no history index was taken from a refused file).
  g.on_optimizer_step();
}
