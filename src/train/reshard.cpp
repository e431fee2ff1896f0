// The FP8 scaling state and the log line of a resharding resume (see reshard.h).
#include "train/reshard.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

namespace fp8t {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kRoles[] = {"input", "weight", "grad_output"};

fs::path fp8_file(const fs::path& dir, int rank) { return dir / fmt::format("fp8_rank{}.json", rank); }

// obj[key], which must be there and of the type `is` checks; the error names the file, layer and role.
const json& member(const json& obj, const std::string& key, bool (json::*is)() const noexcept, const fs::path& file,
                   const std::string& where) {
  FP8T_CHECK(obj.is_object() && obj.contains(key) && (obj.at(key).*is)(),
             "{}: the FP8 state{}{} has no valid '{}': the file is damaged", file.string(), where.empty() ? "" : " ",
             where, key);
  return obj.at(key);
}

// Folds `other` (from `file`) into `into` (rank 0's): history entries by max, scales by min; the layers,
// history lengths and ring positions must agree (every rank ends every step together).
void merge_into(json& into, const json& other, const fs::path& file, const fs::path& first) {
  FP8T_CHECK(other.size() == into.size(), "{} holds {} FP8 layers but {} holds {}: the checkpoint is damaged",
             file.string(), other.size(), first.string(), into.size());
  for (auto& [layer, metas] : into.items()) {
    for (const char* role : kRoles) {
      const std::string where = fmt::format("of {} {}", layer, role);
      const json& o = member(member(other, layer, &json::is_object, file, ""), role, &json::is_object, file,
                             "of " + layer);
      json& m = metas.at(role);
      const json& oh = member(o, "amax_history", &json::is_array, file, where);
      json& h = m.at("amax_history");
      FP8T_CHECK(oh.size() == h.size() && member(o, "pos", &json::is_number_integer, file, where) == m.at("pos"),
                 "{}: the FP8 state {} has another amax history length or position than {}: the checkpoint's "
                 "ranks disagree (damaged?)", file.string(), where, first.string());
      for (size_t i = 0; i < h.size(); ++i) {
        FP8T_CHECK(oh[i].is_number(), "{}: the FP8 state {} has a non-number in its amax history", file.string(),
                   where);
        h[i] = std::max(h[i].get<float>(), oh[i].get<float>());
      }
      m["scale"] = std::min(m.at("scale").get<float>(), member(o, "scale", &json::is_number, file, where).get<float>());
    }
  }
}

// Checks rank 0's file has the form merge_into() and the rescale walk over (load_fp8_state checks the rest).
void check_form(const json& state, const fs::path& file) {
  for (const auto& [layer, metas] : state.items())
    for (const char* role : kRoles) {
      const std::string where = fmt::format("of {} {}", layer, role);
      const json& m = member(member(state, layer, &json::is_object, file, ""), role, &json::is_object, file,
                             "of " + layer);
      for (const json& x : member(m, "amax_history", &json::is_array, file, where))
        FP8T_CHECK(x.is_number(), "{}: the FP8 state {} has a non-number in its amax history", file.string(), where);
      member(m, "pos", &json::is_number_integer, file, where);
      member(m, "scale", &json::is_number, file, where);
    }
}

}  // namespace

std::string reshard_line(const fs::path& dir, const CheckpointState& s, int world, int zero_stage) {
  if (s.world_size == world && s.zero_stage == zero_stage) return "";
  const auto ranks = [](int n) { return fmt::format("{} rank{}", n, n == 1 ? "" : "s"); };
  return fmt::format("checkpoint {}: resharded from {} at ZeRO stage {} to {} at ZeRO stage {}", dir.string(),
                     ranks(s.world_size), s.zero_stage, ranks(world), zero_stage);
}

ResumedFp8State resumed_fp8_state(const fs::path& dir, int ckpt_world, int rank, int world, double grad_amax_factor) {
  ResumedFp8State out;
  if (ckpt_world == world) {
    // Rank 0's file where the rank's own is missing: checkpoints from before per-rank files.
    out.source = fp8_file(dir, fs::exists(fp8_file(dir, rank)) ? rank : 0).string();
    if (fs::exists(out.source)) out.state = read_json_object(out.source);
  } else if (fs::exists(fp8_file(dir, 0))) {
    out.source = fmt::format("{} to {} merged", fp8_file(dir, 0).string(),
                             fp8_file(dir, ckpt_world - 1).filename().string());
    out.state = read_json_object(fp8_file(dir, 0));
    check_form(out.state, fp8_file(dir, 0));
    for (int r = 1; r < ckpt_world; ++r) {
      FP8T_CHECK(fs::exists(fp8_file(dir, r)), "{} is missing (the checkpoint has {}): the checkpoint is incomplete",
                 fp8_file(dir, r).string(), fp8_file(dir, 0).filename().string());
      merge_into(out.state, read_json_object(fp8_file(dir, r)), fp8_file(dir, r), fp8_file(dir, 0));
    }
  }
  if (out.state.is_null() || grad_amax_factor == 1.0) return out;
  if (ckpt_world == world) check_form(out.state, out.source);
  for (auto& [layer, metas] : out.state.items()) {
    json& g = metas.at("grad_output");
    for (json& a : g.at("amax_history")) a = static_cast<float>(a.get<double>() * grad_amax_factor);
    const auto scale = static_cast<float>(g.at("scale").get<double>() / grad_amax_factor);
    if (std::isfinite(scale) && scale > 0) g["scale"] = scale;
  }
  return out;
}

double fp8_grad_amax_factor(const CheckpointState& s, int world, int64_t tokens_per_step) {
  if (s.step == 0) return 1.0;
  const Config written = parse_config(s.config_yaml, "the checkpoint's state.json");
  const TrainConfig& t = written.train;
  const int64_t micro = static_cast<int64_t>(t.micro_batch) * written.model.seq_len * s.world_size;
  const int64_t ckpt_tokens = t.total_batch_tokens > 0 ? t.total_batch_tokens : micro > 0 ? micro : s.tokens / s.step;
  if (ckpt_tokens <= 0 || tokens_per_step <= 0) return 1.0;
  return (static_cast<double>(world) / static_cast<double>(tokens_per_step)) /
         (static_cast<double>(s.world_size) / static_cast<double>(ckpt_tokens));
}

}  // namespace fp8t
