// metrics.jsonl on resume: rows written after the checkpoint are dropped, so after a kill and a resume
// every step appears exactly once.
#include <catch2/catch_test_macros.hpp>
#include <map>
#include <sstream>

#include "checkpoint_test_util.h"
#include "train/metrics.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

std::vector<nlohmann::json> rows(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::istringstream in(slurp(file));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("metrics: drop_metrics_after keeps steps up to the checkpoint and rows without a step", "[metrics]") {
  const fs::path dir = scratch_root() / "metrics_unit";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path f = dir / "metrics.jsonl";
  spit(f, "{\"config\": \"tiny\"}\n{\"step\": 0, \"val_loss\": 4.1}\n{\"step\": 1, \"loss\": 4.0}\n"
          "{\"step\": 2, \"loss\": 3.9}\n{\"step\": 3, \"loss\": 3.8}\n{\"note\": \"kept\"}\n{\"step\": 4, \"lo");
  CHECK(drop_metrics_after(f, 2) == 2);  // step 3 and the line cut by the kill
  CHECK(slurp(f) == "{\"config\": \"tiny\"}\n{\"step\": 0, \"val_loss\": 4.1}\n{\"step\": 1, \"loss\": 4.0}\n"
                    "{\"step\": 2, \"loss\": 3.9}\n{\"note\": \"kept\"}\n");
  CHECK_FALSE(fs::exists(dir / "metrics.jsonl.tmp"));
  CHECK(drop_metrics_after(f, 2) == 0);  // nothing left to drop: the file is unchanged
  CHECK(drop_metrics_after(dir / "absent.jsonl", 2) == 0);
  CHECK_FALSE(fs::exists(dir / "absent.jsonl"));

  // Appending skips the steps the file holds.
  {
    MetricsWriter w(f, /*append=*/true);
    w.write({{"step", 2}, {"val_loss", 3.5}});
    w.write({{"step", 3}, {"loss", 3.7}});
  }
  const auto r = rows(f);
  REQUIRE(r.size() == 6);
  CHECK(r[5] == nlohmann::json({{"step", 3}, {"loss", 3.7}}));
}

TEST_CASE("metrics: a run killed after its checkpoint resumes with every step once", "[metrics][train]") {
  auto comm = make_single_communicator();
  const Config cfg = tiny_run("metrics_resume");
  const fs::path run = cfg.run.out_dir;
  fs::remove_all(run);
  REQUIRE(train(cfg, *comm).steps == 4);
  const auto full = rows(run / "metrics.jsonl");

  // As if killed after step 4's row but before its checkpoint: latest is step 2, the rows of 3 and 4 exist,
  // and a row of a step that never ran (a fake row) and a half-written line follow.
  fs::remove_all(run / "checkpoints" / "step_00000004");
  spit(run / "checkpoints" / "latest", "step_00000002");
  std::ofstream(run / "metrics.jsonl", std::ios::app) << "{\"step\": 5, \"loss\": 1.0, \"fake\": true}\n{\"step\": 6, ";
  REQUIRE(train(cfg, *comm, run).steps == 4);

  std::map<int64_t, int> seen;
  const auto after = rows(run / "metrics.jsonl");
  for (const auto& j : after) {
    CHECK_FALSE(j.contains("fake"));
    if (j.contains("step")) ++seen[j["step"].get<int64_t>()];
  }
  CHECK(seen == std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}});
  // Steps 1 and 2 are the first run's rows; 3 and 4 were trained again, to the same losses (exact resume).
  REQUIRE(after.size() == full.size());
  for (size_t i = 0; i < after.size(); ++i) {
    INFO("row " << i);
    CHECK(after[i]["step"] == full[i]["step"]);
    if (full[i].contains("loss")) CHECK(after[i]["loss"] == full[i]["loss"]);
    if (full[i].contains("val_loss")) CHECK(after[i]["val_loss"] == full[i]["val_loss"]);
  }
}
