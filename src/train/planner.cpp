// Memory planner by measurement: activations grow linearly with the micro-batch, everything else
// is fixed, so two measured points give the whole line.
#include "train/planner.h"

#include <cmath>
#include <random>

#include "autograd/tape.h"
#include "dist/zero.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace fp8t {

namespace {
// Rank 0 of `world` ranks whose collectives do nothing: the planner measures memory, not values.
class PlanningComm final : public Communicator {
 public:
  explicit PlanningComm(int world) : world_(world) {}
  int rank() const override { return 0; }
  int size() const override { return world_; }
  std::string backend() const override { return "plan"; }
  void all_reduce(Tensor&, ReduceOp) override {}
  void reduce_scatter(const Tensor&, Tensor&, ReduceOp) override {}
  void all_gather(const Tensor&, Tensor&) override {}
  void broadcast(Tensor&, int) override {}
  void barrier() override {}

 private:
  int world_;
};

// Peak bytes per category during one forward/backward at micro-batch b, staged through `reducer` as
// the trainer does; `saved` gets the activation bytes alive between forward and backward (what the
// tape keeps for backward).
MemoryStats measure(GPT& model, GradientReducer& reducer, const Config& cfg, int b, int64_t* saved = nullptr) {
  const Device d = cfg.run.device;
  const int T = cfg.model.seq_len;
  Tensor x = Tensor::empty({b, T}, DType::i32), y = Tensor::empty({b, T}, DType::i32);
  std::mt19937 rng(static_cast<uint32_t>(b));
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data<int32_t>()[i] = static_cast<int32_t>(rng() % cfg.model.vocab_size);
    y.data<int32_t>()[i] = static_cast<int32_t>(rng() % cfg.model.vocab_size);
  }
  const Tensor xd = x.to(d), yd = y.to(d);
  Allocator& alloc = allocator_for(d);
  alloc.reset_peaks();
  {
    Tape tape;
    Var loss;
    reducer.begin_micro();
    {
      TapeScope scope(&tape);
      loss = model.loss(xd, yd, cfg.train.recompute == Recompute::block);
    }
    if (saved) *saved = alloc.stats().cur(MemCategory::activations);
    tape.set_progress_hook(reducer.backward_hook());
    tape.backward(loss);
    reducer.end_micro();
    if (reducer.staged()) (void)reducer.reduce();  // retires the buckets still in flight
    (void)loss->value.to_float_vector();  // wait for the device
  }
  return alloc.stats();
}
}  // namespace

MemoryPlan plan_memory(const Config& cfg, int world) {
  FP8T_CHECK(world >= 1, "plan: --world must be >= 1, got {}", world);
  const DType compute = cfg.run.device.is_cpu() || cfg.precision.compute == ComputeMode::fp32 ? DType::f32
                                                                                              : DType::bf16;
  // As rank 0 of `world`: at ZeRO stage 2 the store holds its gradient shard and the buckets are staged.
  GPT model(cfg.model, cfg.run.device, compute, world, cfg.precision, gradient_shard(cfg.distributed, 0, world));
  model.set_recompute_layernorm(cfg.train.recompute == Recompute::layernorm);
  model.init(cfg.run.seed);
  ParameterStore& P = model.params();
  PlanningComm comm(world);
  GradientReducer reducer(cfg.distributed, comm, P);
  AdamW optim(cfg.optim, P, reducer.shard_begin(), reducer.shard_end());

  // The two micro-batches must both fill at least one chunk of the head and loss: below that the
  // chunk of logits grows with the micro-batch, above it stays one chunk (a fixed cost), and a line
  // through two points under it would charge every sequence its whole logits.
  const int T = cfg.model.seq_len;
  const int b1 = static_cast<int>(std::max<int64_t>(1, (model.head_chunk_rows() + T - 1) / T)), b2 = b1 + 1;
  (void)measure(model, reducer, cfg, b1);  // first touch: FP8 weight caches, GEMM workspace
  int64_t saved1 = 0, saved2 = 0;
  const MemoryStats m1 = measure(model, reducer, cfg, b1, &saved1), m2 = measure(model, reducer, cfg, b2, &saved2);
  MemoryPlan plan;
  plan.saved_per_sample = static_cast<double>(saved2 - saved1);
  plan.measured = {b1, b2};
  plan.world = world;
  plan.grad_buffer_bytes = P.padded_numel() * static_cast<int64_t>(dtype_size(P.grad_dtype()));
  plan.grad_kept_bytes = P.grads().nbytes();
  plan.parameters = model.num_parameters();
  plan.micro_batch = cfg.train.micro_batch;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    plan.per_sample[i] = std::max<double>(0.0, static_cast<double>(m2.peak[i] - m1.peak[i]));
    plan.fixed[i] = static_cast<double>(m1.peak[i]) - plan.per_sample[i] * b1;
  }
  plan.total_per_sample = std::max<double>(0.0, static_cast<double>(m2.total_peak - m1.total_peak));
  plan.total_fixed = static_cast<double>(m1.total_peak) - plan.total_per_sample * b1;
  plan.capacity = allocator_for(cfg.run.device).capacity();
  const double room = plan.capacity * plan.headroom - plan.total_fixed;
  plan.max_micro_batch = room <= 0 ? 0
                         : plan.total_per_sample <= 0
                             ? 1 << 20
                             : static_cast<int>(std::floor(room / plan.total_per_sample));
  return plan;
}

double MemoryPlan::state_bytes_per_parameter() const {
  double bytes = 0;
  for (MemCategory c : {MemCategory::parameters, MemCategory::gradients, MemCategory::optimizer, MemCategory::fp8_cache})
    bytes += fixed[static_cast<size_t>(c)];
  return parameters > 0 ? bytes / static_cast<double>(parameters) : 0.0;
}

std::string MemoryPlan::table() const {
  std::string s = fmt::format("{:<12} {:>14} {:>14} {:>16}\n", "category", "fixed", "per sequence",
                              fmt::format("at micro_batch {}", micro_batch));
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    const auto c = static_cast<MemCategory>(i);
    s += fmt::format("{:<12} {:>14} {:>14} {:>16}\n", category_name(c), format_bytes(std::llround(fixed[i])),
                     format_bytes(std::llround(per_sample[i])), format_bytes(std::llround(category(c, micro_batch))));
  }
  s += fmt::format("{:<12} {:>14} {:>14} {:>16}\n", "peak", format_bytes(std::llround(total_fixed)),
                   format_bytes(std::llround(total_per_sample)), format_bytes(std::llround(peak(micro_batch))));
  s += fmt::format("saved for backward: {} per sequence, {} at micro_batch {}\n",
                   format_bytes(std::llround(saved_per_sample)), format_bytes(std::llround(saved_per_sample * micro_batch)),
                   micro_batch);
  s += fmt::format("(a line through micro-batches {} and {}, measured)\n", measured[0], measured[1]);
  auto per_param = [&](MemCategory c) { return fixed[static_cast<size_t>(c)] / std::max<double>(1.0, parameters); };
  s += fmt::format("model state: {:.2f} bytes per parameter on this rank (parameters {:.2f}, gradients {:.2f}, "
                   "optimizer {:.2f}, fp8_cache {:.2f}; {} parameters)\n",
                   state_bytes_per_parameter(), per_param(MemCategory::parameters),
                   per_param(MemCategory::gradients), per_param(MemCategory::optimizer),
                   per_param(MemCategory::fp8_cache), parameters);
  if (grad_kept_bytes < grad_buffer_bytes)
    s += fmt::format("gradients: this rank's shard {} (1/{} of the {} buffer) + staging buckets, at most {} "
                     "(distributed.bucket_mb; wte's bucket is as large as wte)\n",
                     format_bytes(grad_kept_bytes), world, format_bytes(grad_buffer_bytes),
                     format_bytes(std::llround(fixed[static_cast<size_t>(MemCategory::gradients)]) - grad_kept_bytes));
  s += fmt::format("device capacity {} (planning to {:.0f}%): largest micro_batch that fits: {}{}\n",
                   format_bytes(capacity), headroom * 100, max_micro_batch,
                   peak(micro_batch) > capacity * headroom ? fmt::format(" — the configured {} does NOT fit", micro_batch)
                                                          : "");
  return s;
}

}  // namespace fp8t
