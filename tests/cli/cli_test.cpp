// The fp8train binary: bad input fails with a message naming the key/line or file, exit code != 0.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {
struct Result {
  int code;
  std::string out;
};
Result run(const std::string& args) {
  const std::string cmd = std::string(FP8T_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WEXITSTATUS(status), out};
}
fs::path scratch() {
  const fs::path d = fs::temp_directory_path() / ("fp8t_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST_CASE("cli: an unknown config key fails naming the file - line and key", "[cli]") {
  const fs::path d = scratch();
  std::ofstream(d / "bad.yaml") << "run: {device: cpu}\ntrain:\n  micro_batch: 2\n  learning_rate: 3\n";
  const Result r = run("train --config " + (d / "bad.yaml").string());
  CHECK(r.code != 0);
  CHECK_THAT(r.out, ContainsSubstring("bad.yaml") && ContainsSubstring("line 4") &&
                        ContainsSubstring("learning_rate"));
}

TEST_CASE("cli: a --set of an unknown key fails naming it", "[cli]") {
  const Result r = run("train --config configs/tiny-cpu.yaml --set optim.lrr=1");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, ContainsSubstring("optim.lrr"));
}

TEST_CASE("cli: a truncated shard fails naming the file", "[cli]") {
  const fs::path d = scratch();
  {
    std::ofstream f(d / "train_000000.bin", std::ios::binary);
    int32_t header[256] = {20240520, 1, 1000};
    f.write(reinterpret_cast<const char*>(header), sizeof header);
    std::vector<uint16_t> toks(10, 1);  // 1000 promised, 10 present
    f.write(reinterpret_cast<const char*>(toks.data()), 20);
  }
  const Result r = run("train --config configs/tiny-cpu.yaml --set data.train=" + (d / "train_*.bin").string() +
                       " --set 'data.val=\"\"' --set run.out_dir=" + (d / "run").string());
  CHECK(r.code != 0);
  CHECK_THAT(r.out, ContainsSubstring((d / "train_000000.bin").string()));
  fs::remove_all(d);
}
