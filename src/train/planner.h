// Memory planner: measures one training micro-step at two micro-batch sizes on the configured
// device, fits peak bytes = fixed + per_sample x micro_batch per category, and reports the plan at
// the configured micro-batch and the largest micro-batch that fits.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/allocator.h"

namespace fp8t {

struct MemoryPlan {
  int world = 1;                                      // ranks planned for (rank 0 of them is measured)
  int64_t grad_buffer_bytes = 0;                      // the whole flat gradient buffer
  int64_t grad_kept_bytes = 0;                        // what this rank keeps of it: all, or its stage-2 shard
  int micro_batch = 0;                                // the config's
  std::array<double, kNumMemCategories> fixed{};      // bytes independent of the micro-batch
  std::array<double, kNumMemCategories> per_sample{}; // bytes per sequence of the micro-batch
  double total_fixed = 0, total_per_sample = 0;       // of the whole-process peak
  double saved_per_sample = 0;                        // activation bytes the tape keeps for backward
  std::map<std::string, double> saved_by_role;        // the same per ActivationRole (core/allocator.h)
  double tokens_channels_layers = 0;                  // seq_len x d_model x n_layer of one sequence
  int64_t capacity = 0;                               // device bytes
  // Fraction of capacity a plan may use. 0.9: a BF16 GPT-2 124M run at the largest micro-batch of a
  // 95% plan peaked 1.8% above the plan, and the pool rounds and may hand out slightly larger blocks.
  double headroom = 0.90;
  int max_micro_batch = 0;                            // largest that fits (0: not even one)
  std::array<int, 2> measured{};                      // the two micro-batches measured
  int64_t parameters = 0;                             // the model's (GPT::num_parameters)
  int timed_micro_batch = 0;                          // the micro-batch timed (0: not timed)
  double step_seconds = 0;                            // one training micro-step there: forward, backward, update

  // Bytes of model state per parameter: the fixed parameters, gradients, optimizer and fp8_cache bytes.
  double state_bytes_per_parameter() const;

  double peak(int b) const { return total_fixed + total_per_sample * b; }
  double category(MemCategory c, int b) const {
    const auto i = static_cast<size_t>(c);
    return fixed[i] + per_sample[i] * b;
  }
  std::string table() const;  // human-readable report
};

// Runs two forward/backward micro-steps (micro-batches b and b + 1, b the smallest whose tokens fill
// one chunk of the head and loss) as rank 0 of `world` ranks at the config's ZeRO stage: the optimizer
// state sharded at stages 1 and 2, the gradients too at stage 2 (its shard plus the staging buckets, as
// measured; the collectives are skipped). Throws with the usual OOM report if even those fail.
// time_steps > 0: also times that many training micro-steps (forward, backward, optimizer update) at
// the configured micro-batch, or the largest that fits if that is smaller, after one untimed warm-up.
MemoryPlan plan_memory(const Config& cfg, int world, int time_steps = 0);

// One alternative to the user's config that the planner compares (fp8train plan --compare): its name
// ("activation_storage fp8_all", "recompute block", "BF16 mode", ...) and the config.
struct PlanOption {
  std::string name;
  Config cfg;
};
// The configured run first, then each storage, optimizer-state, recompute and ZeRO alternative that
// differs from it (ZeRO stages only for world > 1), then BF16 mode (FP32 master, gradients and moments,
// BF16 activations) when the config computes in FP8.
std::vector<PlanOption> plan_options(const Config& cfg, int world);
// The comparison table: per option the model state per parameter, saved bytes per sequence, the largest
// micro-batch that fits and tokens/s of the timed step, as a ratio to the first option.
std::string compare_table(const std::vector<PlanOption>& options, const std::vector<MemoryPlan>& plans);

// train.micro_batch auto (0): the config with the largest micro-batch the plan fits (rank 0 of `world`, the
// config's ZeRO stage, run.memory_limit_gib and the planner's headroom), lowered until
// train.total_batch_tokens is a multiple of micro_batch x seq_len x world; *why says how it was chosen.
// Any other micro_batch comes back unchanged. Throws when not even one sequence fits.
Config resolve_micro_batch(const Config& cfg, int world, std::string* why);

// Caps the device pool at run.memory_limit_gib (Allocator::set_limit; 0: no cap).
void apply_memory_limit(const RunConfig& run);

}  // namespace fp8t
