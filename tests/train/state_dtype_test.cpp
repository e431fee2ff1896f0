// The trainer with each optim.state_dtype: a small GPT learns, resuming a checkpoint reproduces the
// uninterrupted run bit for bit, and a checkpoint resumes under another state dtype (converted).
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "config/config.h"
#include "data/shard.h"
#include "train/trainer.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

// A period-50 token cycle with rare noise (as trainer_test.cpp's stream).
void write_cycle(const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* name : {"train_000000.bin", "val_000000.bin"}) {
    std::vector<uint16_t> toks(20000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i % 97 == 3 ? i % 64 : (i * 17) % 50);
    write_shard((dir / name).string(), toks);
  }
}

Config tiny(const fs::path& root, const std::string& name, const std::string& state_dtype) {
  return parse_config(fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, val: {1}/data/val_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 128, max_steps: 40, eval_every: 20, eval_steps: 4, checkpoint_every: 20}}
optim: {{lr: 1.0e-2, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, state_dtype: {2}}}
)",
                                  name, root.string(), state_dtype),
                      name + ".yaml");
}

std::vector<char> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("train: every optim.state_dtype learns and resumes bit for bit", "[train][optim]") {
  const std::string s = GENERATE("fp32", "bf16", "fp8");
  INFO(s);
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_state_dtype_{}_{}", s, ::getpid());
  fs::remove_all(root);
  write_cycle(root / "data");
  auto comm = make_single_communicator();
  const TrainResult r = train(tiny(root, "full", s), *comm);
  CHECK(r.last_val_loss.value() < 0.75 * r.first_val_loss.value());

  fs::copy(root / "full" / "checkpoints" / "step_00000020", root / "from20");
  const TrainResult r2 = train(tiny(root, "resumed", s), *comm, root / "from20");
  CHECK(r2.steps == 40);
  const fs::path a = root / "full" / "checkpoints" / "step_00000040";
  const fs::path b = root / "resumed" / "checkpoints" / "step_00000040";
  for (const char* f : {"model.bin", "optim_rank0.bin", "optim_v_rank0.bin"}) {
    INFO(f);
    CHECK(slurp(a / f) == slurp(b / f));
  }
  if (s == "fp8") CHECK(slurp(a / "optim_mscale_rank0.bin") == slurp(b / "optim_mscale_rank0.bin"));

  // The same checkpoint under another state dtype: converted on load, and training goes on.
  const std::string other = s == "fp8" ? "fp32" : "fp8";
  const TrainResult r3 = train(tiny(root, "converted", other), *comm, root / "from20");
  CHECK(r3.steps == 40);
  CHECK(r3.last_val_loss.value() < 0.75 * r.first_val_loss.value());
  fs::remove_all(root);
}
