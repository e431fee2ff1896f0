// A 2-rank training run for the dead-rank tests: the environment (FP8T_TEST_DIE_AT_STEP or
// FP8T_TEST_HANG_AT_STEP) makes the last rank die or stall mid-run; the survivors must end
// within distributed.timeout_s with a message, not hang. Usage: fp8t_mpi_dead_rank WORK_DIR
#include <cstdio>
#include <filesystem>
#include <random>

#include "config/config.h"
#include "data/shard.h"
#include "dist/bootstrap.h"
#include "train/trainer.h"

using namespace fp8t;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s WORK_DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const std::string yaml = fmt::format(R"(
run: {{name: dead_rank, out_dir: {0}/run, seed: 7, device: cpu}}
model: {{n_layer: 1, n_head: 2, d_model: 16, vocab_size: 64, seq_len: 16}}
data: {{train: {0}/data/train_*.bin}}
train: {{micro_batch: 2, max_steps: 1000, eval_every: 0, checkpoint_every: 0}}
distributed: {{zero_stage: 1, timeout_s: 5}}
)",
                                       root.string());
  try {
    Config cfg = parse_config(yaml, "dead_rank.yaml");
    auto comm = bootstrap(cfg);
    if (comm->rank() == 0) {
      fs::create_directories(root / "data");
      std::vector<uint16_t> toks(4096);
      std::mt19937 rng(1);
      for (auto& t : toks) t = static_cast<uint16_t>(rng() % 64);
      write_shard((root / "data" / "train_000000.bin").string(), toks);
    }
    comm->barrier();
    train(cfg, *comm);
  } catch (const Error& e) {
    std::fprintf(stderr, "fp8train: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "dead_rank: training finished although a rank was told to die\n");
  return 0;
}
