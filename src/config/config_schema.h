// The config schema, private to config/: every YAML key once, with its field and valid values.
// visit_fields() drives reading (config.cpp), writing (to_yaml) and the index of known keys.
#pragma once
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"

namespace fp8t::config_schema {

// ---- names of enum values, in declaration order ----
inline constexpr std::array<std::string_view, 3> kRecomputeNames{"none", "block", "layernorm"};
inline constexpr std::array<std::string_view, 3> kScheduleNames{"cosine", "linear", "constant"};
inline constexpr std::array<std::string_view, 3> kComputeNames{"fp32", "bf16", "fp8"};
inline constexpr std::array<std::string_view, 3> kStateDtypeNames{"fp32", "bf16", "fp8"};
inline constexpr std::array<std::string_view, 3> kGradDtypeNames{"auto", "fp32", "bf16"};
inline constexpr std::array<std::string_view, 2> kFormatNames{"hybrid", "e4m3"};
inline constexpr std::array<std::string_view, 2> kScalingNames{"delayed", "current"};
inline constexpr std::array<std::string_view, 2> kAmaxNames{"max", "most_recent"};
inline constexpr std::array<std::string_view, 3> kStorageNames{"fp8", "bf16", "fp8_all"};
inline constexpr std::array<std::string_view, 2> kDeviceNames{"cpu", "cuda"};
inline constexpr std::array<std::string_view, 1> kArchNames{"gpt2"};
inline constexpr std::array<std::string_view, 5> kLayerNames{"qkv", "proj", "fc", "fc2", "lm_head"};
inline constexpr std::array<std::string_view, 3> kGemmNames{"forward", "dgrad", "wgrad"};

using Choices = std::span<const std::string_view>;
inline Choices names_of(Recompute) { return kRecomputeNames; }
inline Choices names_of(Schedule) { return kScheduleNames; }
inline Choices names_of(ComputeMode) { return kComputeNames; }
inline Choices names_of(StateDtype) { return kStateDtypeNames; }
inline Choices names_of(GradDtype) { return kGradDtypeNames; }
inline Choices names_of(Fp8Formats) { return kFormatNames; }
inline Choices names_of(Fp8Scaling) { return kScalingNames; }
inline Choices names_of(AmaxAlgo) { return kAmaxNames; }
inline Choices names_of(ActivationStorage) { return kStorageNames; }

inline std::string one_of(Choices choices) {
  return fmt::format("one of {}", fmt::join(choices, ", "));
}

// A numeric range; bounds are inclusive unless marked open.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  bool or_auto = false;  // the word `auto` is also valid, read as 0 (and 0 written as `auto`)
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string str() const {
    if (hi == std::numeric_limits<double>::infinity())
      return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
    return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
};
constexpr Range at_least(double lo) { return {lo}; }
constexpr Range auto_or_at_least(double lo) {
  return {lo, std::numeric_limits<double>::infinity(), false, false, true};
}
constexpr Range above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true}; }
constexpr Range between(double lo, double hi) { return {lo, hi}; }
inline constexpr Range kBetaRange{0, 1, false, true};  // [0, 1)
// padded_vocab() (a multiple of 128) must stay an int.
inline constexpr double kMaxVocabSize = 2147483647 - 127;
// A bucket is one MPI/NCCL count of f32 elements: below 2^31.
inline constexpr Range kBucketMbRange{0, 4096, true, false};  // (0, 4096]
// A deadline of steady_clock (int64 nanoseconds) must not overflow: at most 30 days.
inline constexpr Range kTimeoutRange{0, 30 * 86400, true, false};

// The schema: every key, its field, and its valid values. V is a Reader, Writer or KeyLister.
template <class C, class V>
void visit_fields(C& c, V& v) {
  auto& r = c.run;
  v("run.name", r.name);
  v("run.out_dir", r.out_dir);
  v("run.seed", r.seed);
  v("run.device", r.device);
  v("run.log_every", r.log_every, at_least(1));
  v("run.gemm_autotune", r.gemm_autotune);
  v("run.memory_limit_gib", r.memory_limit_gib, at_least(0));
  v("run.peak_tflops", r.peak_tflops, at_least(0));
  auto& m = c.model;
  v("model.arch", m.arch, Choices(kArchNames));
  v("model.n_layer", m.n_layer, at_least(1));
  v("model.n_head", m.n_head, at_least(1));
  v("model.d_model", m.d_model, at_least(1));
  v("model.vocab_size", m.vocab_size, between(1, kMaxVocabSize));
  v("model.seq_len", m.seq_len, at_least(1));
  v("data.train", c.data.train);
  v("data.val", c.data.val);
  v("data.shuffle", c.data.shuffle);
  auto& t = c.train;
  v("train.micro_batch", t.micro_batch, auto_or_at_least(1));
  v("train.total_batch_tokens", t.total_batch_tokens, at_least(0));
  v("train.max_steps", t.max_steps, at_least(1));
  v("train.eval_every", t.eval_every, at_least(0));
  v("train.eval_steps", t.eval_steps, at_least(1));
  v("train.checkpoint_every", t.checkpoint_every, at_least(-1));
  v("train.recompute", t.recompute);
  v("train.skip_nonfinite_steps", t.skip_nonfinite_steps);
  v("train.cuda_graph", t.cuda_graph);
  v("train.max_skipped_steps", t.max_skipped_steps, at_least(1));
  v("train.init_from", t.init_from);
  auto& o = c.optim;
  v("optim.lr", o.lr, above(0));
  v("optim.min_lr_ratio", o.min_lr_ratio, between(0, 1));
  v("optim.warmup_steps", o.warmup_steps, at_least(0));
  v("optim.schedule", o.schedule);
  v.pair("optim.betas", o.beta1, o.beta2, kBetaRange);
  v("optim.eps", o.eps, above(0));
  v("optim.weight_decay", o.weight_decay, at_least(0));
  v("optim.grad_clip", o.grad_clip, at_least(0));
  v("optim.state_dtype", o.state_dtype);
  auto& f = c.precision.fp8;
  v("precision.compute", c.precision.compute);
  v("precision.grad_dtype", c.precision.grad_dtype);
  v("precision.fp8.format", f.format);
  v("precision.fp8.scaling", f.scaling);
  v("precision.fp8.amax_history_len", f.amax_history_len, between(1, 65536));
  v("precision.fp8.amax_compute_algo", f.amax_compute_algo);
  v("precision.fp8.margin", f.margin, between(0, 64));
  v("precision.fp8.layers", f.layers, Choices(kLayerNames));
  v("precision.fp8.bf16_first_blocks", f.bf16_first_blocks, at_least(0));
  v("precision.fp8.bf16_last_blocks", f.bf16_last_blocks, at_least(0));
  v("precision.fp8.activation_storage", f.activation_storage);
  v("precision.fp8.reduce_amax", f.reduce_amax);
  v("precision.fp8.monitor_every", f.monitor_every, at_least(0));
  v("precision.fp8.fast_accum", f.fast_accum, Choices(kGemmNames));
  auto& d = c.distributed;
  v("distributed.zero_stage", d.zero_stage, between(0, 2));
  v("distributed.bucket_mb", d.bucket_mb, kBucketMbRange);
  v("distributed.timeout_s", d.timeout_s, kTimeoutRange);
}

inline std::pair<std::string, std::string> split_last(std::string_view path) {
  size_t dot = path.rfind('.');
  if (dot == std::string_view::npos) return {"", std::string(path)};
  return {std::string(path.substr(0, dot)), std::string(path.substr(dot + 1))};
}

// A visit_fields() visitor that only collects the keys.
struct KeyLister {
  std::vector<std::string>& keys;
  template <class... A>
  void operator()(std::string_view key, A&&...) { keys.emplace_back(key); }
  template <class... A>
  void pair(std::string_view key, A&&...) { keys.emplace_back(key); }
};

// Every dotted key (leaves) and every section (their proper prefixes).
struct Schema {
  std::vector<std::string> leaves;
  std::set<std::string, std::less<>> leaf_set, sections;

  Schema() {
    KeyLister lister{leaves};
    Config dummy;
    visit_fields(dummy, lister);
    for (const auto& k : leaves) {
      leaf_set.insert(k);
      for (size_t dot = k.find('.'); dot != std::string::npos; dot = k.find('.', dot + 1))
        sections.insert(k.substr(0, dot));
    }
  }
  // Last components of the keys and sections directly under `parent` ("" = top level), in order.
  std::vector<std::string> children(std::string_view parent) const {
    std::vector<std::string> out;
    const std::string prefix = parent.empty() ? "" : std::string(parent) + ".";
    for (const auto& k : leaves) {
      if (!k.starts_with(prefix)) continue;
      std::string child = k.substr(prefix.size(), k.find('.', prefix.size()) - prefix.size());
      if (std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
    }
    return out;
  }
};

inline const Schema& schema() {
  static const Schema s;
  return s;
}

}  // namespace fp8t::config_schema
