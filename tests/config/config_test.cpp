// Tests for config/: defaults, the YAML round trip, every class of error (file, line and key
// named),
// --set overrides, and that every shipped configs/*.yaml loads.
#include "config/config.h"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"

using Catch::Matchers::ContainsSubstring;
using fp8t::Config;
using fp8t::parse_config;

namespace {

// The message of the fp8t::Error that parsing `text` throws; fails the test if nothing is thrown.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "cfg.yaml", overrides);
  } catch (const fp8t::Error& e) {
    return e.what();
  }
  FAIL("no error for:\n" << text);
  return "";
}

void require_names(const std::string& msg, int line, const std::string& key) {
  INFO(msg);
  CHECK_THAT(msg, ContainsSubstring("cfg.yaml"));
  CHECK_THAT(msg, ContainsSubstring("line " + std::to_string(line) + ":"));
  CHECK_THAT(msg, ContainsSubstring(key));
}

const char* kFull = R"(run:
  name: full
  out_dir: /tmp/full
  seed: 18446744073709551615
  device: cuda
  log_every: 5
model: {arch: gpt2, n_layer: 3, n_head: 6, d_model: 192, vocab_size: 1000, seq_len: 64}
data: {train: "a/train_*.bin", val: ""}
train:
  micro_batch: 4
  total_batch_tokens: 1024
  max_steps: 7
  eval_every: 3
  eval_steps: 2
  checkpoint_every: 4
  recompute: block
  skip_nonfinite_steps: true
optim:
  lr: 3.3e-4
  min_lr_ratio: 0.0
  warmup_steps: 2
  schedule: linear
  betas: [0.8, 0.999]
  eps: 1.0e-6
  weight_decay: 0.0
  grad_clip: 0.5
precision:
  compute: fp8
  fp8:
    format: e4m3
    scaling: current
    amax_history_len: 1
    amax_compute_algo: most_recent
    margin: 2
    layers: [fc, lm_head]
    bf16_first_blocks: 1
    bf16_last_blocks: 2
    activation_storage: bf16
    reduce_amax: false
    monitor_every: 0
    fast_accum: [forward, dgrad]
distributed: {zero_stage: 2, bucket_mb: 12.5, timeout_s: 60}
)";

}  // namespace

TEST_CASE("config: empty text gives the header's defaults", "[config]") {
  Config c = parse_config("", "<string>");
  Config d;
  CHECK(c.source == "<string>");
  CHECK(c.to_yaml() == d.to_yaml());
  CHECK(c.run.device.is_cpu());
  CHECK(c.model.n_layer == 12);
  CHECK(c.train.micro_batch == 8);
  CHECK(c.optim.beta1 == 0.9);
  CHECK(c.optim.beta2 == 0.95);
  CHECK(c.precision.compute == fp8t::ComputeMode::fp32);
  CHECK(c.precision.fp8.layers == std::vector<std::string>{"qkv", "proj", "fc", "fc2"});
  CHECK(c.precision.fp8.fast_accum == std::vector<std::string>{"forward", "dgrad", "wgrad"});
  CHECK(parse_config("precision:\n  fp8:\n    fast_accum: []\n", "x").precision.fp8.fast_accum.empty());
  CHECK(c.distributed.zero_stage == 0);
  // A comment-only file and empty sections keep the defaults too.
  CHECK(parse_config("# nothing\n", "x").to_yaml() == d.to_yaml());
  CHECK(parse_config("train:\nprecision:\n  fp8:\n", "x").to_yaml() == d.to_yaml());
}

TEST_CASE("config: a full config is read and round-trips through to_yaml", "[config]") {
  Config c = parse_config(kFull, "full.yaml");
  CHECK(c.run.seed == 18446744073709551615ull);
  CHECK(c.run.device == fp8t::Device::cuda());
  CHECK(c.model.d_model == 192);
  CHECK(c.data.val.empty());
  CHECK(c.train.recompute == fp8t::Recompute::block);
  CHECK(c.train.skip_nonfinite_steps);
  CHECK(c.optim.lr == 3.3e-4);
  CHECK(c.optim.schedule == fp8t::Schedule::linear);
  CHECK(c.optim.beta2 == 0.999);
  CHECK(c.precision.fp8.format == fp8t::Fp8Formats::e4m3);
  CHECK(c.precision.fp8.amax_compute_algo == fp8t::AmaxAlgo::most_recent);
  CHECK(c.precision.fp8.layers == std::vector<std::string>{"fc", "lm_head"});
  CHECK(c.precision.fp8.activation_storage == fp8t::ActivationStorage::bf16);
  CHECK(c.precision.fp8.fast_accum == std::vector<std::string>{"forward", "dgrad"});
  CHECK(c.precision.fp8.fast_accum_in("dgrad"));
  CHECK_FALSE(c.precision.fp8.fast_accum_in("wgrad"));
  CHECK(c.distributed.bucket_mb == 12.5);

  std::string yaml = c.to_yaml();
  Config back = parse_config(yaml, "resolved.yaml");
  CHECK(back.to_yaml() == yaml);
  CHECK(back.run.name == "full");
  CHECK(back.optim.lr == c.optim.lr);

  // Doubles that need all 17 digits, and strings that YAML would read as other types.
  Config odd;
  odd.optim.lr = 0.1 + 0.2;
  odd.optim.eps = 1.0 / 3.0 * 1e-7;
  odd.run.name = "true";
  odd.data.train = "123";
  odd.data.val = {{"val", "a: b # c"}};
  Config odd_back = parse_config(odd.to_yaml(), "odd.yaml");
  CHECK(odd_back.optim.lr == odd.optim.lr);
  CHECK(odd_back.optim.eps == odd.optim.eps);
  CHECK(odd_back.run.name == "true");
  CHECK(odd_back.data.train == "123");
  CHECK(odd_back.data.val == odd.data.val);
  for (const char* section : {"run:", "model:", "data:", "train:", "optim:", "precision:", "fp8:",
                              "distributed:", "betas:", "monitor_every:", "timeout_s:"})
    CHECK_THAT(yaml, ContainsSubstring(section));
}

TEST_CASE("config: unknown keys name file - line and key - and suggest the closest", "[config]") {
  std::string msg = error_of("run:\n  name: x\ntrain:\n  micro_bach: 4\n");
  require_names(msg, 4, "train.micro_bach");
  CHECK_THAT(msg, ContainsSubstring("did you mean 'train.micro_batch'"));

  msg = error_of("precision:\n  fp8:\n    marginn: 1\n");
  require_names(msg, 3, "precision.fp8.marginn");
  CHECK_THAT(msg, ContainsSubstring("precision.fp8.margin'"));

  msg = error_of("model: {n_layer: 2}\ntrain: {lr: 1.0}\n");  // right name, wrong section
  require_names(msg, 2, "train.lr");
  CHECK_THAT(msg, ContainsSubstring("did you mean 'optim.lr'"));

  msg = error_of("\n\nmodle:\n  n_layer: 2\n");
  require_names(msg, 3, "modle");
  CHECK_THAT(msg, ContainsSubstring("did you mean 'model'"));

  msg = error_of("train:\n  xyzzy: 1\n");  // nothing close: list what is there
  require_names(msg, 2, "train.xyzzy");
  CHECK_THAT(msg, ContainsSubstring("micro_batch"));

  require_names(error_of("train:\n  max_steps: 1\n  max_steps: 2\n"), 3, "train.max_steps");
}

TEST_CASE("config: wrong types name file - line and key", "[config]") {
  std::string msg = error_of("run: {name: x}\ntrain:\n  micro_batch: abc\n");
  require_names(msg, 3, "train.micro_batch");
  CHECK_THAT(msg, ContainsSubstring("train.micro_batch: expected an integer, got 'abc'"));

  require_names(error_of("train:\n  micro_batch: 2.5\n"), 2, "expected an integer");
  require_names(error_of("optim:\n  lr: fast\n"), 2, "optim.lr: expected a number");
  require_names(error_of("train:\n  skip_nonfinite_steps: maybe\n"), 2, "expected true or false");
  require_names(error_of("train:\n  recompute: full\n"), 2, "expected one of none, block");
  require_names(error_of("run:\n  device: tpu\n"), 2, "run.device: expected one of cpu, cuda");
  require_names(error_of("run:\n  seed: -1\n"), 2, "run.seed: expected a non-negative integer");
  require_names(error_of("model:\n  arch: llama\n"), 2, "model.arch");
  require_names(error_of("run:\n  name: [a, b]\n"), 2, "run.name: expected a string, got a list");
  require_names(error_of("train:\n  micro_batch:\n"), 2, "train.micro_batch: expected an integer");
  require_names(error_of("optim:\n  betas: [0.9]\n"), 2, "optim.betas: expected a list of two");
  require_names(error_of("optim:\n  betas: 0.9\n"), 2, "optim.betas");
  require_names(error_of("precision:\n  fp8:\n    layers: qkv\n"), 3, "precision.fp8.layers");
  require_names(error_of("precision:\n  fp8:\n    layers:\n      - qkv\n      - attn\n"), 5,
                "precision.fp8.layers");
  require_names(error_of("precision:\n  fp8:\n    layers: [qkv, qkv]\n"), 3, "listed twice");
  require_names(error_of("precision:\n  fp8:\n    format: e5m2\n"), 3, "precision.fp8.format");
  require_names(error_of("precision:\n  fp8:\n    fast_accum: [fprop]\n"), 3, "precision.fp8.fast_accum");
  CHECK_THAT(error_of("precision:\n  fp8:\n    fast_accum: [fprop]\n"), ContainsSubstring("forward, dgrad, wgrad"));
  require_names(error_of("precision:\n  fp8:\n    fast_accum: [dgrad, dgrad]\n"), 3, "listed twice");
}

TEST_CASE("config: out-of-range values name file - line and key", "[config]") {
  struct Case {
    const char* text;
    int line;
    const char* key;
  };
  const Case cases[] = {
      {"train:\n  micro_batch: 0\n", 2, "train.micro_batch"},
      {"model:\n  n_layer: 0\n", 2, "model.n_layer"},
      {"model:\n  vocab_size: 0\n", 2, "model.vocab_size"},
      {"model:\n  seq_len: -4\n", 2, "model.seq_len"},
      {"optim:\n  lr: 0\n", 2, "optim.lr"},
      {"optim:\n  min_lr_ratio: 1.5\n", 2, "optim.min_lr_ratio"},
      {"optim:\n  warmup_steps: -1\n", 2, "optim.warmup_steps"},
      {"optim:\n  betas: [0.9, 1.0]\n", 2, "optim.betas"},
      {"optim:\n  betas:\n    - -0.1\n    - 0.9\n", 3, "optim.betas"},
      {"optim:\n  eps: 0\n", 2, "optim.eps"},
      {"optim:\n  weight_decay: -0.1\n", 2, "optim.weight_decay"},
      {"optim:\n  grad_clip: -1\n", 2, "optim.grad_clip"},
      {"train:\n  max_steps: 0\n", 2, "train.max_steps"},
      {"train:\n  eval_steps: 0\n", 2, "train.eval_steps"},
      {"train:\n  total_batch_tokens: -8\n", 2, "train.total_batch_tokens"},
      {"distributed:\n  zero_stage: 3\n", 2, "distributed.zero_stage"},
      {"distributed:\n  bucket_mb: 0\n", 2, "distributed.bucket_mb"},
      {"distributed:\n  timeout_s: -5\n", 2, "distributed.timeout_s"},
      {"precision:\n  fp8:\n    amax_history_len: 0\n", 3, "precision.fp8.amax_history_len"},
      {"precision:\n  fp8:\n    margin: -1\n", 3, "precision.fp8.margin"},
      {"precision:\n  fp8:\n    bf16_first_blocks: -1\n", 3, "precision.fp8.bf16_first_blocks"},
      {"precision:\n  fp8:\n    bf16_last_blocks: -2\n", 3, "precision.fp8.bf16_last_blocks"},
      {"model:\n  n_layer: 99999999999\n", 2, "out of range"},
      {"optim:\n  lr: .inf\n", 2, "optim.lr"},
  };
  for (const Case& c : cases) require_names(error_of(c.text), c.line, c.key);
  CHECK_THAT(error_of("train:\n  micro_batch: 0\n"),
             ContainsSubstring("expected an integer >= 1 or auto, got 0"));
  CHECK_THAT(error_of("optim:\n  betas: [0.9, 1.0]\n"), ContainsSubstring("in [0, 1)"));
}

TEST_CASE("config: cross-field checks", "[config]") {
  std::string msg = error_of("model:\n  n_layer: 2\n  d_model: 100\n  n_head: 3\n");
  require_names(msg, 3, "model.d_model");
  CHECK_THAT(msg, ContainsSubstring("divisible by n_head = 3"));

  msg =
      error_of("model: {seq_len: 1024}\ntrain:\n  micro_batch: 8\n  total_batch_tokens: 500000\n");
  require_names(msg, 4, "train.total_batch_tokens");
  CHECK_THAT(msg, ContainsSubstring("500000"));
  CHECK_THAT(msg, ContainsSubstring("8192"));
  CHECK_THAT(msg, ContainsSubstring("nearest valid value: 499712"));
  CHECK_THAT(error_of("model: {seq_len: 1024}\ntrain: {micro_batch: 8, total_batch_tokens: 100}\n"),
             ContainsSubstring("nearest valid value: 8192"));

  // Emulated reduced precision on CPU is allowed.
  CHECK(parse_config("run: {device: cpu}\nprecision: {compute: fp8}\n", "x").precision.compute ==
        fp8t::ComputeMode::fp8);
  CHECK(parse_config("run: {device: cpu}\nprecision: {compute: bf16}\n", "x").precision.compute ==
        fp8t::ComputeMode::bf16);
}

TEST_CASE("config: structural and syntax errors", "[config]") {
  std::string msg = error_of("run: {name: x}\nmodel: 5\n");
  require_names(msg, 2, "model");
  CHECK_THAT(msg, ContainsSubstring("expected a map"));
  require_names(error_of("precision:\n  fp8: [qkv]\n"), 2, "precision.fp8");
  CHECK_THAT(error_of("just a string\n"), ContainsSubstring("expected a map of sections"));

  msg = error_of("run:\n  name: x\n bad: 1\n");
  CHECK_THAT(msg, ContainsSubstring("cfg.yaml, line 3:"));
  CHECK_THAT(msg, ContainsSubstring("YAML syntax error"));
  msg = error_of("run:\n  name: x\ntrain:\n  micro_batch: [1, 2\n");
  CHECK_THAT(msg, ContainsSubstring("cfg.yaml, line 5:"));
}

TEST_CASE("config: data.val takes a glob - a list of globs or a map of named globs", "[config]") {
  using fp8t::ValSet;
  using Sets = std::vector<ValSet>;
  CHECK(parse_config("data: {val: d/val_*.bin}\n", "x").data.val == Sets{{"val", "d/val_*.bin"}});
  CHECK(parse_config("data: {val: \"\"}\n", "x").data.val.empty());
  CHECK(parse_config("data:\n  val:\n", "x").data.val.empty());
  CHECK(parse_config("data: {val: '5'}\n", "x").data.val == Sets{{"val", "5"}});  // quoted: a path

  const Config list = parse_config(
      "data:\n  val:\n    - data/medium/val_*.bin\n    - data/medium/val_sotu_*.bin\n"
      "    - data/sotu/*.bin\n    - d/test_000001.bin\n",
      "x");
  CHECK(list.data.val == Sets{{"val", "data/medium/val_*.bin"},
                              {"val_sotu", "data/medium/val_sotu_*.bin"},
                              {"sotu", "data/sotu/*.bin"},
                              {"test_000001", "d/test_000001.bin"}});

  const Config map = parse_config(
      "data:\n  val: {in_dist: data/medium/val_*.bin, sotu: data/medium/val_sotu_*.bin}\n", "x");
  CHECK(map.data.val ==
        Sets{{"in_dist", "data/medium/val_*.bin"}, {"sotu", "data/medium/val_sotu_*.bin"}});
  // Order is the file's, not alphabetical: the first set is the one logged as val_loss.
  CHECK(parse_config("data:\n  val:\n    zz: a/z.bin\n    aa: a/a.bin\n", "x").data.val[0].name ==
        "zz");

  CHECK(fp8t::val_set_name("data/medium/val_sotu_*.bin") == "val_sotu");
  CHECK(fp8t::val_set_name("data/medium/sotu_val_*.bin") == "sotu_val");
  CHECK(fp8t::val_set_name("val-[0-9].bin") == "val");
  CHECK(fp8t::val_set_name("a/b/*") == "b");
  CHECK(fp8t::val_set_name("*.bin").empty());

  // Every form round-trips through to_yaml, including names YAML would read as other types.
  Config odd;
  odd.data.val = {{"null", "a: b"}, {"true", "c/*.bin"}};
  for (const Config& c : {list, map, odd, parse_config("data: {val: d/val_*.bin}\n", "x")}) {
    const std::string yaml = c.to_yaml();
    INFO(yaml);
    const Config back = parse_config(yaml, "resolved.yaml");
    CHECK(back.data.val == c.data.val);
    CHECK(back.to_yaml() == yaml);
  }

  // --set takes each form.
  CHECK(parse_config("", "x", {"data.val=a/val_*.bin"}).data.val == Sets{{"val", "a/val_*.bin"}});
  CHECK(parse_config("", "x", {"data.val=[a/val_*.bin, a/val_sotu_*.bin]"}).data.val.size() == 2);
  CHECK(parse_config("data: {val: a/v.bin}\n", "x", {"data.val={in: a/v*.bin, out: b/v*.bin}"})
            .data.val == Sets{{"in", "a/v*.bin"}, {"out", "b/v*.bin"}});
  CHECK(parse_config("data: {val: a/v.bin}\n", "x", {"data.val=\"\""}).data.val.empty());
}

TEST_CASE("config: bad data.val forms name file - line and key", "[config]") {
  std::string msg = error_of("data:\n  val: 5\n");
  require_names(msg, 2, "data.val");
  CHECK_THAT(msg, ContainsSubstring("expected a glob of token shards, got 5"));
  require_names(error_of("data:\n  val: true\n"), 2, "data.val: expected a glob");
  msg = error_of("data:\n  val:\n    in_dist: {a: x.bin}\n");
  require_names(msg, 3, "data.val.in_dist");
  CHECK_THAT(msg, ContainsSubstring("got a map"));
  require_names(error_of("data:\n  val:\n    sotu:\n"), 3, "data.val.sotu: expected a glob");
  msg = error_of("data:\n  val: {}\n");
  require_names(msg, 2, "data.val");
  CHECK_THAT(msg, ContainsSubstring("an empty map"));
  require_names(error_of("data:\n  val: []\n"), 2, "data.val: an empty list");
  msg = error_of("data:\n  val:\n    - a/val_*.bin\n    - b/val_*.bin\n");
  require_names(msg, 4, "data.val");
  CHECK_THAT(msg, ContainsSubstring("two validation sets are named 'val'"));
  CHECK_THAT(msg, ContainsSubstring("map form"));
  msg = error_of("data:\n  val:\n    a: x.bin\n    a: y.bin\n");
  require_names(msg, 4, "data.val");
  CHECK_THAT(msg, ContainsSubstring("named 'a'"));
  require_names(error_of("data:\n  val:\n    - [a.bin]\n"), 3, "data.val: expected a glob");
  require_names(error_of("data:\n  val:\n    - '*.bin'\n"), 3, "cannot name the validation set");
  require_names(error_of("data:\n  val:\n    'bad name': x.bin\n"), 3, "data.val");
  CHECK_THAT(error_of("", {"data.val=7"}), ContainsSubstring("--set data.val=7: data.val"));
  require_names(error_of("data:\n  shuffle: maybe\n"), 2, "data.shuffle: expected true or false");
}

TEST_CASE("config: data.shuffle defaults to true", "[config]") {
  CHECK(Config{}.data.shuffle);
  CHECK_FALSE(parse_config("data: {shuffle: false}\n", "x").data.shuffle);
  CHECK_FALSE(parse_config("", "x", {"data.shuffle=false"}).data.shuffle);
}

TEST_CASE("config: load_config names the file in every error", "[config]") {
  CHECK_THROWS_WITH(fp8t::load_config("/nonexistent/dir/x.yaml"),
                    ContainsSubstring("/nonexistent/dir/x.yaml") && ContainsSubstring("not found"));
  auto path = std::filesystem::temp_directory_path() / "fp8t_config_test.yaml";
  { std::ofstream(path) << "# a comment\nrun:\n  name: t\noptim:\n  lr: -1\n"; }
  CHECK_THROWS_WITH(fp8t::load_config(path.string()),
                    ContainsSubstring(path.string() + ", line 5: optim.lr"));
  Config c = fp8t::load_config(path.string(), {"optim.lr=0.01"});
  CHECK(c.optim.lr == 0.01);
  CHECK(c.source == path.string());
  std::filesystem::remove(path);
}

TEST_CASE("config: --set overrides apply before conversion", "[config]") {
  const std::string text = "train:\n  micro_batch: 4\noptim:\n  lr: 1.0e-3\n";
  Config c = parse_config(
      text, "cfg.yaml",
      {"train.micro_batch=16", "optim.lr=3e-4", "train.recompute=block", "optim.betas=[0.9,0.99]",
       "precision.fp8.margin=2", "precision.fp8.layers=[qkv, lm_head]", "run.device=cuda",
       "data.val=", "distributed={zero_stage: 2, bucket_mb: 50}",
       "train.micro_batch=12"});  // the last one wins
  CHECK(c.train.micro_batch == 12);
  CHECK(c.optim.lr == 3e-4);
  CHECK(c.train.recompute == fp8t::Recompute::block);
  CHECK(c.optim.beta1 == 0.9);
  CHECK(c.optim.beta2 == 0.99);
  CHECK(c.precision.fp8.margin == 2);
  CHECK(c.precision.fp8.layers == std::vector<std::string>{"qkv", "lm_head"});
  CHECK(c.run.device.is_cuda());
  CHECK(c.data.val.empty());
  CHECK(c.distributed.zero_stage == 2);
  CHECK(c.distributed.bucket_mb == 50);

  std::string msg = error_of(text, {"train.micro_bach=4"});
  CHECK_THAT(msg, ContainsSubstring("cfg.yaml"));
  CHECK_THAT(msg, ContainsSubstring("--set train.micro_bach=4"));
  CHECK_THAT(msg, ContainsSubstring("did you mean 'train.micro_batch'"));
  CHECK_THAT(error_of(text, {"nosuch.key=1"}), ContainsSubstring("--set nosuch.key=1"));
  CHECK_THAT(error_of(text, {"modle.n_layer=1"}), ContainsSubstring("did you mean 'model'"));
  CHECK_THAT(error_of(text, {"train.micro_batch.x=1"}), ContainsSubstring("not a section"));
  CHECK_THAT(error_of(text, {"train.micro_batch=abc"}),
             ContainsSubstring(
                 "--set train.micro_batch=abc: train.micro_batch: expected an integer, got 'abc'"));
  CHECK_THAT(error_of(text, {"precision.fp8.margin=-3"}),
             ContainsSubstring("--set precision.fp8.margin=-3"));
  CHECK_THAT(error_of(text, {"optim.lr"}), ContainsSubstring("expected KEY=VALUE"));
  CHECK_THAT(error_of(text, {"optim.betas=[0.9, 0.99"}), ContainsSubstring("--set optim.betas="));
}

TEST_CASE("config: every configs/*.yaml loads", "[config]") {
  const std::filesystem::path dir = std::filesystem::path(FP8T_SOURCE_DIR) / "configs";
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    INFO(entry.path().string());
    Config c;
    REQUIRE_NOTHROW(c = fp8t::load_config(entry.path().string()));
    CHECK(c.run.name == entry.path().stem().string());
    CHECK(parse_config(c.to_yaml(), "resolved").to_yaml() == c.to_yaml());
    ++loaded;
  }
  CHECK(loaded >= 5);
  Config tiny = fp8t::load_config((dir / "tiny-cpu.yaml").string());
  CHECK(tiny.run.device.is_cpu());
  CHECK(tiny.model.n_layer == 4);
  CHECK(tiny.model.seq_len == 128);
  CHECK(tiny.precision.compute == fp8t::ComputeMode::fp32);
  Config fp8 = fp8t::load_config((dir / "gpt2-124m-fp8.yaml").string());
  CHECK(fp8.precision.compute == fp8t::ComputeMode::fp8);
  CHECK(fp8.train.total_batch_tokens == 524288);
}
