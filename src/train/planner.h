// Memory planner: measures one training micro-step at two micro-batch sizes on the configured
// device, fits peak bytes = fixed + per_sample x micro_batch per category, and reports the plan at
// the configured micro-batch and the largest micro-batch that fits.
#pragma once
#include <array>
#include <string>

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
  int64_t capacity = 0;                               // device bytes
  // Fraction of capacity a plan may use. 0.9: a BF16 GPT-2 124M run at the largest micro-batch of a
  // 95% plan peaked 1.8% above the plan, and the pool rounds and may hand out slightly larger blocks.
  double headroom = 0.90;
  int max_micro_batch = 0;                            // largest that fits (0: not even one)
  std::array<int, 2> measured{};                      // the two micro-batches measured
  int64_t parameters = 0;                             // the model's (GPT::num_parameters)

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
MemoryPlan plan_memory(const Config& cfg, int world);

}  // namespace fp8t
