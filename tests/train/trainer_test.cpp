// End-to-end trainer on synthetic shards: loss falls, every validation set is reported, the run
// directory is complete, resume reproduces an uninterrupted run bit for bit (shuffled, across epochs),
// and a failing run leaves earlier checkpoints intact.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "config/config.h"
#include "data/shard.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {
// A learnable stream: a fixed random permutation cycle over 50 tokens, with rare noise. The train
// split is two shards of 23 groups of 4x16 tokens, so 60 steps of 2 micro-batches run 2.6 epochs.
// held_* follows another permutation: a validation set the model cannot learn from the train split.
void write_synthetic(const fs::path& dir) {
  fs::create_directories(dir);
  std::mt19937 rng(5);
  std::vector<uint16_t> perm(50);
  for (int i = 0; i < 50; ++i) perm[i] = static_cast<uint16_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint16_t> other = perm;
  std::shuffle(other.begin(), other.end(), rng);
  auto write = [&](const char* name, size_t n, const std::vector<uint16_t>& cycle) {
    std::vector<uint16_t> toks(n);
    for (size_t i = 0; i < toks.size(); ++i)
      toks[i] = rng() % 97 == 0 ? static_cast<uint16_t>(rng() % 64) : cycle[i % 50];
    write_shard((dir / name).string(), toks);
  };
  write("train_000000.bin", 1500, perm);
  write("train_000001.bin", 1500, perm);
  write("val_000000.bin", 20000, perm);
  write("held_000000.bin", 20000, other);
}

Config tiny_config(const fs::path& root, const std::string& name) {
  const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, val: {{val: {1}/data/val_*.bin, held: {1}/data/held_*.bin}}}}
train: {{micro_batch: 4, total_batch_tokens: 128, max_steps: 60, eval_every: 30, eval_steps: 4, checkpoint_every: 30}}
optim: {{lr: 1.0e-2, warmup_steps: 2, schedule: cosine, weight_decay: 0.1, grad_clip: 1.0}}
)",
                                       name, root.string());
  return parse_config(yaml, name + ".yaml");
}

std::vector<char> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
}  // namespace

TEST_CASE("train: a small GPT learns - writes its run directory and resumes exactly", "[train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_trainer_{}", ::getpid());
  fs::remove_all(root);
  write_synthetic(root / "data");
  auto comm = make_single_communicator();

  const Config cfg = tiny_config(root, "full");
  const TrainResult r = train(cfg, *comm);
  CHECK(r.steps == 60);
  CHECK(r.first_val_loss.value() > 4.0);                             // about ln(64)
  CHECK(r.last_val_loss.value() < 0.75 * r.first_val_loss.value());  // learned the cycle's structure
  REQUIRE(r.last_val_losses.size() == 2);
  CHECK(r.last_val_losses.at("val") == r.last_val_loss.value());
  CHECK(r.last_val_losses.at("held") > r.last_val_loss.value() + 1.0);  // another cycle: not learned

  const fs::path run = root / "full";
  CHECK(fs::exists(run / "config.yaml"));
  CHECK(fs::exists(run / "log.txt"));
  const Config reread = load_config((run / "config.yaml").string());
  CHECK(reread.to_yaml() == cfg.to_yaml());
  std::ifstream mf(run / "metrics.jsonl");
  std::string line;
  int steps = 0, evals = 0;
  while (std::getline(mf, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) {
      ++evals;
      REQUIRE(j["val"].size() == 2);
      CHECK(j["val"]["val"] == j["val_loss"]);
      CHECK(j["val"]["held"].get<double>() != j["val_loss"].get<double>());
    }
    if (!j.contains("loss")) continue;
    ++steps;
    for (const char* k : {"step", "tokens", "loss", "lr", "grad_norm", "step_ms", "queue_ms", "wait_ms",
                          "tokens_per_s", "memory"})
      REQUIRE(j.contains(k));
    // The host's split of the step: queueing, then waiting at the loss read, both inside the step.
    const double queue = j["queue_ms"], wait = j["wait_ms"], step = j["step_ms"];
    CHECK(queue > 0.0);
    CHECK(wait >= 0.0);
    CHECK(queue + wait <= step);
    CHECK(j["memory"]["current"]["parameters"].get<int64_t>() > 0);
    CHECK(j["memory"]["current"]["optimizer"].get<int64_t>() > 0);
  }
  CHECK(steps == 60);
  CHECK(evals == 3);  // before the first step, at 30, at 60
  REQUIRE(latest_checkpoint(run) == run / "checkpoints" / "step_00000060");
  const std::string log(slurp(run / "log.txt").data(), slurp(run / "log.txt").size());
  CHECK_THAT(log, Catch::Matchers::ContainsSubstring("| val_loss ") && Catch::Matchers::ContainsSubstring(" | held "));

  // Resume from step 30 (the shuffled loader is in its second epoch) in a fresh directory: the
  // final weights must equal the full run's.
  const Config cfg2 = tiny_config(root, "resumed");
  fs::create_directories(root / "resumed");
  fs::copy(run / "checkpoints" / "step_00000030", root / "from30");
  const TrainResult r2 = train(cfg2, *comm, root / "from30");
  CHECK(r2.steps == 60);
  CHECK(slurp(root / "resumed" / "checkpoints" / "step_00000060" / "model.bin") ==
        slurp(run / "checkpoints" / "step_00000060" / "model.bin"));

  // A run that blows up names the problem and leaves the earlier checkpoints untouched.
  Config bad = tiny_config(root, "full");
  bad.optim.lr = 1e30;
  bad.optim.grad_clip = 0;
  bad.train.max_steps = 80;
  const auto before = slurp(run / "checkpoints" / "step_00000060" / "model.bin");
  REQUIRE_THROWS_WITH(train(bad, *comm, run), Catch::Matchers::ContainsSubstring("non-finite") &&
                                                   Catch::Matchers::ContainsSubstring("skip_nonfinite_steps"));
  CHECK(slurp(run / "checkpoints" / "step_00000060" / "model.bin") == before);
  CHECK(latest_checkpoint(run) == run / "checkpoints" / "step_00000060");
  fs::remove_all(root);
}

TEST_CASE("train: checkpoint_every -1 writes no checkpoint at all", "[train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_trainer_nockpt_{}", ::getpid());
  fs::remove_all(root);
  write_synthetic(root / "data");
  auto comm = make_single_communicator();
  Config cfg = tiny_config(root, "nockpt");
  cfg.train.max_steps = 3;
  cfg.train.checkpoint_every = -1;
  CHECK(train(cfg, *comm).steps == 3);
  CHECK(fs::exists(root / "nockpt" / "metrics.jsonl"));
  CHECK_FALSE(fs::exists(root / "nockpt" / "checkpoints" / "step_00000003"));
  cfg.train.checkpoint_every = 0;  // only the last step
  cfg.run.out_dir = (root / "final").string();
  CHECK(train(cfg, *comm).steps == 3);
  CHECK(fs::exists(root / "final" / "checkpoints" / "step_00000003"));
  fs::remove_all(root);
}

TEST_CASE("train: data.shuffle false keeps the file order - true shuffles from run.seed", "[train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_trainer_shuffle_{}", ::getpid());
  fs::remove_all(root);
  write_synthetic(root / "data");
  auto comm = make_single_communicator();
  auto first_loss = [&](bool shuffle, uint64_t seed) {
    Config cfg = tiny_config(root, "shuffle");
    cfg.train.max_steps = 1;
    cfg.train.checkpoint_every = -1;
    cfg.data.shuffle = shuffle;
    cfg.run.seed = seed;
    return train(cfg, *comm).last_train_loss.value();
  };
  CHECK(first_loss(false, 7) == first_loss(false, 7));
  CHECK(first_loss(true, 7) == first_loss(true, 7));
  CHECK(first_loss(true, 7) != first_loss(false, 7));  // same init, other batch
  CHECK(first_loss(true, 0) != first_loss(false, 0));  // seed 0 shuffles too
  fs::remove_all(root);
}
