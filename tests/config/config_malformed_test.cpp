// Malformed configs, table-driven: each is refused, and its message names the file, the line (or the
// --set) and the key, and says what is wrong. Also the bounds that keep derived sizes inside 64 bits.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "config/config.h"
#include "core/check.h"
#include "nn/gpt.h"

using Catch::Matchers::ContainsSubstring;
using fp8t::parse_config;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string text;
  std::vector<std::string> sets;  // --set overrides
  std::string where;              // "line 3:" or the start of "--set ...:"
  std::string key;
  std::vector<std::string> words;  // more of the message
};

void check_case(const Case& c) {
  std::string sets;
  for (const auto& s : c.sets) sets += " --set " + s;
  INFO("config:\n" << c.text << sets);
  std::string msg;
  try {
    parse_config(c.text, "cfg.yaml", c.sets);
  } catch (const fp8t::Error& e) {
    msg = e.what();
  }
  INFO("message: " << msg);
  REQUIRE_FALSE(msg.empty());
  CHECK_THAT(msg, ContainsSubstring("cfg.yaml"));
  CHECK_THAT(msg, ContainsSubstring(c.where));
  CHECK_THAT(msg, ContainsSubstring(c.key));
  for (const auto& w : c.words) CHECK_THAT(msg, ContainsSubstring(w));
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

TEST_CASE("config malformed: second documents and keys given twice give the line", "[config][malformed]") {
  const Case cases[] = {
      {"model: {n_layer: 2}\n---\nmodel: {n_layer: 3}\n", {}, "line 3:", "config",
       {"second YAML document", "line 1", "one document"}},
      {"run: {name: a}\n---\ntrain: {max_steps: 2}\n---\n", {}, "line 3:", "config", {"second YAML document"}},
      {"---\nmodel: {n_layer: 2}\n---\n# more\noptim: {lr: 0.1}\n", {}, "line 5:", "config",
       {"second YAML document", "line 2"}},
      {"model: {n_layer: 2}\ntrain: {max_steps: 3}\nmodel: {n_head: 2}\n", {}, "line 3:", "model",
       {"section given twice", "line 1", "merge"}},
      {"precision:\n  fp8: {margin: 1}\n  fp8: {margin: 2}\n", {}, "line 3:", "precision.fp8",
       {"section given twice", "line 2"}},
      {"train:\ntrain:\n", {}, "line 2:", "train", {"section given twice"}},
      {"train:\n  max_steps: 1\n  eval_steps: 2\n  max_steps: 2\n", {}, "line 4:", "train.max_steps",
       {"duplicate key", "line 2"}},
      {"model: {n_layer: 2}\nmodel.n_layer: 3\n", {}, "line 2:", "model.n_layer", {"duplicate key", "line 1"}},
      {"optim: {lr: 0.1, lr: 0.2}\n", {}, "line 1:", "optim.lr", {"duplicate key"}},
      {"", {"model={n_layer: 1, n_layer: 2}"}, "--set model={n_layer: 1, n_layer: 2}:", "model.n_layer",
       {"duplicate key"}},
  };
  for (const Case& c : cases) check_case(c);
  // A trailing '---' (an empty second document) loses nothing and is accepted.
  CHECK(parse_config("model: {n_layer: 2}\n---\n", "x").model.n_layer == 2);
  CHECK(parse_config("---\nmodel: {n_layer: 2}\n...\n", "x").model.n_layer == 2);
}

TEST_CASE("config malformed: sizes that would overflow are refused with the keys", "[config][malformed]") {
  const Case cases[] = {
      // 2^42 tokens per step of 1024-token micro-batches: 2^32 micro-steps (SIGSEGV before).
      {"train: {total_batch_tokens: 4398046511104}\nmodel: {seq_len: 128}\n", {}, "line 1:",
       "train.total_batch_tokens", {"micro-batches", "2^20"}},
      // The nearest multiple must not overflow past INT64_MAX (signed overflow before).
      {"train: {micro_batch: 8, total_batch_tokens: 9223372036854775807}\nmodel: {seq_len: 128}\n", {},
       "line 1:", "train.total_batch_tokens", {"nearest valid value: 9223372036854774784"}},
      {"train: {micro_batch: 1, total_batch_tokens: 9223372036854775807}\nmodel: {seq_len: 1}\n", {},
       "line 1:", "train.total_batch_tokens", {"micro-batches"}},
      {"model: {seq_len: 1024}\ntrain:\n  total_batch_tokens: 1048576\n  max_steps: 2147483647\n", {},
       "line 4:", "train.max_steps", {"2^50"}},
      {"model: {n_layer: 4}\nprecision:\n  fp8: {bf16_first_blocks: 99}\n", {}, "line 3:",
       "precision.fp8.bf16_first_blocks", {"n_layer = 4", "99 + 0"}},
      {"model: {n_layer: 4}\nprecision:\n  fp8:\n    bf16_last_blocks: 5\n", {}, "line 4:",
       "precision.fp8.bf16_last_blocks", {"n_layer = 4"}},
      {"model: {n_layer: 4}\nprecision:\n  fp8: {bf16_first_blocks: 3, bf16_last_blocks: 2}\n", {}, "line 3:",
       "precision.fp8.bf16_first_blocks", {"3 + 2 = 5"}},
      {"precision: {fp8: {bf16_first_blocks: 2}}\n", {"model.n_layer=1"}, "line 1:",
       "precision.fp8.bf16_first_blocks", {"n_layer = 1"}},
      {"model:\n  vocab_size: 2147483647\n", {}, "line 2:", "model.vocab_size", {"[1, 2147483520]"}},
      {"model:\n  vocab_size: 2147483520\n", {}, "line 2:", "model.vocab_size", {"wte", "2^40"}},
      {"model:\n  d_model: 1048576\n  n_head: 1\n", {}, "line 2:", "model.d_model", {"mlp.c_fc.weight"}},
      {"model:\n  n_head: 2147483647\n", {}, "line 2:", "model.n_head", {"divisible by n_head = 2147483647"}},
      {"model: {n_head: 1048576, d_model: 1048576}\n", {}, "line 1:", "model.d_model", {"2^40"}},
      {"model:\n  n_layer: 2147483647\n", {}, "line 2:", "model.n_layer", {"parameters", "2^40"}},
      {"model: {n_layer: 10000000, d_model: 4096, n_head: 32}\n", {}, "line 1:", "model.n_layer",
       {"parameters"}},
      {"model:\n  seq_len: 2147483647\n", {}, "line 2:", "model.seq_len", {"wpe"}},
      {"model: {seq_len: 2}\ntrain:\n  micro_batch: 2147483647\n", {}, "line 3:", "train.micro_batch",
       {"tokens per micro-batch", "2^31 - 1"}},
      {"model: {seq_len: 1024}\ntrain:\n  micro_batch: 65536\n", {}, "line 3:", "train.micro_batch",
       {"activations", "model.vocab_size"}},
      {"train:\n  micro_batch: 2147483648\n", {}, "line 2:", "train.micro_batch", {"32-bit"}},
      {"model:\n  n_head: -3\n", {}, "line 2:", "model.n_head", {">= 1"}},
      {"precision:\n  fp8:\n    amax_history_len: 100000000\n", {}, "line 3:",
       "precision.fp8.amax_history_len", {"[1, 65536]"}},
      {"precision:\n  fp8:\n    margin: 1000\n", {}, "line 3:", "precision.fp8.margin", {"[0, 64]"}},
      {"distributed:\n  bucket_mb: 1e30\n", {}, "line 2:", "distributed.bucket_mb", {"(0, 4096]"}},
      {"distributed:\n  timeout_s: 1e300\n", {}, "line 2:", "distributed.timeout_s", {"(0, 2592000]"}},
      {"distributed:\n  timeout_s: .inf\n", {}, "line 2:", "distributed.timeout_s", {"expected a number"}},
      {"optim:\n  lr: .nan\n", {}, "line 2:", "optim.lr", {"expected a number"}},
      {"run:\n  seed: 18446744073709551616\n", {}, "line 2:", "run.seed", {"non-negative integer"}},
      {"", {"train.total_batch_tokens=4398046511104"}, "--set train.total_batch_tokens=4398046511104:",
       "train.total_batch_tokens", {"micro-batches"}},
  };
  for (const Case& c : cases) check_case(c);
  // The bounds leave real runs alone: GPT-2 XL at 1M tokens per step for 100k steps, a 256k
  // vocabulary at T = 8192.
  CHECK_NOTHROW(parse_config("model: {n_layer: 48, n_head: 25, d_model: 1600, seq_len: 1024}\n"
                             "train: {micro_batch: 16, total_batch_tokens: 1048576, max_steps: 100000}\n",
                             "x"));
  CHECK_NOTHROW(parse_config("model: {vocab_size: 256000, seq_len: 8192, d_model: 4096, n_head: 32}\n"
                             "train: {micro_batch: 4}\n", "x"));
  CHECK(parse_config("model: {n_layer: 4}\nprecision: {fp8: {bf16_first_blocks: 2, bf16_last_blocks: 2}}\n",
                     "x").precision.fp8.bf16_last_blocks == 2);
}

TEST_CASE("config malformed: YAML structure errors name the line", "[config][malformed]") {
  const Case cases[] = {
      {"model: " + repeat("[", 3000) + repeat("]", 3000) + "\n", {}, "line 1:", "YAML syntax error",
       {"nests too deeply"}},
      {"model:\n\tn_layer: 1\n", {}, "line 2:", "YAML syntax error", {}},
      {"model:\n  [a, b]: 1\n", {}, "line 2:", "model", {"keys must be plain names"}},
      {"model:\n  ~: 1\n", {}, "line 2:", "model", {"keys must be plain names"}},
      {"- a\n- b\n", {}, "line 1:", "config", {"expected a map of sections"}},
      {"42\n", {}, "line 1:", "config", {"expected a map of sections"}},
      {"train: [1, 2]\n", {}, "line 1:", "train", {"expected a map"}},
      {"model: {<<: {n_layer: 1}}\n", {}, "line 1:", "model.<<", {"unknown key"}},
      {"model: &m {n_layer: 1}\ntrain: *m\n", {}, "line 1:", "train.n_layer", {"did you mean 'model.n_layer'"}},
      {"modle:\n  n_layer: 1\n", {}, "line 1:", "modle", {"did you mean 'model'"}},
      {"distributed:\n  overlap_comm: true\n", {}, "line 2:", "distributed.overlap_comm", {"removed key"}},
      {"run:\n  log_every: " + std::string(500, 'x') + "\n", {}, "line 2:", "run.log_every",
       {"(500 characters)"}},
      {"run:\n  log_every: \"a\\x01b\"\n", {}, "line 2:", "run.log_every", {"'a\\x01b'"}},
      // Not UTF-8 (yaml-cpp would re-encode it and its marks would stop being offsets into the text): refused
      // first, naming the line and the byte. A NUL byte, a Latin-1 byte, a truncated sequence, a surrogate.
      {std::string("model:\n  n_layer: 1\0\n", 22), {}, "line 2:", "not UTF-8 text", {"byte 0x00"}},
      {"run:\n  name: caf\xe9\n", {}, "line 2:", "not UTF-8 text", {"byte 0xE9"}},
      {"run:\n\n  name: x\xe2\x82\n", {}, "line 3:", "not UTF-8 text", {"byte 0xE2"}},
      {"run: {name: \xed\xa0\x80}\n", {}, "line 1:", "not UTF-8 text", {"byte 0xED"}},
      {"", {".=1"}, "--set .=1:", "'.' is not a key", {"optim.lr"}},
      {"", {"a..b=1"}, "--set a..b=1:", "'a..b' is not a key", {}},
      {"", {"model.=1"}, "--set model.=1:", "'model.' is not a key", {}},
  };
  for (const Case& c : cases) check_case(c);
  // A long value is cut in the message rather than printed whole.
  try {
    parse_config("run:\n  log_every: " + std::string(500, 'x') + "\n", "cfg.yaml");
  } catch (const fp8t::Error& e) {
    CHECK(std::string(e.what()).size() < 300);
  }
}

// A ',' where a node should start: yaml-cpp (0.7, 0.8) ends an empty document there without consuming the
// token, so YAML::LoadAll returned that document forever, allocating (yaml-cpp issue 1040; found by
// fuzz_config, tests/fuzz/regressions/config/timeout-c4e761c8...). The stream is now read one document at a
// time and refused where the parser stops advancing.
TEST_CASE("config malformed: a stray ',' is a syntax error at its line, not a hang", "[config][malformed]") {
  const Case cases[] = {
      {",", {}, "line 1:", "YAML syntax error", {"','", "inside [ ] or { }"}},
      {",\n", {}, "line 1:", "YAML syntax error", {"','"}},
      {", n_head: 2, d_model: 64, seq_len: 32}\ndata: {train: data/brown/train_*.bin}\n", {}, "line 1:",
       "YAML syntax error", {"','"}},
      {"# a comment\n\n, model: {n_layer: 2}\n", {}, "line 3:", "YAML syntax error", {"','"}},
      {"model: {n_layer: 2}\n---\n,\n", {}, "line 3:", "YAML syntax error", {"','"}},
      {"---\n,\n", {}, "line 2:", "YAML syntax error", {"','"}},
      {"", {"model.n_layer=,"}, "--set model.n_layer=,:", "model.n_layer", {"got nothing"}},  // YAML::Load
  };
  for (const Case& c : cases) check_case(c);
  // The saved fuzz input itself, through the file reader. Its line 10 holds a byte that is not UTF-8, so it is now
  // refused before the parser runs (the third case above is its first line, the stray ',').
  const fs::path regressions = fs::path(FP8T_SOURCE_DIR) / "tests/fuzz/regressions/config";
  int replayed = 0;
  for (const auto& entry : fs::directory_iterator(regressions)) {
    if (!entry.path().filename().string().starts_with("timeout-c4e761c8")) continue;
    INFO(entry.path());
    std::string msg;
    try {
      fp8t::load_config(entry.path().string());
    } catch (const fp8t::Error& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, ContainsSubstring(entry.path().string() + ", line 10: not UTF-8 text"));
    ++replayed;
  }
  CHECK(replayed == 1);
  // Empty documents before and after the config are still skipped, and its lines are the file's.
  CHECK(parse_config("---\n---\nmodel: {n_layer: 3}\n", "x").model.n_layer == 3);
  CHECK(parse_config("~\n...\nmodel: {n_layer: 3}\n---\n", "x").model.n_layer == 3);
  check_case({"---\n---\nmodel:\n  n_layer: x\n", {}, "line 4:", "model.n_layer", {"'x'"}});
}

TEST_CASE("config malformed: files that are no config are refused by name", "[config][malformed]") {
  const fs::path dir = fs::temp_directory_path() / ("fp8t_malformed_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  };
  struct FileCase {
    std::string path;
    std::vector<std::string> words;
  };
  const FileCase cases[] = {
      {write("empty.yaml", ""), {"sets no keys", "data.train", "configs/tiny-cpu.yaml"}},
      {write("comments.yaml", "# nothing here\n\n# at all\n"), {"sets no keys"}},
      {write("dashes.yaml", "---\n...\n"), {"sets no keys"}},
      {write("sections.yaml", "train:\nmodel:\n"), {"sets no keys"}},
      {write("binary.yaml", std::string("model: 1\n\0\0\x05", 12)), {"NUL", "binary file"}},
      {write("huge.yaml", "# " + std::string(2 << 20, 'x') + "\n"), {"bytes", "right file"}},
      {(dir / "no_such.yaml").string(), {"not found"}},
      {dir.string(), {"not a regular file"}},
  };
  for (const FileCase& c : cases) {
    INFO(c.path);
    std::string msg;
    try {
      fp8t::load_config(c.path);
    } catch (const fp8t::Error& e) {
      msg = e.what();
    }
    INFO(msg);
    REQUIRE_FALSE(msg.empty());
    CHECK_THAT(msg, ContainsSubstring(c.path));
    for (const auto& w : c.words) CHECK_THAT(msg, ContainsSubstring(w));
  }
  fs::remove_all(dir);
}

TEST_CASE("config: parameter_count matches the model's layout and saturates", "[config]") {
  for (const char* yaml : {"model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 100, seq_len: 8}\n",
                           "model: {n_layer: 1, n_head: 1, d_model: 8, vocab_size: 128, seq_len: 3}\n",
                           "model: {n_layer: 12}\n"}) {
    const fp8t::ModelConfig m = parse_config(yaml, "x").model;
    int64_t n = 0;
    for (const fp8t::ParamSpec& s : fp8t::gpt2_param_specs(m)) n += s.numel();
    n -= int64_t{m.padded_vocab() - m.vocab_size} * m.d_model;
    CHECK(m.parameter_count() == n);
  }
  CHECK(parse_config("", "x").model.parameter_count() == 124439808);  // GPT-2 small
  fp8t::ModelConfig huge;
  huge.n_layer = huge.d_model = std::numeric_limits<int>::max();
  CHECK(huge.parameter_count() == std::numeric_limits<int64_t>::max());
}

TEST_CASE("config: where() names the origin of each key", "[config]") {
  const fp8t::Config c = parse_config("run:\n  name: x\ndata: {train: a.bin}\n", "w.yaml", {"run.out_dir=/r"});
  CHECK(c.where("data.train") == "w.yaml, line 3: data.train");
  CHECK(c.where("run.out_dir") == "w.yaml: --set run.out_dir=/r: run.out_dir");
  CHECK(c.where("train.max_steps") == "w.yaml: train.max_steps");
}
