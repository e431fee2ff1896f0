// The FP8 GPT on the CPU emulation: selective FP8 by kind and depth, the weight cache, scale updates,
// stats and recompute, NaN/Inf naming the layer and tensor, a short training run against FP32 with a
// bit-identical resume, LayerNorm recompute, and damaged FP8 state files refused.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "config/config.h"
#include "data/shard.h"
#include "nn/gpt.h"
#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "train/trainer.h"
#include "tests/util/model_test_util.h"

using namespace fp8t;
using namespace fp8t::test;
namespace fs = std::filesystem;

namespace {

PrecisionConfig fp8_precision() {
  PrecisionConfig p;
  p.compute = ComputeMode::fp8;
  return p;
}

}  // namespace

TEST_CASE("fp8: selective FP8 picks exactly the configured kinds and blocks", "[fp8]") {
  PrecisionConfig p = fp8_precision();
  CHECK(GPT(small_model(4), Device::cpu(), DType::f32).fp8_layers().empty());  // fp32 by default
  GPT all(small_model(2), Device::cpu(), DType::f32, 1, p);
  CHECK(all.fp8_layers() == std::vector<std::string>{"h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc",
                                                     "h.0.mlp.c_proj", "h.1.attn.c_attn", "h.1.attn.c_proj",
                                                     "h.1.mlp.c_fc", "h.1.mlp.c_proj"});
  p.fp8.layers = {"qkv", "fc2", "lm_head"};
  p.fp8.bf16_first_blocks = 1;
  p.fp8.bf16_last_blocks = 1;
  GPT some(small_model(4), Device::cpu(), DType::f32, 1, p);
  const std::vector<std::string> want = {"h.1.attn.c_attn", "h.1.mlp.c_proj", "h.2.attn.c_attn", "h.2.mlp.c_proj",
                                         "lm_head"};
  REQUIRE(some.fp8_layers() == want);
  // The forward really routes those (and only those) through fp8_linear.
  some.init(1);
  loss_and_grads(some, random_tokens(2, 8, 100, 1), random_tokens(2, 8, 100, 2), false);
  for (const auto& name : want) {
    CHECK(some.fp8_state(name)->weight_casts == 1);
    CHECK(some.fp8_state(name)->input.recorded_this_step);
    CHECK(some.fp8_state(name)->grad_output.recorded_this_step);
  }
  CHECK(some.fp8_state("h.0.attn.c_attn") == nullptr);
  CHECK(some.fp8_state("h.3.mlp.c_proj") == nullptr);
  CHECK(some.fp8_state("h.1.mlp.c_fc") == nullptr);
}

TEST_CASE("fp8: GPT weight cache - scale updates - stats and recompute", "[fp8]") {
  GPT model(small_model(2), Device::cpu(), DType::f32, 1, fp8_precision());
  model.init(2);
  const Tensor x = random_tokens(2, 8, 100, 3), y = random_tokens(2, 8, 100, 4);
  const auto [l0, g0] = loss_and_grads(model, x, y, false);
  const auto [l1, g1] = loss_and_grads(model, x, y, true);  // second micro-batch, with recompute
  CHECK(std::isfinite(l0));
  CHECK(l0 == l1);  // same scales, same cached weights: recompute reproduces the forward exactly
  CHECK(g0 == g1);
  Fp8LinearState* fc = model.fp8_state("h.1.mlp.c_fc");
  REQUIRE(fc != nullptr);
  CHECK(fc->weight_casts == 1);
  // The all-reduce sees one amax per FP8 tensor (input, weight, grad_output of each layer) and writes back.
  size_t reduced = 0;
  CHECK(model.reduce_fp8_amax([&](std::vector<float>& v) {
    reduced = v.size();
    for (float& a : v) a *= 2.0f;  // as if another rank had seen twice the amax
  }).empty());
  CHECK(reduced == 3 * model.fp8_layers().size());
  const float reduced_amax = fc->input.amax_this_step;
  model.on_optimizer_step();
  CHECK(fc->weight_version == 1);
  CHECK(fc->input.last_amax == reduced_amax);
  CHECK(fc->input.scale == 448.0f / fc->input.last_amax);
  loss_and_grads(model, x, y, false);
  CHECK(fc->weight_casts == 2);
  const nlohmann::json s = model.fp8_stats(true);
  REQUIRE(s.contains("h.0.attn.c_attn"));
  CHECK(s["h.1.mlp.c_fc"]["input"]["scale"].get<float>() == fc->input.scale);
  CHECK(s["h.1.mlp.c_fc"]["grad_output"]["amax"].get<float>() > 0.0f);
  const double werr = s["h.1.mlp.c_fc"]["weight_rel_error"].get<double>();
  CHECK(werr > 0.0);
  CHECK(werr < 0.05);  // E4M3 with a fitted scale: ~2^-4/sqrt(3) rms
  CHECK_FALSE(model.fp8_stats(false)["h.1.mlp.c_fc"].contains("weight_rel_error"));
}

TEST_CASE("fp8: a non-finite amax is reported naming the layer and tensor", "[fp8]") {
  GPT model(small_model(2), Device::cpu(), DType::f32, 1, fp8_precision());
  model.init(5);
  model.params().var("h.0.attn.c_attn.weight")->value.data<float>()[7] = INFINITY;
  model.params().var("h.1.ln_2.weight")->value.data<float>()[0] = NAN;
  const auto [loss, grads] = loss_and_grads(model, random_tokens(2, 8, 100, 5), random_tokens(2, 8, 100, 6), false);
  (void)grads;
  const std::string report = model.reduce_fp8_amax();
  INFO(report);
  CHECK_THAT(report, Catch::Matchers::ContainsSubstring("h.0.attn.c_attn weight amax is inf"));
  CHECK_THAT(report, Catch::Matchers::ContainsSubstring("h.1.mlp.c_fc input amax is nan"));
  const float scale_before = model.fp8_state("h.0.attn.c_attn")->weight.scale;
  model.on_optimizer_step();
  CHECK(model.reduce_fp8_amax().empty());
  CHECK(model.fp8_state("h.0.attn.c_attn")->weight.scale == scale_before);
  CHECK(std::isfinite(model.fp8_state("h.1.mlp.c_fc")->input.scale));
  (void)loss;
}

TEST_CASE("fp8: a tiny GPT trains with compute fp8 on the CPU", "[fp8]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_fp8_train_{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root / "data");
  {  // a learnable stream: a fixed permutation cycle over 50 tokens
    std::mt19937 rng(5);
    std::vector<uint16_t> perm(50);
    for (int i = 0; i < 50; ++i) perm[i] = static_cast<uint16_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<uint16_t> toks(20000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = perm[i % 50];
    write_shard((root / "data" / "train_000000.bin").string(), toks);
    write_shard((root / "data" / "val_000000.bin").string(), toks);
  }
  const std::string yaml = fmt::format(R"(
run: {{name: fp8, out_dir: {0}/run, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {0}/data/train_*.bin, val: {0}/data/val_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 128, max_steps: 12, eval_every: 0, eval_steps: 2, checkpoint_every: 6}}
optim: {{lr: 3.0e-3, warmup_steps: 2, schedule: cosine, weight_decay: 0.1, grad_clip: 1.0}}
precision:
  compute: fp8
  fp8: {{format: hybrid, scaling: delayed, amax_history_len: 4, layers: [qkv, proj, fc, fc2, lm_head],
        monitor_every: 5}}
)",
                                       root.string());
  const Config cfg = parse_config(yaml, "fp8.yaml");
  auto comm = make_single_communicator();
  const TrainResult r = train(cfg, *comm);
  Config cfg32 = cfg;
  cfg32.precision.compute = ComputeMode::fp32;
  cfg32.run.out_dir = (root / "run32").string();
  const TrainResult r32 = train(cfg32, *comm);
  INFO("val loss fp8 " << r.first_val_loss.value() << " -> " << r.last_val_loss.value() << ", fp32 "
                       << r32.first_val_loss.value() << " -> " << r32.last_val_loss.value());
  CHECK(r.steps == 12);
  CHECK(std::isfinite(r.last_val_loss.value()));
  CHECK(r.last_val_loss.value() < 0.9 * r.first_val_loss.value());
  // FP8 tracks FP32
  CHECK(std::fabs(r.last_val_loss.value() - r32.last_val_loss.value()) < 0.05 * r32.last_val_loss.value());
  std::ifstream mf(root / "run" / "metrics.jsonl");
  std::string line;
  int with_fp8 = 0, with_error = 0;
  while (std::getline(mf, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    REQUIRE(j.contains("fp8"));
    ++with_fp8;
    CHECK(j["fp8"].contains("lm_head"));
    CHECK(j["fp8"]["h.1.mlp.c_proj"]["weight"]["scale"].get<float>() > 1.0f);
    if (j["fp8"]["h.0.attn.c_attn"].contains("weight_rel_error")) {
      ++with_error;
      CHECK(j["step"].get<int>() % 5 == 0);
      CHECK(j["fp8"]["h.0.attn.c_attn"]["weight_rel_error"].get<double>() < 0.05);
    }
  }
  CHECK(with_fp8 == 12);
  CHECK(with_error == 2);  // steps 5 and 10

  // The checkpoint keeps the scales and amax histories: resuming at step 6 ends bit-identical.
  REQUIRE(fs::exists(root / "run" / "checkpoints" / "step_00000006" / "fp8_rank0.json"));
  Config cfg2 = cfg;
  cfg2.run.out_dir = (root / "resumed").string();
  fs::create_directories(root / "resumed");
  fs::copy(root / "run" / "checkpoints" / "step_00000006", root / "from6");
  train(cfg2, *comm, root / "from6");
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(slurp(root / "resumed" / "checkpoints" / "step_00000012" / "model.bin") ==
        slurp(root / "run" / "checkpoints" / "step_00000012" / "model.bin"));
  fs::remove_all(root);
}

namespace {

// A 2-block FP8 model's loss and gradients (current scaling: no state carried between runs), then again after
// `recompute` switches a recompute mode on (it returns whether the step recomputes whole blocks): the same bits.
template <class Recompute>
void check_recompute_exact(ActivationStorage storage, uint64_t init_seed, uint32_t data_seed, Recompute recompute) {
  INFO("storage " << static_cast<int>(storage));
  PrecisionConfig p = fp8_precision();
  p.fp8.activation_storage = storage;
  p.fp8.scaling = Fp8Scaling::current;
  GPT model(small_model(2), Device::cpu(), DType::f32, 1, p);
  model.init(init_seed);
  const Tensor x = random_tokens(2, 8, 100, data_seed), y = random_tokens(2, 8, 100, data_seed + 1);
  const auto [l0, g0] = loss_and_grads(model, x, y, false);
  const bool blocks = recompute(model);
  const auto [l1, g1] = loss_and_grads(model, x, y, blocks);
  CHECK(l0 == l1);
  CHECK(g0 == g1);
}

}  // namespace

TEST_CASE("fp8: LayerNorm recompute leaves the FP8 model's gradients bit-identical", "[fp8]") {
  // bf16 storage makes the FP8 linears keep their (LayerNorm-output) inputs, so the backward
  // re-casts the recomputed values; fp8 storage keeps codes and never asks for them.
  for (ActivationStorage storage : {ActivationStorage::bf16, ActivationStorage::fp8})
    check_recompute_exact(storage, 9, 5, [](GPT& model) {
      model.set_recompute_layernorm(true);
      return false;
    });
}

TEST_CASE("fp8: block recompute gives the FP8 model's loss and gradients - storages", "[fp8]") {
  // The checkpoint's first (no-grad) forward must compute what the recorded one does: under fp8_all attention runs on
  // its input's FP8 round trip in both, so the loss it reports is the one whose gradients the step takes.
  for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::fp8_all})
    check_recompute_exact(storage, 4, 7, [](GPT&) { return true; });
}

TEST_CASE("fp8: a damaged FP8 state file is refused with the layer and field, never loaded", "[fp8]") {
  GPT model(small_model(2), Device::cpu(), DType::f32, 1, fp8_precision());
  model.init(1);
  const nlohmann::json good = model.fp8_state();
  REQUIRE_NOTHROW(model.load_fp8_state(good));
  const std::string layer = "h.1.mlp.c_fc";
  struct Case {
    std::function<void(nlohmann::json&)> damage;
    const char* words;
  };
  const Case cases[] = {
      {[&](nlohmann::json& j) { j[layer]["weight"]["pos"] = 16; }, "position 16 is outside [0, 16)"},
      {[&](nlohmann::json& j) { j[layer]["weight"]["pos"] = -1; }, "position -1 is outside"},
      {[&](nlohmann::json& j) { j[layer]["input"]["pos"] = 2.5; }, "position 2.5 is outside"},
      {[&](nlohmann::json& j) { j[layer]["grad_output"].erase("pos"); }, "has no 'pos'"},
      {[&](nlohmann::json& j) { j[layer].erase("weight"); }, "has no 'weight' entry"},
      {[&](nlohmann::json& j) { j[layer]["input"]["scale"] = 0.0; }, "is not a finite positive number"},
      {[&](nlohmann::json& j) { j[layer]["input"]["scale"] = "big"; }, "is not a finite positive number"},
      {[&](nlohmann::json& j) { j[layer]["input"]["amax_history"][3] = -2.0; }, "not a finite amax"},
      {[&](nlohmann::json& j) { j[layer]["input"]["amax_history"] = 7; }, "amax history of 0 entries"},
      {[&](nlohmann::json& j) { j[layer] = 3; }, "no entry for layer h.1.mlp.c_fc"},
      {[&](nlohmann::json& j) { j = nlohmann::json::array(); }, "not a JSON object"},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = good;
    c.damage(bad);
    INFO(bad.dump().substr(0, 200));
    CHECK_THROWS_WITH(model.load_fp8_state(bad), Catch::Matchers::ContainsSubstring(c.words));
  }
}
