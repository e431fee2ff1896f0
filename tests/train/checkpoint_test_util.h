// Helpers for the checkpoint tests: one small CPU run with checkpoints at steps 2 and 4, copies of its
// checkpoints to damage, and the damage itself (flipped bits, resized files, edited JSON, a resealed
// manifest so a damage reaches the checks behind the checksums).
#pragma once
#include <catch2/catch_test_macros.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "config/config.h"
#include "core/crc32c.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "train/trainer.h"

namespace fp8t::test {

namespace fs = std::filesystem;

// This process's scratch directory, removed when the process exits.
inline fs::path scratch_root() {
  static const fs::path root = [] {
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / fmt::format("fp8t_ckpt_{}", ::getpid()), ec);
    });
    return fs::temp_directory_path() / fmt::format("fp8t_ckpt_{}", ::getpid());
  }();
  return root;
}

// A 2-layer GPT on a period-50 token cycle; `extra` is appended to the YAML (e.g. a precision section).
inline Config tiny_run(const std::string& name, int max_steps = 4, const std::string& extra = "") {
  const fs::path root = scratch_root();
  if (!fs::exists(root / "data" / "train_000000.bin")) {
    fs::create_directories(root / "data");
    for (const char* f : {"train_000000.bin", "val_000000.bin"}) {
      std::vector<uint16_t> toks(4000);
      for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 17) % 50);
      write_shard((root / "data" / f).string(), toks);
    }
  }
  return parse_config(fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 3, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, val: {1}/data/val_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 128, max_steps: {2}, eval_every: 2, eval_steps: 2, checkpoint_every: 2}}
optim: {{lr: 1.0e-2, warmup_steps: 1}}
{3}
)",
                                  name, root.string(), max_steps, extra),
                      name + ".yaml");
}

// The run directory of a finished 4-step run with checkpoints at steps 2 and 4 (trained once per process).
inline const fs::path& trained_run() {
  static const fs::path run = [] {
    auto comm = make_single_communicator();
    const Config cfg = tiny_run("source");
    fs::remove_all(cfg.run.out_dir);
    REQUIRE(train(cfg, *comm).steps == 4);
    return fs::path(cfg.run.out_dir);
  }();
  return run;
}

// A fresh copy of the source run's checkpoint at `step`, to damage.
inline fs::path copy_checkpoint(const std::string& name, int step = 2) {
  const fs::path dst = scratch_root() / "copies" / name;
  fs::remove_all(dst);
  fs::create_directories(dst.parent_path());
  fs::copy(trained_run() / "checkpoints" / fmt::format("step_{:08d}", step), dst);
  return dst;
}

// Checks that `message` holds each of `words` (a combined Catch2 matcher cannot be kept in a variable).
inline void check_words(const std::string& message, std::initializer_list<std::string> words) {
  INFO(message);
  for (const std::string& w : words) CHECK(message.find(w) != std::string::npos);
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
inline void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

inline nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(slurp(p)); }
inline void write_json(const fs::path& p, const nlohmann::json& j) { spit(p, j.dump(2)); }

inline void flip_bit(const fs::path& p, size_t byte, int bit) {
  std::string b = slurp(p);
  REQUIRE(byte < b.size());
  b[byte] = static_cast<char>(b[byte] ^ (1 << bit));
  spit(p, b);
}

// Recomputes every file's size and CRC32C in manifest.json: the damage then looks written that way.
inline void reseal(const fs::path& dir) {
  nlohmann::json m = read_json(dir / "manifest.json");
  for (auto& [name, d] : m["files"].items()) {
    const std::string b = slurp(dir / name);
    d["bytes"] = b.size();
    d["crc32c"] = fmt::format("{:08x}", crc32c(b.data(), b.size()));
  }
  write_json(dir / "manifest.json", m);
}

// Resumes `ckpt` in a fresh run directory (max_steps 4) and returns the error; fails the test if it resumes.
inline std::string resume_error(const fs::path& ckpt, const std::string& name, int max_steps = 4,
                                const std::string& extra = "") {
  auto comm = make_single_communicator();
  const Config cfg = tiny_run(name, max_steps, extra);
  fs::remove_all(cfg.run.out_dir);
  try {
    train(cfg, *comm, ckpt);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("resuming " << ckpt << " was accepted");
  return "";
}

}  // namespace fp8t::test
