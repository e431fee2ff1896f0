// ZeRO for the trainer: which shard of the flat buffers this rank's optimizer owns, how gradients
// are summed over ranks (stage 0 all-reduce, 1 reduce-scatter, 2 per-bucket reduce during the last
// backward), and the optimizer-shard part of checkpoints.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "config/config.h"
#include "dist/comm.h"
#include "nn/params.h"
#include "optim/adamw.h"

namespace fp8t {

class GradientReducer {
 public:
  GradientReducer(const DistributedConfig& cfg, Communicator& comm, ParameterStore& store);

  // Elements [begin, end) of the flat buffers whose optimizer state and updated gradient this
  // rank owns: everything at stage 0, an equal 1/world shard at stages 1 and 2.
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }

  // Stage 2 protocol for the last micro-batch of a step: before_forward() before its forward, then
  // tape.set_progress_hook(backward_hook()) before its backward. No-ops at stages 0 and 1.
  void before_forward();
  std::function<void(size_t)> backward_hook();

  // After the last backward: completes the reduction (this rank's shard, or everything at stage 0,
  // then holds the sum over ranks) and returns the squared norm of the whole rank-summed gradient.
  double reduce();

 private:
  struct Bucket {
    int64_t begin, end;
    int owner;         // the rank whose shard holds it
    size_t first_param;  // index of the first parameter overlapping it (specs().size() if padding)
  };
  void on_backward_progress();
  bool param_complete(size_t i) const;
  void launch(const Bucket& b);
  void inject_test_fault();

  DistributedConfig cfg_;
  Communicator& comm_;
  ParameterStore& store_;
  int64_t begin_ = 0, end_ = 0;
  int64_t bucket_elems_ = 0;
  std::vector<Bucket> buckets_;  // stage 2: descending offsets, never straddling a shard boundary
  size_t next_bucket_ = 0;       // stage 2: buckets_[0, next_bucket_) have been reduced this step
  size_t ready_from_ = 0;        // stage 2: parameters [ready_from_, n) have complete gradients
  std::vector<long> base_refs_;  // stage 2: use_count of each parameter Var at rest
  std::vector<bool> seen_;       // stage 2: referenced by the tape after the forward
  bool armed_ = false;
  int steps_ = 0;
};

// Optimizer state in checkpoints. At stage 0 every rank holds the same moments and rank 0 writes
// them; sharded, every rank writes its shard (optim_rankR.bin = m, optim_v_rankR.bin = v).
void save_optimizer_state(const std::filesystem::path& dir, const Communicator& comm, int zero_stage, AdamW& opt);
// Loads the moments for opt's range from a checkpoint written with (world, zero_stage), whatever
// this run's stage: the files are read as one logical vector and the range is cut out of it.
void load_optimizer_state(const std::filesystem::path& dir, int ckpt_world, int ckpt_zero_stage, AdamW& opt);

}  // namespace fp8t
