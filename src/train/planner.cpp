// Memory planner by measurement: activations grow linearly with the micro-batch, everything else
// is fixed, so two measured points give the whole line.
#include "train/planner.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <random>

#include "autograd/tape.h"
#include "dist/zero.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace fp8t {

namespace {

// Peak bytes per category during one forward/backward at micro-batch b, staged through `reducer` as
// the trainer does; `saved` gets the activation bytes alive between forward and backward (what the
// tape keeps for backward).
MemoryStats measure(GPT& model, GradientReducer& reducer, const Config& cfg, int b, int64_t* saved = nullptr,
                    std::map<std::string, int64_t>* roles = nullptr) {
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
    if (roles) *roles = alloc.role_bytes();
    tape.set_progress_hook(reducer.backward_hook());
    tape.backward(loss);
    reducer.end_micro();
    if (reducer.staged()) (void)reducer.reduce();  // retires the buckets still in flight
    (void)loss->value.to_float_vector();  // wait for the device
  }
  return alloc.stats();
}
}  // namespace

void apply_memory_limit(const RunConfig& run) {
  allocator_for(run.device).set_limit(std::llround(run.memory_limit_gib * double(int64_t{1} << 30)));
}

MemoryPlan plan_memory(const Config& cfg, int world, int time_steps) {
  FP8T_CHECK(world >= 1, "plan: --world must be >= 1, got {}", world);
  apply_memory_limit(cfg.run);
  const DType compute = cfg.run.device.is_cpu() || cfg.precision.compute == ComputeMode::fp32 ? DType::f32
                                                                                              : DType::bf16;
  // As rank 0 of `world`: at ZeRO stage 2 the store holds its gradient shard and the buckets are staged.
  // At stages 1 and 2 it keeps its shard of the master; its publish_weights gathers nothing (one process).
  GPT model(cfg.model, cfg.run.device, compute, world, cfg.precision, gradient_shard(cfg.distributed, 0, world),
            master_shard(cfg.distributed, 0, world));
  model.set_recompute_layernorm(cfg.train.recompute == Recompute::layernorm);
  model.init(cfg.run.seed);
  model.publish_weights({});
  ParameterStore& P = model.params();
  // Rank 0 of `world` ranks whose collectives do nothing: the planner measures memory, not values.
  const std::unique_ptr<Communicator> comm = make_standin_communicator(0, world);
  GradientReducer reducer(cfg.distributed, *comm, P);
  AdamW optim(cfg.optim, P, reducer.shard_begin(), reducer.shard_end());

  // The two micro-batches must both fill at least one chunk of the head and loss: below that the
  // chunk of logits grows with the micro-batch, above it stays one chunk (a fixed cost), and a line
  // through two points under it would charge every sequence its whole logits.
  const int T = cfg.model.seq_len;
  const int b1 = static_cast<int>(std::max<int64_t>(1, (model.head_chunk_rows() + T - 1) / T)), b2 = b1 + 1;
  (void)measure(model, reducer, cfg, b1);  // first touch: FP8 weight caches, GEMM workspace
  int64_t saved1 = 0, saved2 = 0;
  std::map<std::string, int64_t> roles1, roles2;
  const MemoryStats m1 = measure(model, reducer, cfg, b1, &saved1, &roles1),
                    m2 = measure(model, reducer, cfg, b2, &saved2, &roles2);
  MemoryPlan plan;
  plan.saved_per_sample = static_cast<double>(saved2 - saved1);
  for (const auto& [role, bytes] : roles2) {
    const auto it = roles1.find(role);
    plan.saved_by_role[role] = static_cast<double>(bytes - (it != roles1.end() ? it->second : 0));
  }
  plan.tokens_channels_layers = double(T) * cfg.model.d_model * cfg.model.n_layer;
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
  if (time_steps > 0 && plan.max_micro_batch >= 1) {
    const int b = std::min(cfg.train.micro_batch, plan.max_micro_batch);
    auto step = [&] {
      (void)measure(model, reducer, cfg, b);
      (void)optim.step(1, 1e-9f, 1.0f);
      model.on_optimizer_step();
      model.publish_weights({});
      (void)P.master().slice_flat(0, {1}).to_float_vector();  // wait for the device
    };
    step();  // warm-up: this micro-batch's first allocations and GEMM plans
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < time_steps; ++i) step();
    plan.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / time_steps;
    plan.timed_micro_batch = b;
  }
  return plan;
}

Config resolve_micro_batch(const Config& cfg, int world, std::string* why) {
  if (cfg.train.micro_batch != 0) return cfg;
  const MemoryPlan p = plan_memory(cfg, world);
  allocator_for(cfg.run.device).release_cached();  // the run starts from an empty pool
  FP8T_CHECK(p.max_micro_batch >= 1,
             "train.micro_batch: auto: not even one sequence fits: {} fixed + {} per sequence in {:.0f}% of {}; "
             "lower model.seq_len, raise distributed.zero_stage or use a smaller model",
             format_bytes(std::llround(p.total_fixed)), format_bytes(std::llround(p.total_per_sample)),
             p.headroom * 100, format_bytes(p.capacity));
  const int64_t T = cfg.model.seq_len, total = cfg.train.total_batch_tokens;
  int b = std::min(p.max_micro_batch, 1 << 20);
  while (b > 1 && total != 0 && total % (int64_t{b} * T * world) != 0) --b;
  FP8T_CHECK(total == 0 || total % (int64_t{b} * T * world) == 0,
             "train.micro_batch: auto: train.total_batch_tokens {} is not a multiple of seq_len x ranks = {} x {}",
             total, T, world);
  Config out = cfg;
  out.train.micro_batch = b;
  if (why)
    *why = fmt::format("train.micro_batch auto = {}: the plan fits {} ({} fixed + {} per sequence in {:.0f}% of {}){}",
                       b, p.max_micro_batch, format_bytes(std::llround(p.total_fixed)),
                       format_bytes(std::llround(p.total_per_sample)), p.headroom * 100, format_bytes(p.capacity),
                       b < p.max_micro_batch ? fmt::format("; {} divides train.total_batch_tokens {} into whole "
                                                           "micro-batches",
                                                           b, total)
                                             : "");
  return out;
}

std::vector<PlanOption> plan_options(const Config& cfg, int world) {
  std::vector<PlanOption> out{{"as configured", cfg}};
  auto add = [&](std::string name, auto&& change) {
    Config c = cfg;
    change(c);
    out.push_back({std::move(name), std::move(c)});
  };
  const bool fp8 = cfg.precision.compute == ComputeMode::fp8;
  if (fp8) {
    const std::pair<ActivationStorage, const char*> storages[] = {
        {ActivationStorage::bf16, "bf16"}, {ActivationStorage::fp8, "fp8"}, {ActivationStorage::fp8_all, "fp8_all"}};
    for (const auto& [s, name] : storages)
      if (s != cfg.precision.fp8.activation_storage)
        add(fmt::format("activation_storage {}", name), [s](Config& c) { c.precision.fp8.activation_storage = s; });
  }
  const std::pair<StateDtype, const char*> states[] = {
      {StateDtype::fp32, "fp32"}, {StateDtype::bf16, "bf16"}, {StateDtype::fp8, "fp8"}};
  for (const auto& [s, name] : states)
    if (s != cfg.optim.state_dtype) add(fmt::format("state_dtype {}", name), [s](Config& c) { c.optim.state_dtype = s; });
  const std::pair<Recompute, const char*> recomputes[] = {
      {Recompute::none, "none"}, {Recompute::layernorm, "layernorm"}, {Recompute::block, "block"}};
  for (const auto& [r, name] : recomputes)
    if (r != cfg.train.recompute) add(fmt::format("recompute {}", name), [r](Config& c) { c.train.recompute = r; });
  if (world > 1)
    for (int z = 0; z <= 2; ++z)
      if (z != cfg.distributed.zero_stage)
        add(fmt::format("zero_stage {}", z), [z](Config& c) { c.distributed.zero_stage = z; });
  if (fp8)
    add("BF16 mode", [](Config& c) {
      c.precision.compute = ComputeMode::bf16;
      c.precision.grad_dtype = GradDtype::fp32;
      c.optim.state_dtype = StateDtype::fp32;
    });
  return out;
}

std::string compare_table(const std::vector<PlanOption>& options, const std::vector<MemoryPlan>& plans) {
  FP8T_CHECK(options.size() == plans.size() && !plans.empty(), "compare_table: {} options but {} plans",
             options.size(), plans.size());
  std::string s = fmt::format("{:<30} {:>12} {:>14} {:>12} {:>12} {:>14} {:>8}\n", "option", "state B/param",
                              "saved/sequence", "peak at mb", "largest mb", "tokens/s (mb)", "speed");
  auto tokens_per_s = [&](const MemoryPlan& p, const Config& c) {
    return p.step_seconds > 0 ? p.timed_micro_batch * double(c.model.seq_len) / p.step_seconds : 0.0;
  };
  const double base = tokens_per_s(plans[0], options[0].cfg);
  for (size_t i = 0; i < plans.size(); ++i) {
    const MemoryPlan& p = plans[i];
    const double tps = tokens_per_s(p, options[i].cfg);
    s += fmt::format("{:<30} {:>12.2f} {:>14} {:>12} {:>12} {:>14} {:>8}\n", options[i].name,
                     p.state_bytes_per_parameter(), format_bytes(std::llround(p.saved_per_sample)),
                     format_bytes(std::llround(p.peak(p.micro_batch))), p.max_micro_batch,
                     tps > 0 ? fmt::format("{:.0f} ({})", tps, p.timed_micro_batch) : "-",
                     tps > 0 && base > 0 ? fmt::format("{:.3f}x", tps / base) : "-");
  }
  s += "(speed: tokens/s of one timed micro-step against the first row; peak at the configured micro-batch)\n";
  return s;
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
  if (!saved_by_role.empty()) {
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [role, bytes] : saved_by_role)
      if (bytes > 0) rows.emplace_back(bytes, role);
    std::sort(rows.rbegin(), rows.rend());
    s += fmt::format("saved for backward by tensor role, per sequence (bytes per token, channel and layer):\n");
    for (const auto& [bytes, role] : rows)
      s += fmt::format("  {:<34} {:>12} ({:.2f})\n", role, format_bytes(std::llround(bytes)),
                       bytes / std::max(1.0, tokens_channels_layers));
    s += fmt::format("  {:<34} {:>12} ({:.2f})\n", "all saved", format_bytes(std::llround(saved_per_sample)),
                     saved_per_sample / std::max(1.0, tokens_channels_layers));
  }
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
