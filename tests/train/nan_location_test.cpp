// Locating NaN/Inf: a weight planted with NaN, an activation overflow and a NaN on a gradient path are
// each named by block, op and tensor; skipping stops after train.max_skipped_steps in a row; the end of
// run summary prints only what was measured.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "autograd/finite_watch.h"
#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "nn/gpt.h"
#include "ops/ops.h"
#include "train/nonfinite.h"
#include "train/trainer.h"
#include "tests/util/model_test_util.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {
constexpr int kB = 2, kT = 8;

ModelConfig three_blocks() { return test::gpt_config(3, 32, 64, kT); }

std::pair<Tensor, Tensor> tokens_and_targets() {
  Tensor tokens = Tensor::empty({kB, kT}, DType::i32), targets = Tensor::empty({kB, kT}, DType::i32);
  std::mt19937 rng(3);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 64);
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 64);
  }
  return {tokens, targets};
}

float* param(GPT& model, const std::string& name) { return model.params().var(name)->value.data<float>(); }

std::string locate(GPT& model, bool recompute = false) {
  const auto batch = tokens_and_targets();
  return locate_first_nonfinite(model, 1, [&](int) { return batch; }, recompute, 1.0f);
}
}  // namespace

TEST_CASE("nonfinite: first_nonfinite finds the first NaN or Inf of any float dtype", "[nonfinite]") {
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK_FALSE(first_nonfinite(t).has_value());
  t.data<float>()[4] = -INFINITY;
  t.data<float>()[5] = NAN;
  CHECK(first_nonfinite(t) == 4);
  CHECK(first_nonfinite(cast(t, DType::bf16)) == 4);
  CHECK(first_nonfinite(cast(t, DType::f64)) == 4);
  CHECK_FALSE(first_nonfinite(Tensor::zeros({4}, DType::i32)).has_value());  // no floats: nothing to find
}

TEST_CASE("nonfinite: a NaN planted in block 2's attention projection is named, weight first", "[nonfinite]") {
  GPT model(three_blocks(), Device::cpu(), DType::f32);
  model.init(1);
  CHECK(nonfinite_weights(model.params()).empty());
  CHECK(locate(model).empty());  // a healthy step: nothing to report
  param(model, "h.2.attn.c_proj.weight")[37] = NAN;  // (C, C): row 1, column 5
  CHECK(nonfinite_weights(model.params()) == "h.2.attn.c_proj.weight element 37 [1, 5] is nan");
  const bool recompute = GENERATE(false, true);
  INFO("recompute " << recompute);
  // Output channel 1 of every token reads row 1: the first bad element is [0, 0, 1].
  CHECK(locate(model, recompute) ==
        "in the forward pass, in block 2: the output of h.2.attn.c_proj (linear), shape [2, 8, 32], element 1 "
        "[0, 0, 1] is nan; its input h.2.attn.c_proj.weight was already non-finite (element 37 is nan)");
}

TEST_CASE("nonfinite: an attention overflow from a huge weight scale is named with finite inputs", "[nonfinite]") {
  GPT model(three_blocks(), Device::cpu(), DType::f32);
  model.init(1);
  // qkv ~ 1e20 is finite, q.k ~ 1e40 is not: the scores overflow inside block 2's attention.
  float* w = param(model, "h.2.attn.c_attn.weight");
  for (int64_t i = 0; i < 3 * 32 * 32; ++i) w[i] *= 1e21f;
  CHECK(nonfinite_weights(model.params()).empty());
  const std::string where = locate(model);
  CHECK_THAT(where, ContainsSubstring("in the forward pass, in block 2: the output of h.2.attn (attention), shape "
                                      "[2, 8, 32], element 0 [0, 0, 0] is "));
  CHECK_THAT(where, ContainsSubstring("; its inputs were finite"));
}

TEST_CASE("nonfinite: a NaN on a gradient path names the backward that wrote it", "[nonfinite]") {
  GPT model(three_blocks(), Device::cpu(), DType::f32);
  model.init(1);
  const auto [tokens, targets] = tokens_and_targets();
  const bool recompute = GENERATE(false, true);
  INFO("recompute " << recompute);
  FiniteWatch watch;
  FiniteWatchScope watching(&watch);
  Tape tape;
  Var loss;
  {
    TapeScope scope(&tape);
    loss = model.loss(tokens, targets, recompute);  // finite: checked op by op
  }
  // From here only backward reads block 1's MLP projection (C, 4C): d(its input) = d(out) @ w turns
  // column 7 NaN, its weight gradient d(out)^T @ x stays finite.
  param(model, "h.1.mlp.c_proj.weight")[7] = NAN;
  watch.begin_backward();
  std::string what;
  try {
    tape.backward(loss);
  } catch (const NonfiniteFound& e) {
    what = e.what();
    CHECK(e.site().backward);
    CHECK(e.site().layer == "h.1.mlp.c_proj");
  }
  CHECK(what ==
        "the backward of h.1.mlp.c_proj (linear) wrote the gradient of h.1.mlp.gelu output, shape [2, 8, 128], "
        "element 7 [0, 0, 7] is nan; the gradient it read (of h.1.mlp.c_proj output) was finite");
}

TEST_CASE("nonfinite: FP8 linears are checked like the others", "[nonfinite]") {
  PrecisionConfig precision;
  precision.compute = ComputeMode::fp8;
  GPT model(three_blocks(), Device::cpu(), DType::f32, 1, precision);
  model.init(1);
  param(model, "h.2.attn.c_proj.weight")[37] = NAN;
  CHECK_THAT(locate(model), ContainsSubstring("in the forward pass, in block 2: the output of h.2.attn.c_proj "
                                              "(fp8_linear), shape [2, 8, 32]"));
}

// ---------------------------------------------------------------- through train()

namespace {
// A cycle of 50 tokens, two micro-batches of 4x16 per step, no validation data.
Config blowup_config(const fs::path& root, const std::string& name) {
  fs::create_directories(root / "data");
  std::vector<uint16_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i * 7 % 50);
  write_shard((root / "data" / "train_000000.bin").string(), toks);
  // lr 1e30: the first update leaves weights of ~5e29 (warmup halves it), whose products overflow in
  // the second step's first linear: block 0's qkv.
  const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 128, max_steps: 10, checkpoint_every: 0}}
optim: {{lr: 1.0e30, warmup_steps: 2, grad_clip: 0}}
)",
                                       name, root.string());
  return parse_config(yaml, name + ".yaml");
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

constexpr const char* kFirstOverflow =
    "Re-running step 2 with every op checked: first non-finite value in the forward pass of micro-batch 1 of 2, in "
    "block 0: the output of h.0.attn.c_attn (linear), shape [4, 16, 96]";
}  // namespace

TEST_CASE("nonfinite: a blown-up step stops the run naming the first op", "[nonfinite][train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_nan_stop_{}", ::getpid());
  fs::remove_all(root);
  auto comm = make_single_communicator();
  const Config cfg = blowup_config(root, "stop");
  std::string what;
  try {
    train(cfg, *comm);
  } catch (const Error& e) {
    what = e.what();
  }
  CHECK_THAT(what, ContainsSubstring("step 2: non-finite loss ("));
  CHECK_THAT(what, ContainsSubstring(kFirstOverflow));
  CHECK_THAT(what, ContainsSubstring("; its inputs were finite. Set train.skip_nonfinite_steps: true"));
  CHECK_FALSE(fs::exists(root / "stop" / "checkpoints"));
  fs::remove_all(root);
}

TEST_CASE("nonfinite: skipping stops after train.max_skipped_steps in a row", "[nonfinite][train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_nan_skip_{}", ::getpid());
  fs::remove_all(root);
  auto comm = make_single_communicator();
  Config cfg = blowup_config(root, "skip");
  cfg.train.skip_nonfinite_steps = true;
  const int limit = GENERATE(1, 3);
  cfg.train.max_skipped_steps = limit;
  std::string what;
  try {
    train(cfg, *comm);
  } catch (const Error& e) {
    what = e.what();
  }
  // Step 1 trains, steps 2 .. limit + 1 are skipped, the last of them stops the run.
  CHECK_THAT(what, ContainsSubstring(fmt::format("step {}: non-finite loss", limit + 1)));
  const std::string steps = limit == 1 ? "step 2" : fmt::format("steps 2 to {}", limit + 1);
  CHECK_THAT(what, ContainsSubstring(fmt::format("; skipped steps in a row: {} ({}), the limit "
                                                 "(train.max_skipped_steps): stopping. {}",
                                                 limit, steps, kFirstOverflow)));
  const std::string log = read_text(root / "skip" / "log.txt");
  CHECK(count(log, "skipping the update") == limit - 1);
  CHECK(count(read_text(root / "skip" / "metrics.jsonl"), "\"skipped\":true") == limit - 1);
  CHECK_FALSE(fs::exists(root / "skip" / "checkpoints"));
  fs::remove_all(root);
}

TEST_CASE("nonfinite: a run that skipped every step says so and prints no unmeasured value", "[nonfinite][train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_nan_summary_{}", ::getpid());
  fs::remove_all(root);
  auto comm = make_single_communicator();
  // One step of lr 1e30 leaves finite weights that overflow in every later step.
  Config first = blowup_config(root, "first");
  first.train.max_steps = 1;
  const TrainResult r1 = train(first, *comm);
  CHECK(r1.steps == 1);
  CHECK(r1.skipped_steps == 0);
  CHECK_FALSE(r1.first_val_loss.has_value());
  CHECK(summary_line(r1, first) ==
        fmt::format("fp8train: done: 1 steps, no validation run (data.val is empty), last train loss {:.4f}",
                    r1.last_train_loss.value()));

  Config resumed = blowup_config(root, "resumed");
  resumed.train.max_steps = 3;
  resumed.train.skip_nonfinite_steps = true;
  const TrainResult r = train(resumed, *comm, root / "first");
  CHECK(r.steps == 3);
  CHECK(r.steps_run == 2);
  CHECK(r.skipped_steps == 2);
  CHECK_FALSE(r.last_val_loss.has_value());
  REQUIRE(r.last_train_loss.has_value());
  CHECK_FALSE(std::isfinite(*r.last_train_loss));
  const std::string line = summary_line(r, resumed);
  CHECK_THAT(line, ContainsSubstring("fp8train: done: 3 steps (all 2 run here skipped for non-finite values: the "
                                     "weights were not updated), no validation run (data.val is empty), last "
                                     "train loss "));
  CHECK_THAT(line, !ContainsSubstring("0.0000"));

  // Resumed at its last step, a run runs nothing and reports no train loss.
  const TrainResult none = train(resumed, *comm, root / "resumed");
  CHECK(none.steps_run == 0);
  CHECK(summary_line(none, resumed) ==
        "fp8train: done: 3 steps, no validation run (data.val is empty), no training step run");
  fs::remove_all(root);
}
