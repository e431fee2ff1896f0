// The step report (train/step_report.h): the loss z-score on hand-worked series, the step line and
// metrics fields, and a run that skips non-finite steps counting them in both, across a resume.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "train/checkpoint.h"
#include "train/step_report.h"
#include "train/trainer.h"

using namespace fp8t;
using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

TEST_CASE("train: the loss z-score is measured against the previous losses of the window", "[train][step_report]") {
  LossWindow w;
  CHECK_FALSE(w.zscore(1.0).has_value());  // nothing to compare with
  w.push(1.0);
  CHECK_FALSE(w.zscore(5.0).has_value());  // one loss: no spread yet
  w.push(3.0);
  // [1, 3]: mean 2, population std 1.
  CHECK(w.zscore(4.0).value() == Approx(2.0));
  CHECK(w.zscore(2.0).value() == Approx(0.0).margin(1e-12));
  w.push(4.0);
  // [1, 3, 4]: mean 8/3, variance (25 + 1 + 16) / 27 = 14/9, so z(2) = (2 - 8/3) / (sqrt(14) / 3) = -2 / sqrt(14).
  CHECK(w.zscore(2.0).value() == Approx(-2.0 / std::sqrt(14.0)));
  // Non-finite losses (skipped steps) have none and stay out of the window.
  CHECK_FALSE(w.zscore(NAN).has_value());
  w.push(NAN);
  w.push(INFINITY);
  CHECK(w.size() == 3);

  LossWindow flat;  // all equal: std 0, no z-score
  for (int i = 0; i < 5; ++i) flat.push(2.5);
  CHECK_FALSE(flat.zscore(2.5).has_value());

  // 200 losses 0 .. 199: the window keeps the last 100 (100 .. 199), mean 149.5, variance (100^2 - 1) / 12.
  LossWindow full;
  for (int i = 0; i < 200; ++i) full.push(i);
  CHECK(full.size() == LossWindow::kSize);
  CHECK(full.zscore(149.5).value() == Approx(0.0).margin(1e-12));
  CHECK(full.zscore(200.0).value() == Approx(50.5 / std::sqrt(9999.0 / 12.0)));
  // Losses near 4 that agree to 7 digits: a one-pass sum of squares would lose them.
  LossWindow close;
  close.push(4.0000001);
  close.push(4.0000003);
  CHECK(close.zscore(4.0000004).value() == Approx(2.0).epsilon(1e-6));
}

TEST_CASE("train: the step line and metrics fields show the z-score - MFU and skipped steps", "[train][step_report]") {
  StepReport r;
  r.step = 12;
  r.max_steps = 100;
  r.tokens = 1536;
  r.loss = 3.12345;
  r.lr = 6e-4;
  r.grad_norm = 0.8123;
  r.step_ms = 95;
  r.tokens_per_s = 10780;
  r.memory_peak = 3 << 20;
  r.eta_s = 65;
  CHECK(step_line(r) == "step    12/100 | loss 3.1235 | lr 6.00e-04 | norm 0.812 | 95 ms | 10780 tok/s | mem 3.0 MiB | "
                        "ETA 1m05s");
  nlohmann::json j = step_json(r);
  CHECK_FALSE(j.contains("loss_z"));
  CHECK_FALSE(j.contains("mfu"));
  CHECK_FALSE(j.contains("skipped"));
  CHECK(j["skipped_steps"] == 0);
  r.loss_z = 0.5234;
  r.mfu = 0.4123;
  r.skipped_steps = 2;
  CHECK(step_line(r) == "step    12/100 | loss 3.1235 | z +0.52 | lr 6.00e-04 | norm 0.812 | 95 ms | 10780 tok/s | "
                        "MFU 41.2% | mem 3.0 MiB | skipped 2 | ETA 1m05s");
  r.skipped = true;
  j = step_json(r);
  CHECK(j["loss_z"] == 0.5234);
  CHECK(j["mfu"] == 0.4123);
  CHECK(j["skipped_steps"] == 2);
  CHECK(j["skipped"] == true);
  for (const char* k : {"step", "tokens", "loss", "lr", "grad_norm", "step_ms", "queue_ms", "wait_ms", "tokens_per_s"})
    CHECK(j.contains(k));
}

namespace {
// nan_location_test's blow-up: lr 1e30 trains step 1, then every step overflows (finite weights, so the
// skipped steps' checkpoints are written).
Config blowup(const fs::path& root, const std::string& name, int max_steps) {
  fs::create_directories(root / "data");
  std::vector<uint16_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i * 7 % 50);
  write_shard((root / "data" / "train_000000.bin").string(), toks);
  return parse_config(fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 128, max_steps: {2}, checkpoint_every: 0, skip_nonfinite_steps: true,
        max_skipped_steps: 5}}
optim: {{lr: 1.0e30, warmup_steps: 2, grad_clip: 0}}
)",
                                  name, root.string(), max_steps),
                      name + ".yaml");
}

std::vector<nlohmann::json> rows(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The last line of `text` that contains `what` ("" when none does).
std::string line_with(const std::string& text, const std::string& what) {
  const size_t at = text.rfind(what);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at) + 1, end = text.find('\n', at);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}
}  // namespace

TEST_CASE("train: skipped non-finite steps are counted in the step line and metrics - across a resume",
          "[train][step_report][nonfinite]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_step_report_{}", ::getpid());
  fs::remove_all(root);
  auto comm = make_single_communicator();
  // Step 1 trains; steps 2 and 3 are skipped; the checkpoint at step 3 records 2 skipped steps.
  const TrainResult r = train(blowup(root, "run", 3), *comm);
  CHECK(r.skipped_steps == 2);
  std::vector<nlohmann::json> m = rows(root / "run");
  REQUIRE(m.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(m[i]["skipped_steps"] == i);
  CHECK_FALSE(m[0].contains("loss_z"));  // non-finite losses never enter the window: none at all here
  const std::string log = read_text(root / "run" / "log.txt");
  CHECK_THAT(line_with(log, "step     1/3 |"), !ContainsSubstring("skipped"));
  CHECK_THAT(line_with(log, "step     2/3 |"), ContainsSubstring("| skipped 1 | ETA"));
  CHECK_THAT(line_with(log, "step     3/3 |"), ContainsSubstring("| skipped 2 | ETA"));
  const fs::path ck = root / "run" / "checkpoints" / "step_00000003";
  CHECK(read_checkpoint_state(ck).skipped_steps == 2);

  // Resumed to step 5: the count goes on from the checkpoint's (steps 4 and 5 skipped too).
  const TrainResult more = train(blowup(root, "run", 5), *comm, root / "run");
  CHECK(more.skipped_steps == 2);  // this run's own, as the summary line counts them
  m = rows(root / "run");
  REQUIRE(m.size() == 5);
  CHECK(m[3]["skipped_steps"] == 3);
  CHECK(m[4]["skipped_steps"] == 4);
  CHECK_THAT(line_with(read_text(root / "run" / "log.txt"), "step     5/5 |"), ContainsSubstring("| skipped 4 | ETA"));
  CHECK(read_checkpoint_state(root / "run" / "checkpoints" / "step_00000005").skipped_steps == 4);
  fs::remove_all(root);
}

TEST_CASE("train: a resumed run refills the z-score window from metrics.jsonl", "[train][step_report]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("fp8t_loss_window_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl") << "{\"step\":0,\"val_loss\":9.0}\n{\"step\":1,\"loss\":1.0}\n"
                                          "{\"step\":2,\"loss\":null,\"skipped\":true}\n{\"step\":3,\"loss\":3.0}\n";
  LossWindow w;
  w.push_from_metrics(dir / "metrics.jsonl");
  CHECK(w.size() == 2);
  CHECK(w.zscore(4.0).value() == Approx(2.0));
  LossWindow none;
  none.push_from_metrics(dir / "missing.jsonl");  // a run directory without metrics yet
  CHECK(none.size() == 0);
  fs::remove_all(dir);
}
