// ZeRO for the trainer: which shard of the flat buffers this rank's optimizer owns, how gradients
// are summed over ranks (stage 0 all-reduce, 1 reduce-scatter, 2 per-bucket reduction during every
// backward into a gradient shard). The optimizer shards in checkpoints: train/optimizer_checkpoint.h.
#pragma once
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "dist/comm.h"
#include "nn/gpt.h"
#include "nn/params.h"
#include "optim/adamw.h"

namespace fp8t {

// The gradients a rank's ParameterStore allocates: at ZeRO stage 2 with several ranks only its shard
// (GradientReducer stages the rest bucket by bucket), else the whole buffer.
FlatShard gradient_shard(const DistributedConfig& cfg, int rank, int world);

// The part of the f32 master a rank's ParameterStore keeps: at ZeRO stages 1 and 2 with several ranks its
// optimizer shard (the parameters then travel in their compute dtype: GPT::publish_weights), else all of it.
FlatShard master_shard(const DistributedConfig& cfg, int rank, int world);

// GPT::publish_weights's collectives over comm (empty functions on a single rank).
WeightCollectives weight_collectives(Communicator& comm);

// The whole f32 master (padded_numel values, flat order) on the host of every rank, all-gathered from the
// shards in rounds of at most 64 MiB per rank where the master is sharded (a collective: every rank calls it).
Tensor gather_master(Communicator& comm, ParameterStore& store);

class GradientReducer {
 public:
  // Stage 2: at most this many buckets' reductions in flight; launching one more first retires the
  // oldest (waits for it, adds it into the shard, frees its staging buffer).
  static constexpr size_t kMaxInFlight = 2;

  // At stage 2 with several ranks the store must hold only this rank's gradient shard
  // (gradient_shard()); the reducer then supplies the parameters' gradients (GradCell::make_grad).
  GradientReducer(const DistributedConfig& cfg, Communicator& comm, ParameterStore& store);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Elements [begin, end) of the flat buffers whose optimizer state and updated gradient this
  // rank owns: everything at stage 0, an equal 1/world shard at stages 1 and 2.
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  // Stage 2 with several ranks: gradients staged in buckets and reduced during every backward.
  bool staged() const { return staged_; }

  // Every micro-batch: begin_micro() before its forward, end_micro() after its backward. With bf16 gradients they
  // arm the store's f32 accumulators (ParameterStore::arm_accumulators) and commit their deferred adds, unless staged
  // (then the ops' f32 temporaries go into the gradient as before). When staged(): begin_micro() before the forward
  // (the head writes wte's gradient there), tape.set_progress_hook(backward_hook()) before its backward, end_micro()
  // after it, which launches the buckets still pending; otherwise the hook is empty.
  void begin_micro();
  std::function<void(size_t)> backward_hook();
  void end_micro();

  // After the last micro-batch: completes the reduction (this rank's shard, or everything at stage 0,
  // then holds the sum over ranks) and returns the squared norm of the whole rank-summed gradient.
  double reduce();
  // reduce() on one rank of a GPU, with the step's summed loss (a device f32 scalar) read back in the same wait, so
  // the step's end waits on the device once: {loss sum, squared norm}, the f32 values the separate reads give.
  // nullopt, with nothing queued, where reduce() has collectives to run (several ranks) or no device to queue on.
  std::optional<std::pair<float, float>> reduce_with_loss(const Tensor& loss_sum);

  // Stage-2 buckets, for the memory accounting and tests: bucket b holds whole parameters.
  size_t num_buckets() const { return buckets_.size(); }
  size_t bucket_of(const std::string& param) const;
  int64_t bucket_bytes(size_t b) const;
  int64_t max_bucket_bytes() const;

 private:
  struct Piece {  // the part of a bucket in one rank's shard: reduced to that rank
    int64_t begin, end;
    int owner;
  };
  struct Bucket {
    int64_t begin, end;             // flat elements
    size_t first_param, end_param;  // parameters [first_param, end_param)
    std::vector<Piece> pieces;      // cut at shard boundaries
    Tensor staging;                 // this micro-batch's local gradients, while they accumulate
  };
  struct InFlight {  // a launched reduction not yet added into the shard
    size_t bucket;
    Tensor staging;
    uint64_t ticket;
  };
  Tensor stage(size_t param);
  bool param_complete(size_t i) const;
  bool bucket_complete(const Bucket& b) const;
  void on_backward_progress();
  void launch(size_t b);
  void retire_oldest();

  DistributedConfig cfg_;
  Communicator& comm_;
  ParameterStore& store_;
  int64_t begin_ = 0, end_ = 0;
  int64_t bucket_elems_ = 0;
  bool staged_ = false;
  std::vector<Bucket> buckets_;           // stage 2: descending offsets (the order gradients complete in)
  std::vector<size_t> bucket_of_param_;   // stage 2: each parameter's bucket
  std::deque<InFlight> in_flight_;        // stage 2: oldest first, at most kMaxInFlight
  size_t next_bucket_ = 0;                // stage 2: buckets_[0, next_bucket_) launched this micro-batch
  std::vector<long> base_uses_, base_cell_uses_;  // stage 2: use counts of each parameter's Var and GradCell at rest
  std::vector<bool> touched_;             // stage 2: gradient written this micro-batch
  bool armed_ = false;                    // stage 2: between begin_micro() and end_micro()
};

}  // namespace fp8t
