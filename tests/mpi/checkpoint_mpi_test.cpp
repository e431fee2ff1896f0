// Under mpirun: a ZeRO-1 checkpoint lists every rank's optimizer shard in its manifest (each rank's digest
// computed as it wrote its file), resumes bit for bit on the same ranks, and every rank refuses it when one
// rank's shard is damaged.
#include <catch2/catch_test_macros.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/crc32c.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer.h"
#include "tests/mpi/mpi_test_util.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

Config zero1_run(const fs::path& root, const std::string& name) {
  return parse_config(fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, val: {1}/data/val_*.bin}}
train: {{micro_batch: 4, max_steps: 4, eval_every: 2, eval_steps: 2, checkpoint_every: 2}}
optim: {{lr: 1.0e-2, warmup_steps: 1}}
distributed: {{zero_stage: 1, timeout_s: 120}}
)",
                                  name, root.string()),
                      name + ".yaml");
}

}  // namespace

TEST_CASE("mpi: a ZeRO-1 checkpoint's manifest lists every rank's shard - and a damaged one is refused",
          "[mpi][checkpoint]") {
  auto comm = test::mpi_comm();
  const int R = comm->size(), me = comm->rank();
  const fs::path root = test::job_root("ckpt");
  if (me == 0) {
    fs::remove_all(root);
    fs::create_directories(root / "data");
    for (const char* f : {"train_000000.bin", "val_000000.bin"}) {
      std::vector<uint16_t> toks(8000);
      for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 17) % 50);
      write_shard((root / "data" / f).string(), toks);
    }
  }
  comm->barrier();
  REQUIRE(train(zero1_run(root, "full"), *comm).steps == 4);
  const fs::path ck = root / "full" / "checkpoints" / "step_00000002";
  const nlohmann::json m = nlohmann::json::parse(slurp(ck / "manifest.json"));
  for (int r = 0; r < R; ++r) {
    const std::string name = fmt::format("optim_rank{}.bin", r), bytes = slurp(ck / name);
    INFO(name);
    REQUIRE(m.at("files").contains(name));
    CHECK(m["files"][name]["crc32c"] == fmt::format("{:08x}", crc32c(bytes.data(), bytes.size())));
  }
  CHECK(verify_checkpoint(ck, CheckpointUse::resume).empty());

  REQUIRE(train(zero1_run(root, "resumed"), *comm, ck).steps == 4);
  CHECK(slurp(root / "resumed" / "checkpoints" / "step_00000004" / "model.bin") ==
        slurp(root / "full" / "checkpoints" / "step_00000004" / "model.bin"));

  comm->barrier();
  if (me == 0) {
    std::string b = slurp(ck / fmt::format("optim_v_rank{}.bin", R - 1));
    b[100] = static_cast<char>(b[100] ^ 1);
    std::ofstream(ck / fmt::format("optim_v_rank{}.bin", R - 1), std::ios::binary | std::ios::trunc) << b;
  }
  comm->barrier();
  std::string error;
  try {
    train(zero1_run(root, "refused"), *comm, ck);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK(error.find(fmt::format("optim_v_rank{}.bin: checksum mismatch", R - 1)) != std::string::npos);
  comm->barrier();
  if (me == 0) fs::remove_all(root);
}
