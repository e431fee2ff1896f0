// train.cuda_graph: a run whose micro-steps replay CUDA graphs is the eager run, with gradient accumulation (both
// graphs), in BF16 compute and in the FP8 recipes whose host state a replay must redo (delayed scaling's amaxes,
// the weight casts).
// The GPU backward is not bit-reproducible run to run (f32 atomics in the embedding, LayerNorm and attention
// gradients and the gradient norm), so the runs keep their weights (lr 1e-30, no weight decay, no clipping): the
// forward passes, whose inputs are then the same, must agree bit for bit (losses, validation losses, and with
// delayed scaling from the most recent amax every FP8 input's amax and scale, which a replay that failed to
// collect one would change); the gradient norms to within the atomics' rounding.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "config/config.h"
#include "data/shard.h"
#include "train/trainer.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

void write_tokens(const fs::path& dir) {
  fs::create_directories(dir);
  std::mt19937 rng(11);
  for (const char* name : {"train_000000.bin", "val_000000.bin"}) {
    std::vector<uint16_t> toks(40000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7 + rng() % 5) % 200);
    write_shard((dir / name).string(), toks);
  }
}

struct StepLine {
  double loss, grad_norm, peak;
  nlohmann::json fp8;
};

std::vector<StepLine> steps_of(const fs::path& metrics) {
  std::vector<StepLine> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("grad_norm")) continue;
    out.push_back({j["loss"].get<double>(), j["grad_norm"].get<double>(), j["memory"]["total_peak"].get<double>(),
                   j.value("fp8", nlohmann::json::object())});
  }
  return out;
}

}  // namespace

TEST_CASE("train.cuda_graph replays the eager step bit for bit", "[gpu][train][cuda_graph]") {
  const auto [label, precision] = GENERATE(table<const char*, const char*>({
      {"bf16", "{compute: bf16}"},
      {"fp8 delayed", "{compute: fp8, fp8: {scaling: delayed, amax_compute_algo: most_recent, activation_storage: fp8}}"},
      {"fp8_all delayed, FP8 head",
       "{compute: fp8, fp8: {scaling: delayed, amax_compute_algo: most_recent, activation_storage: fp8_all, "
       "layers: [qkv, proj, fc, fc2, lm_head]}}"},
      {"fp8 current", "{compute: fp8, fp8: {scaling: current, activation_storage: fp8}}"},
  }));
  INFO(label);
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_graph_{}", ::getpid());
  fs::remove_all(root);
  write_tokens(root / "data");
  auto comm = make_single_communicator();
  auto run = [&](bool graph) {
    const std::string name = graph ? "graph" : "eager";
    const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 3, device: cuda, log_every: 1}}
model: {{n_layer: 2, n_head: 2, d_model: 128, vocab_size: 200, seq_len: 64}}
data: {{train: {1}/data/train_*.bin, val: {1}/data/val_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 768, max_steps: 7, eval_every: 4, eval_steps: 2, checkpoint_every: -1,
         cuda_graph: {2}}}
optim: {{lr: 1.0e-30, weight_decay: 0, grad_clip: 0}}
precision: {3}
)",
                                         name, root.string(), graph ? "true" : "false", precision);
    const TrainResult r = train(parse_config(yaml, name + ".yaml"), *comm);
    return std::make_pair(r, steps_of(root / name / "metrics.jsonl"));
  };
  const auto [eager, eager_steps] = run(false);
  const auto [graph, graph_steps] = run(true);
  REQUIRE(eager_steps.size() == 7);
  REQUIRE(graph_steps.size() == 7);
  for (size_t i = 0; i < eager_steps.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(graph_steps[i].loss == eager_steps[i].loss);
    CHECK(std::abs(graph_steps[i].grad_norm - eager_steps[i].grad_norm) <= 1e-4 * eager_steps[i].grad_norm);
    CHECK(graph_steps[i].fp8.size() == eager_steps[i].fp8.size());
    for (const auto& [layer, stats] : eager_steps[i].fp8.items()) {
      INFO(layer);
      REQUIRE(graph_steps[i].fp8.contains(layer));
      CHECK(graph_steps[i].fp8[layer]["input"] == stats["input"]);
      // The weight's codes, amax and scale are the same. After an evaluation (which casts the updated weight),
      // eager training keeps that cast while the graph casts again: its saturation count is counted twice.
      const auto& w = graph_steps[i].fp8[layer]["weight"];
      CHECK(w["amax"] == stats["weight"]["amax"]);
      CHECK(w["scale"] == stats["weight"]["scale"]);
      CHECK(w["saturated"].get<int64_t>() >= stats["weight"]["saturated"].get<int64_t>());
      CHECK(w["saturated"].get<int64_t>() <= 2 * stats["weight"]["saturated"].get<int64_t>());
    }
    // A replay allocates nothing, but reports the memory its step held (the capture's peak).
    CHECK(graph_steps[i].peak >= 0.9 * eager_steps[i].peak);
  }
  CHECK(graph.last_val_loss.value() == eager.last_val_loss.value());
  CHECK(std::isfinite(eager.last_val_loss.value()));
  fs::remove_all(root);
}
