// A resharding resume's FP8 state and log line (train/reshard.h), on hand-written fp8_rankR.json files:
// the own file on the same ranks, every rank's merged on others, gradient amaxes rescaled for another
// ranks / tokens ratio, and damaged or disagreeing files named.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "train/reshard.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// One FP8 linear "h.0.qkv" whose three tensors have 3-entry histories; `a` sets the amaxes, `s` the scales.
json state(float a, float s, int pos = 1) {
  json j;
  for (const char* role : {"input", "weight", "grad_output"})
    j["h.0.qkv"][role] = {{"scale", s}, {"amax_history", {a, 2 * a, 0.5f * a}}, {"pos", pos}};
  return j;
}

fs::path fresh_dir() {
  const fs::path d = fs::temp_directory_path() / fmt::format("fp8t_reshard_{}", ::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& f, const json& j) { std::ofstream(f) << j.dump(); }

}  // namespace

TEST_CASE("checkpoint: a resharded resume merges every rank's FP8 state - its own on the same ranks",
          "[checkpoint][reshard]") {
  const fs::path dir = fresh_dir();
  write(dir / "fp8_rank0.json", state(1.0f, 8.0f));
  write(dir / "fp8_rank1.json", state(4.0f, 2.0f));
  // The same 2 ranks: each its own file, untouched.
  CHECK(resumed_fp8_state(dir, 2, 1, 2, 1.0).state == state(4.0f, 2.0f));
  CHECK(resumed_fp8_state(dir, 2, 0, 2, 1.0).source == (dir / "fp8_rank0.json").string());
  // 2 -> 1 and 2 -> 3: every new rank starts from the element-wise max of the histories, the min scale.
  for (const int rank : {0, 2}) {
    const ResumedFp8State r = resumed_fp8_state(dir, 2, rank, rank == 0 ? 1 : 3, 1.0);
    CHECK(r.state == state(4.0f, 2.0f));
    CHECK_THAT(r.source, ContainsSubstring("fp8_rank0.json to fp8_rank1.json merged"));
  }
  write(dir / "fp8_rank1.json", state(0.5f, 9.0f));
  CHECK(resumed_fp8_state(dir, 2, 0, 1, 1.0).state == state(1.0f, 8.0f));
  // Identical files (precision.fp8.reduce_amax) merge to themselves: the state every rank held.
  write(dir / "fp8_rank1.json", state(1.0f, 8.0f));
  CHECK(resumed_fp8_state(dir, 2, 0, 3, 1.0).state == state(1.0f, 8.0f));

  // Half the gradient per token (2 ranks -> 1 at the same tokens per step): grad_output's amaxes halve and
  // its scale doubles; inputs and weights keep theirs.
  const json half = resumed_fp8_state(dir, 2, 0, 1, 0.5).state;
  CHECK(half["h.0.qkv"]["input"] == state(1.0f, 8.0f)["h.0.qkv"]["input"]);
  CHECK(half["h.0.qkv"]["weight"] == state(1.0f, 8.0f)["h.0.qkv"]["weight"]);
  CHECK(half["h.0.qkv"]["grad_output"] == state(0.5f, 16.0f)["h.0.qkv"]["grad_output"]);
  CHECK(resumed_fp8_state(dir, 2, 1, 2, 0.5).state["h.0.qkv"]["grad_output"]["scale"] == 16.0f);

  // No FP8 state in the checkpoint: null, the run starts its scales fresh.
  fs::remove(dir / "fp8_rank0.json");
  fs::remove(dir / "fp8_rank1.json");
  CHECK(resumed_fp8_state(dir, 2, 0, 1, 1.0).state.is_null());
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: disagreeing or damaged FP8 state files are named when merged", "[checkpoint][reshard]") {
  const fs::path dir = fresh_dir();
  write(dir / "fp8_rank0.json", state(1.0f, 8.0f));
  write(dir / "fp8_rank1.json", state(1.0f, 8.0f, 2));  // another ring position
  CHECK_THROWS_WITH(resumed_fp8_state(dir, 2, 0, 1, 1.0),
                    ContainsSubstring("fp8_rank1.json: the FP8 state of h.0.qkv input has another amax history "
                                      "length or position"));
  json bad = state(1.0f, 8.0f);
  bad["h.0.qkv"]["weight"]["amax_history"][1] = "x";
  write(dir / "fp8_rank1.json", bad);
  CHECK_THROWS_WITH(resumed_fp8_state(dir, 2, 0, 1, 1.0),
                    ContainsSubstring("fp8_rank1.json: the FP8 state of h.0.qkv weight has a non-number"));
  bad = state(1.0f, 8.0f);
  bad["h.0.qkv"].erase("grad_output");
  write(dir / "fp8_rank0.json", bad);
  CHECK_THROWS_WITH(resumed_fp8_state(dir, 2, 0, 1, 1.0),
                    ContainsSubstring("fp8_rank0.json: the FP8 state of h.0.qkv has no valid 'grad_output'"));
  write(dir / "fp8_rank0.json", state(1.0f, 8.0f));
  fs::remove(dir / "fp8_rank1.json");
  CHECK_THROWS_WITH(resumed_fp8_state(dir, 2, 0, 1, 1.0), ContainsSubstring("fp8_rank1.json is missing"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: the reshard line and the gradient amax factor of a resume", "[checkpoint][reshard]") {
  Config written;
  written.train.micro_batch = 4;
  written.model.seq_len = 16;
  written.train.total_batch_tokens = 384;
  CheckpointState s{4, 2, 1, 4 * 384, written.to_yaml()};
  CHECK(reshard_line("ck", s, 2, 1).empty());
  CHECK(reshard_line("ck", s, 1, 1) ==
        "checkpoint ck: resharded from 2 ranks at ZeRO stage 1 to 1 rank at ZeRO stage 1");
  CHECK(reshard_line("ck", s, 2, 2) ==
        "checkpoint ck: resharded from 2 ranks at ZeRO stage 1 to 2 ranks at ZeRO stage 2");
  // Gradients per token scale as ranks / tokens per step.
  CHECK(fp8_grad_amax_factor(s, 2, 384) == 1.0);
  CHECK(fp8_grad_amax_factor(s, 1, 384) == 0.5);
  CHECK(fp8_grad_amax_factor(s, 3, 384) == 1.5);
  CHECK(fp8_grad_amax_factor(s, 2, 768) == 0.5);
  written.train.total_batch_tokens = 0;  // one micro-batch per rank: 128 tokens on 2 ranks, 64 on 1
  s.config_yaml = written.to_yaml();
  CHECK(fp8_grad_amax_factor(s, 1, 64) == 1.0);
  s.step = 0;  // no history yet
  CHECK(fp8_grad_amax_factor(s, 1, 384) == 1.0);
}
