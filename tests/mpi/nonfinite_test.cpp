// Under mpirun: a blown-up step is located on every rank (each re-runs its own micro-batches, ZeRO-2's
// staged gradients untouched), skipping goes on in step on every rank and stops at the same step.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "train/trainer.h"
#include "tests/mpi/mpi_test_util.h"

using namespace fp8t;
namespace fs = std::filesystem;

TEST_CASE("mpi: skipping non-finite steps at ZeRO stages 0 and 2 names the first op on every rank",
          "[mpi][nonfinite]") {
  auto comm = test::mpi_comm();
  const int R = comm->size(), me = comm->rank();
  const fs::path root = test::job_root("nonfinite");
  if (me == 0) {
    fs::remove_all(root);
    fs::create_directories(root / "data");
    std::vector<uint16_t> toks(20000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i * 7 % 50);
    write_shard((root / "data" / "train_000000.bin").string(), toks);
  }
  comm->barrier();
  for (const int stage : {0, 2}) {
    // lr 1e30: step 1 trains, then every step overflows in block 0's qkv linear; the third skip stops.
    const std::string name = fmt::format("stage{}", stage);
    const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: {3}, max_steps: 10, checkpoint_every: 0, skip_nonfinite_steps: true,
        max_skipped_steps: 3}}
optim: {{lr: 1.0e30, warmup_steps: 2, grad_clip: 0}}
distributed: {{zero_stage: {2}, bucket_mb: 0.01, timeout_s: 120}}
)",
                                         name, root.string(), stage, 128 * R);
    std::string what;
    try {
      train(parse_config(yaml, name + ".yaml"), *comm);
    } catch (const Error& e) {
      what = e.what();
    }
    INFO("rank " << me << ", stage " << stage);
    CHECK_THAT(what, Catch::Matchers::StartsWith("step 4: non-finite loss ("));
    CHECK_THAT(what, Catch::Matchers::ContainsSubstring(fmt::format(
                         "; skipped steps in a row: 3 (steps 2 to 4), the limit (train.max_skipped_steps): stopping. "
                         "Re-running step 2 with every op checked on rank {}: first non-finite value in the forward "
                         "pass of micro-batch 1 of 2, in block 0: the output of h.0.attn.c_attn (linear), shape "
                         "[4, 16, 96]",
                         me)));
    comm->barrier();
  }
  if (me == 0) fs::remove_all(root);
}
