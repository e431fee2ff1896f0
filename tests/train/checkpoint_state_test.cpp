// state.json: every key type- and range-checked, each refusal naming state.json, the key and the value;
// resume refuses a step past this run's train.max_steps instead of replaying an absurd data order.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "checkpoint_test_util.h"
#include "train/checkpoint.h"

using namespace fp8t;
using namespace fp8t::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// A copy of the step-2 checkpoint whose state.json has `key` set to the JSON `value` (removed when empty).
fs::path with_state(const std::string& name, const std::string& key, const std::string& value) {
  const fs::path ck = copy_checkpoint(name);
  nlohmann::json s = read_json(ck / "state.json");
  if (value.empty()) s.erase(key);
  else s[key] = nlohmann::json::parse(value);
  write_json(ck / "state.json", s);
  reseal(ck);
  return ck;
}

std::string state_error(const fs::path& ck) {
  try {
    read_checkpoint_state(ck);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("state.json of " << ck << " was accepted");
  return "";
}

}  // namespace

TEST_CASE("state: each damaged key is refused naming state.json - the key and the value", "[checkpoint]") {
  struct Case {
    const char* key;
    const char* value;  // JSON; "" removes the key
    const char* words;
  };
  const Case cases[] = {
      {"step", "2.5", "key 'step' is 2.5, not an integer in [0, 2147483647]"},
      {"step", "4e50", "key 'step' is 4e+50, not an integer"},
      {"step", "-1", "key 'step' is -1, not an integer in [0, 2147483647]"},
      {"step", "3000000000", "key 'step' is 3000000000, not an integer"},
      {"step", "18446744073709551615", "key 'step' is 18446744073709551615, not an integer"},
      {"step", "\"2\"", "key 'step' is \"2\", not an integer"},
      {"step", "2.0", "key 'step' is 2.0, not an integer"},
      {"step", "", "key 'step' is missing"},
      {"step", "99", "key 'step' is 99, past the train.max_steps 4 of the config it records"},
      {"world_size", "0", "key 'world_size' is 0, not an integer in [1, 1048576]"},
      {"world_size", "-3", "key 'world_size' is -3"},
      {"world_size", "null", "key 'world_size' is null, not an integer"},
      {"zero_stage", "7", "key 'zero_stage' is 7, not an integer in [0, 2]"},
      {"zero_stage", "1", "key 'zero_stage' is 1 but the config it records has distributed.zero_stage 0"},
      {"tokens", "-128", "key 'tokens' is -128, not an integer in [0, 9223372036854775807]"},
      {"tokens", "", "key 'tokens' is missing"},
      {"config", "3", "key 'config' is 3, not a string"},
      {"config", "", "key 'config' is missing"},
      {"format", "\"something-else\"", "key 'format' is \"something-else\", not a checkpoint format"},
  };
  for (const Case& c : cases) {
    INFO(c.key << " = " << c.value);
    const fs::path ck = with_state("state", c.key, c.value);
    check_words(state_error(ck), {"state.json", c.words});
    if (std::string(c.key) == "step") check_words(resume_error(ck, "resume_state"), {"state.json", c.words});
  }
}

TEST_CASE("state: not JSON - not an object - a config that does not parse", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("state_text");
  spit(ck / "state.json", "{\"step\": 2, \"world_");
  CHECK_THAT(state_error(ck), ContainsSubstring("state.json is not valid JSON"));
  spit(ck / "state.json", "[1, 2, 3]");
  CHECK_THAT(state_error(ck), ContainsSubstring("state.json holds [1,2,3] where a JSON object was expected"));
  const fs::path bad_cfg = with_state("state_cfg", "config", "\"model: {n_layer: many}\"");
  CHECK_THAT(state_error(bad_cfg), ContainsSubstring("state.json (key 'config')") &&
                                       ContainsSubstring("n_layer"));
}

TEST_CASE("state: resume refuses a step past this run's train.max_steps", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("state_past", 4);
  CHECK_THAT(resume_error(ck, "resume_past", 3),
             ContainsSubstring("the checkpoint is at step 4, past this run's train.max_steps 3") &&
                 ContainsSubstring("raise train.max_steps"));
}

TEST_CASE("state: latest naming a path outside checkpoints/ is not followed", "[checkpoint]") {
  const fs::path run = scratch_root() / "latest_escape";
  fs::remove_all(run);
  fs::create_directories(run / "checkpoints");
  fs::copy(copy_checkpoint("latest_target"), run / "elsewhere");
  spit(run / "checkpoints" / "latest", "../elsewhere");
  CHECK_FALSE(latest_checkpoint(run).has_value());
  fs::copy(run / "elsewhere", run / "checkpoints" / "step_00000002");
  spit(run / "checkpoints" / "latest", "step_00000002\n");
  CHECK(latest_checkpoint(run) == run / "checkpoints" / "step_00000002");
}
