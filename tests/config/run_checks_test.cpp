// check_run_inputs: data globs, the run directory and host memory, each refusal naming the key, its
// line and the path; a data.val that reads training shards is a warning naming both globs.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "config/config.h"
#include "core/allocator.h"
#include "core/check.h"
#include "data/shard.h"

using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

struct RunDir {
  fs::path path = fs::temp_directory_path() / ("fp8t_run_checks_" + std::to_string(::getpid()));
  RunDir() {
    fs::create_directories(path / "data");
    for (const char* name : {"train_000000.bin", "train_000001.bin", "val_000000.bin"})
      fp8t::write_shard((path / "data" / name).string(), std::vector<uint16_t>(64, 1));
    std::ofstream(path / "a_file") << "x";
  }
  ~RunDir() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }

  // A small valid config; `extra` lines and overrides change it.
  fp8t::Config config(const std::string& extra = "", const std::vector<std::string>& sets = {}) const {
    const std::string text = "model: {n_layer: 1, n_head: 1, d_model: 8, vocab_size: 100, seq_len: 4}\n"
                             "run:\n  out_dir: " + (*this / "out") + "\n"
                             "data:\n  train: " + (*this / "data/train_*.bin") + "\n" + extra;
    return fp8t::parse_config(text, "run.yaml", sets);
  }
};

std::string error_of(const fp8t::Config& c) {
  try {
    fp8t::check_run_inputs(c);
  } catch (const fp8t::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("run checks: a valid run passes and gets its directory", "[config][run_checks]") {
  RunDir d;
  const fp8t::Config c = d.config("  val: " + (d / "data/val_*.bin") + "\n");
  CHECK(fp8t::check_run_inputs(c).empty());
  CHECK(fs::is_directory(d / "out"));
  CHECK(fs::is_empty(d / "out"));  // the write probe is gone
  // Nested and already-existing directories are fine too.
  CHECK_NOTHROW(fp8t::check_run_inputs(d.config("", {"run.out_dir=" + (d / "deep/er/run")})));
  CHECK_NOTHROW(fp8t::check_run_inputs(c));
}

TEST_CASE("run checks: data globs name their key and line", "[config][run_checks]") {
  RunDir d;
  struct Case {
    fp8t::Config cfg;
    std::vector<std::string> words;
  };
  const Case cases[] = {
      {d.config("", {"data.train="}), {"run.yaml: --set data.train=: data.train: not set", "configs/tiny-cpu.yaml"}},
      {d.config("", {"data.train=" + (d / "nope/*.bin")}), {"data.train: no files match", "nope/*.bin"}},
      {d.config("  val: " + (d / "data/nothing_*.bin") + "\n"), {"run.yaml, line 6: data.val: no files match"}},
      {d.config("  val: {held: " + (d / "data/val_*.bin") + ", sotu: " + (d / "data/sotu_*.bin") + "}\n"),
       {"run.yaml, line 6: data.val.sotu: no files match", "sotu_*.bin"}},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.cfg);
    INFO(msg);
    REQUIRE_FALSE(msg.empty());
    for (const auto& w : c.words) CHECK_THAT(msg, ContainsSubstring(w));
  }
}

TEST_CASE("run checks: an unusable run.out_dir names the key and the path", "[config][run_checks]") {
  RunDir d;
  struct Case {
    std::string dir;
    std::vector<std::string> words;
  };
  std::vector<Case> cases = {
      {d / "a_file", {"it is a file, not a directory"}},
      {d / "a_file/run", {"'" + (d / "a_file") + "' is a file"}},
      {d / "a_file/x/y/z", {"'" + (d / "a_file") + "' is a file"}},
      {"", {"is empty", "runs/"}},
  };
  if (fs::is_directory("/proc/self")) cases.push_back({"/proc/self", {"not writable"}});  // even for root
  if (fs::is_directory("/proc")) cases.push_back({"/proc/fp8t_no_such_dir", {"creating it failed"}});
  for (const Case& c : cases) {
    INFO(c.dir);
    const std::string msg = error_of(d.config("", {"run.out_dir=" + c.dir}));
    INFO(msg);
    REQUIRE_FALSE(msg.empty());
    CHECK_THAT(msg, ContainsSubstring("run.yaml: --set run.out_dir=" + c.dir + ": run.out_dir"));
    CHECK_THAT(msg, ContainsSubstring("choose another run.out_dir") || ContainsSubstring("give the run"));
    for (const auto& w : c.words) CHECK_THAT(msg, ContainsSubstring(w));
  }
  // From the file, the line is named.
  const std::string text = "data: {train: " + (d / "data/train_*.bin") + "}\nrun:\n  out_dir: " + (d / "a_file") + "\n";
  CHECK_THAT(error_of(fp8t::parse_config(text, "run.yaml")), ContainsSubstring("run.yaml, line 3: run.out_dir"));
}

TEST_CASE("run checks: data.val that reads training shards is a warning naming both globs",
          "[config][run_checks]") {
  RunDir d;
  const std::string train = d / "data/train_*.bin";
  std::vector<std::string> w = fp8t::check_run_inputs(d.config("  val: " + train + "\n"));
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], ContainsSubstring("data.val '" + train + "' and data.train '" + train + "'") &&
                       ContainsSubstring("are the same glob") && ContainsSubstring("line 6"));
  // A different glob over the same file: still a warning, named by the set's key.
  w = fp8t::check_run_inputs(
      d.config("  val: {in_dist: " + (d / "data/val_*.bin") + ", leak: " + (d / "data/train_000001.bin") + "}\n"));
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], ContainsSubstring("data.val.leak") && ContainsSubstring("match the same files") &&
                       ContainsSubstring("train_000001.bin") && ContainsSubstring(train));
  // A path spelled differently still names the same file.
  w = fp8t::check_run_inputs(d.config("  val: " + (d / "data/../data/train_000000.bin") + "\n"));
  CHECK(w.size() == 1);
  CHECK(fp8t::check_run_inputs(d.config("  val: " + (d / "data/val_*.bin") + "\n")).empty());
}

TEST_CASE("run checks: a CPU model larger than host memory is refused before it is built",
          "[config][run_checks]") {
  RunDir d;
  // 50000 blocks of d_model 1024: 6.3e11 parameters, about 10 TB of CPU state.
  const std::string msg = error_of(d.config("", {"model={n_layer: 50000, n_head: 8, d_model: 1024}"}));
  CHECK_THAT(msg, ContainsSubstring("run.yaml: model: a CPU run") && ContainsSubstring("GiB of host memory") &&
                      ContainsSubstring("lower model.n_layer"));
  CHECK_FALSE(fs::exists(d / "out"));  // refused before the run directory was made
}

TEST_CASE("run checks: a CUDA run.device without a usable CUDA device names the key and what to do",
          "[config][run_checks]") {
  RunDir d;
  CHECK(error_of(d.config()).empty());  // run.device cpu: no device needed
  const fp8t::Config c = d.config("", {"run.device=cuda", "precision.compute=bf16"});
  if (fp8t::cuda_unavailable_reason().empty())
    SKIP("this machine has a usable CUDA device: the refusal needs one without");
  const std::string e = error_of(c);
  CHECK_THAT(e, ContainsSubstring("run.yaml") && ContainsSubstring("run.device") && ContainsSubstring("cuda:0"));
  CHECK_THAT(e, ContainsSubstring("run.device: cpu"));
#ifdef FP8T_HAVE_CUDA
  CHECK_THAT(e, ContainsSubstring("--gpus-per-node"));
#endif
  CHECK_THROWS_WITH(fp8t::check_device(c), ContainsSubstring("run.device"));
  // Code that reaches the CUDA allocator without those checks gets the same reason and advice, not a CUDA error.
  CHECK_THROWS_WITH(fp8t::allocator_for(fp8t::Device::cuda(0)),
                    ContainsSubstring("cuda:0 requested, but") && ContainsSubstring("run.device: cpu"));
}

TEST_CASE("run checks: precision.compute fp32 on a CUDA device names the key, with or without a GPU",
          "[config][run_checks]") {
  // The CUDA kernels take bf16 activations: f32 compute is the CPU's. The config's own defect is named before the
  // device's availability, so this holds on any machine.
  RunDir d;
  const fp8t::Config c = d.config("", {"run.device=cuda", "precision.compute=fp32"});
  const std::string e = error_of(c);
  CHECK_THAT(e, ContainsSubstring("run.yaml") && ContainsSubstring("precision.compute") && ContainsSubstring("fp32") &&
                    ContainsSubstring("bf16") && ContainsSubstring("run.device to cpu"));
  CHECK_THROWS_WITH(fp8t::check_device(c), ContainsSubstring("precision.compute"));
  CHECK(error_of(d.config("", {"precision.compute=fp32"})).empty());  // the CPU computes in f32
}
