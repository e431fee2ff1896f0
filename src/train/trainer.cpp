// The training loop.
#include "train/trainer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>

#include "autograd/tape.h"
#include "core/graph_capture.h"
#include "core/host_staging.h"
#include "data/shard.h"
#include "dist/zero.h"
#include "nn/gpt.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "train/import.h"
#include "train/metrics.h"
#include "train/nonfinite.h"
#include "train/peak_flops.h"
#include "train/planner.h"
#include "train/run_checkpoint.h"
#include "train/step_report.h"

namespace fp8t {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

DType compute_dtype_for(const Config& cfg) {
  if (cfg.run.device.is_cpu()) return DType::f32;  // the CPU computes in f32 (FP8 is emulated per op)
  return cfg.precision.compute == ComputeMode::fp32 ? DType::f32 : DType::bf16;
}

// The training loader's shuffle seed; ShardLoader reads 0 as file order, so run.seed 0 maps to another value.
uint64_t train_order_seed(const Config& cfg) {
  if (!cfg.data.shuffle) return 0;
  return cfg.run.seed != 0 ? cfg.run.seed : 0x9E3779B97F4A7C15ull;
}

// One micro-batch of tokens and targets on the model's device. The host fills a staging buffer and the copies are
// queued on the compute stream, so loading the next micro-batch does not wait for the device to finish the queued
// forward and backward passes (a plain copy from pageable memory would).
struct Batch {
  int64_t n;  // B * T
  HostStaging staging;  // inputs, then targets (int32 each)
  Tensor inputs, targets;
  Batch(int B, int T, Device d)
      : n(static_cast<int64_t>(B) * T), staging(2 * static_cast<size_t>(n) * sizeof(int32_t), d),
        inputs(Tensor::empty({B, T}, DType::i32, d, MemCategory::activations)),
        targets(Tensor::empty({B, T}, DType::i32, d, MemCategory::activations)) {}
  void load(ShardLoader& loader) {
    skip(loader);
    staging.copy_to(inputs.raw(), 0, inputs.nbytes());
    staging.copy_to(targets.raw(), inputs.nbytes(), targets.nbytes());
  }
  // Reads the next micro-batch on the host only (a resume's replay of the data order).
  void skip(ShardLoader& loader) {
    staging.wait();  // the previous micro-batch's copies have been made
    auto* h = static_cast<int32_t*>(staging.data());
    loader.next_batch(h, h + n);
  }
};

double scalar_sum_over_ranks(Communicator& comm, double x, Device d) {
  if (comm.size() == 1) return x;
  Tensor t = Tensor::from_vector({static_cast<float>(x)}, {1}).to(d, MemCategory::comm);
  comm.all_reduce(t, ReduceOp::sum);
  return t.to_float_vector()[0];
}

class Trainer {
 public:
  Trainer(const Config& cfg, Communicator& comm, const std::optional<fs::path>& resume)
      : cfg_(cfg), comm_(comm), run_dir_(cfg.run.out_dir), device_(cfg.run.device) {
    const int world = comm.size();
    const int64_t tokens_per_micro = static_cast<int64_t>(cfg.train.micro_batch) * cfg.model.seq_len * world;
    const int64_t total = cfg.train.total_batch_tokens ? cfg.train.total_batch_tokens : tokens_per_micro;
    FP8T_CHECK(total % tokens_per_micro == 0,
               "train.total_batch_tokens {} is not a multiple of micro_batch x seq_len x ranks = {}; use {}", total,
               tokens_per_micro, std::max<int64_t>(1, total / tokens_per_micro) * tokens_per_micro);
    accum_ = static_cast<int>(total / tokens_per_micro);
    tokens_per_step_ = total;
    apply_memory_limit(cfg.run);
    set_gemm_autotune(device_, cfg.run.gemm_autotune);

    fs::create_directories(run_dir_);
    log_ = make_run_logger(run_dir_, comm.rank());
    // At ZeRO stages 1 and 2 on several ranks an FP8 weight's codes are cast by the ranks owning its master
    // elements, so every rank must cast with the same scale: from amaxes reduced over the ranks.
    FP8T_CHECK(cfg.precision.compute != ComputeMode::fp8 || cfg.precision.fp8.reduce_amax ||
                   cfg.distributed.zero_stage == 0 || world == 1,
               "precision.fp8.reduce_amax: false needs distributed.zero_stage: 0 with {} ranks: at stages 1 and 2 "
               "each rank casts its shard of the FP8 weights, and all ranks must share one scale. Set "
               "precision.fp8.reduce_amax: true, or distributed.zero_stage: 0", world);
    model_ = std::make_unique<GPT>(cfg.model, device_, compute_dtype_for(cfg), world, cfg.precision,
                                   gradient_shard(cfg.distributed, comm.rank(), world),
                                   master_shard(cfg.distributed, comm.rank(), world));
    model_->set_recompute_layernorm(cfg.train.recompute == Recompute::layernorm);
    model_->init(cfg.run.seed);
    ParameterStore& P = model_->params();
    reducer_ = std::make_unique<GradientReducer>(cfg.distributed, comm, P);
    opt_begin_ = reducer_->shard_begin();
    opt_end_ = reducer_->shard_end();
    optim_ = std::make_unique<AdamW>(cfg.optim, P, opt_begin_, opt_end_);

    train_loader_ = std::make_unique<ShardLoader>(cfg.data.train, cfg.train.micro_batch, cfg.model.seq_len,
                                                  comm.rank(), world, train_order_seed(cfg), cfg.model.vocab_size);
    for (const ValSet& set : cfg.data.val)  // unshuffled: every evaluation sees the same tokens
      val_loaders_.push_back(std::make_unique<ShardLoader>(set.glob, cfg.train.micro_batch, cfg.model.seq_len,
                                                           comm.rank(), world, 0, cfg.model.vocab_size));
    batch_ = std::make_unique<Batch>(cfg.train.micro_batch, cfg.model.seq_len, device_);
    use_graphs_ = cfg.train.cuda_graph && device_.is_cuda() && world == 1;
    if (cfg.train.cuda_graph && !use_graphs_)
      log_->warn("train.cuda_graph applies to one CUDA rank; this run ({} x {}) runs without it", world,
                 device_.str());

    if (resume && !cfg.train.init_from.empty())
      log_->info("--resume {} wins over train.init_from {}", resume->string(), cfg.train.init_from);
    if (resume) restore(*resume);
    else if (!cfg.train.init_from.empty()) log_->info("{}", load_init_weights(cfg, model_->params()));
    model_->publish_weights(weight_collectives(comm));  // a sharded master's compute copies and FP8 codes
    if (comm.rank() == 0) {
      std::ofstream(run_dir_ / "config.yaml") << cfg.to_yaml();
      metrics_ = std::make_unique<MetricsWriter>(run_dir_ / "metrics.jsonl", step_ > 0);
    }
    log_->info("fp8train: run '{}' on {} x {} ({} backend), {} parameters, {} tokens/step ({} micro-batches "
               "of {}x{} per rank), zero_stage {}",
               cfg.run.name, world, world > 1 && device_.is_cuda() ? std::string("cuda") : device_.str(), comm.backend(), model_->num_parameters(), tokens_per_step_,
               accum_, cfg.train.micro_batch, cfg.model.seq_len, cfg.distributed.zero_stage);
    peak_ = peak_flops(device_name(device_), cfg.precision.compute, cfg.run.peak_tflops);
    if (device_.is_cuda() || peak_.tflops > 0) log_->info("{}{}", peak_.tflops > 0 ? "MFU against " : "", peak_.about);
  }

  TrainResult run() {
    TrainResult result;
    const std::vector<double> first_val = evaluate();
    if (!first_val.empty()) result.first_val_loss = first_val[0];
    keep_val(result, first_val);
    if (!first_val.empty()) {
      log_->info("step {:5d} | {}", step_, val_text(cfg_.data.val, first_val));
      nlohmann::json j = {{"step", step_}, {"tokens", tokens_}};
      add_val_json(j, cfg_.data.val, first_val);
      if (metrics_) metrics_->write(j);
    }
    const auto t_start = Clock::now();
    const int first_step = step_;
    while (step_ < cfg_.train.max_steps) {
      const double loss = train_step();
      result.last_train_loss = loss;
      ++result.steps_run;
      if (last_skipped_) ++result.skipped_steps;
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / (step_ - first_step) * (cfg_.train.max_steps - step_);
      const bool last = step_ == cfg_.train.max_steps;
      std::vector<double> val;
      if (last || (cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0)) val = evaluate();
      report(loss, val, eta);
      keep_val(result, val);
      const int every = cfg_.train.checkpoint_every;
      if ((last && every >= 0) || (every > 0 && step_ % every == 0)) {
        // Skipped steps leave the weights as they were: a checkpoint must not keep NaN/Inf ones unnoticed.
        // Decided by all ranks together: each one sees only its shard of a sharded master.
        const std::string bad = nonfinite_weights(model_->params());
        if (scalar_sum_over_ranks(comm_, bad.empty() ? 0.0 : 1.0, device_) > 0)
          FP8T_FAIL("step {}: not writing a checkpoint of non-finite weights: {}{}. Resume from an earlier "
                    "checkpoint, or start again", step_, bad.empty() ? "on another rank's shard" : bad,
                    last_skipped_ ? " (this step was skipped)" : "");
        save();
      }
    }
    result.steps = step_;
    return result;
  }

 private:
  double train_step() {
    const auto t0 = Clock::now();
    allocator_for(device_).reset_peaks();
    ParameterStore& P = model_->params();
    P.zero_grads_deferred();  // the matrices' gradients overwritten by their first writer (ZeRO-2: a zeroed shard)
    Tensor loss_sum;  // summed on the device: one host read per step, not one per micro-step
    for (int micro = 0; micro < accum_; ++micro) {
      batch_->load(*train_loader_);
      const Tensor loss = micro_step(micro);
      if (!loss_sum.defined()) loss_sum = zeros_like(loss, loss.dtype());
      add_(loss_sum, loss);
    }
    P.zero_stale_grads();
    const auto t_queued = Clock::now();  // every micro-step's forward and backward queued on the device
    // One GPU rank: the gradient's squared norm is queued behind the loss, and both come back in one wait.
    const auto local = reducer_->reduce_with_loss(loss_sum);
    const double local_loss = (local ? local->first : loss_sum.to_float_vector()[0]) / accum_;
    const auto t_done = Clock::now();
    const double loss = scalar_sum_over_ranks(comm_, local_loss, device_) / comm_.size();
    // Gradients: sum over ranks (stage 0: everywhere; stages 1, 2: only this rank's shard).
    const int world = comm_.size();
    const double sq = local ? local->second : reducer_->reduce();
    const double norm = std::sqrt(sq) / world;  // norm of the rank-averaged gradient
    const double lr = lr_at(cfg_.optim, step_, cfg_.train.max_steps);
    // FP8: a saturating cast hides Inf/NaN from the loss, so the amaxes are checked on their own (every
    // step: with reduce_amax this is a collective).
    const std::string bad_amax = reduce_fp8_amax();
    std::string what;  // what was non-finite, if anything
    if (!std::isfinite(norm) || !std::isfinite(loss))
      what = fmt::format("non-finite loss ({}) or gradient norm ({}){}", loss, norm,
                         bad_amax.empty() ? "" : "; non-finite FP8 amax: " + bad_amax);
    else if (!bad_amax.empty())
      what = "non-finite FP8 amax: " + bad_amax;
    const bool skipped = !what.empty();
    if (skipped) on_nonfinite_step(what);  // throws unless the step is to be skipped
    else skipped_in_row_ = 0;
    skipped_steps_ += skipped;
    if (!skipped) {
      double scale = 1.0 / world;
      if (cfg_.optim.grad_clip > 0 && norm > cfg_.optim.grad_clip) scale *= cfg_.optim.grad_clip / norm;
      const bool compute_written = optim_->step(++opt_steps_, lr, scale);
      if (cfg_.distributed.zero_stage >= 1 && world > 1 && !P.master_sharded()) {  // f32 parameters: the master
        Tensor mine = P.master().slice_flat(opt_begin_, {opt_end_ - opt_begin_});
        comm_.all_gather(mine, P.master());
      }
      if (!compute_written && !P.master_sharded()) P.sync_compute();  // sharded: publish_weights below
    }
    // Also after a skipped step: its non-finite amaxes are dropped, not carried into the next one.
    model_->on_optimizer_step();
    // ZeRO stages 1 and 2 on several ranks: every rank's updated shard travels as BF16 copies and FP8 codes.
    model_->publish_weights(weight_collectives(comm_));
    ++step_;
    tokens_ += tokens_per_step_;
    last_lr_ = lr;
    last_norm_ = norm;
    last_step_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    last_queue_ms_ = std::chrono::duration<double, std::milli>(t_queued - t0).count();
    last_wait_ms_ = std::chrono::duration<double, std::milli>(t_done - t_queued).count();
    last_skipped_ = skipped;
    ++steps_in_process_;
    return loss;
  }

  // One micro-step's forward and backward on the loaded batch; returns the loss's value (a device scalar).
  Tensor forward_backward() {
    Tape tape;
    Var loss;
    reducer_->begin_micro();  // ZeRO-2 stages and reduces buckets during every backward
    {
      TapeScope scope(&tape);
      loss = model_->loss(batch_->inputs, batch_->targets, cfg_.train.recompute == Recompute::block,
                          1.0f / static_cast<float>(accum_));
    }
    tape.set_progress_hook(reducer_->backward_hook());
    tape.backward(loss, 1.0f / static_cast<float>(accum_));
    reducer_->end_micro();
    return loss->value;
  }

  // train.cuda_graph: from the process's second step on (the first fills the caches: GEMM plans, FP8 weight
  // codes, the allocator's pool), a step's first micro-step, which casts the new FP8 weights, and its later
  // ones each replay their own graph, captured the first time it is needed.
  Tensor micro_step(int micro) {
    if (!use_graphs_ || steps_in_process_ == 0) return forward_backward();
    const size_t g = micro == 0 ? 0 : 1;
    if (!graphs_[g]) {  // kept only once captured
      auto graph = std::make_unique<StepGraph>();
      graph->capture(device_, [&] { graph_loss_[g] = forward_backward(); });
      graphs_[g] = std::move(graph);
      log_->info("train.cuda_graph: captured the {} micro-step of a step at step {}", g == 0 ? "first" : "later",
                 step_ + 1);
    }
    graphs_[g]->replay();
    return graph_loss_[g];
  }

  // Step step_ + 1 went non-finite (`what`, before its update): stops the run naming the first op that
  // produced a NaN/Inf, or with train.skip_nonfinite_steps counts it as skipped, stopping after
  // train.max_skipped_steps in a row. The re-run that locates the op runs once per streak of skips.
  void on_nonfinite_step(const std::string& what) {
    const int step = step_ + 1;
    if (skipped_in_row_ == 0) {
      streak_start_ = step;
      streak_location_ = locate_nonfinite(step);
    }
    if (!cfg_.train.skip_nonfinite_steps)
      FP8T_FAIL("step {}: {}. {}. Set train.skip_nonfinite_steps: true to skip such steps (at most "
                "train.max_skipped_steps in a row)", step, what, streak_location_);
    const int limit = cfg_.train.max_skipped_steps;
    if (++skipped_in_row_ >= limit) {
      const std::string steps =
          step == streak_start_ ? fmt::format("step {}", step) : fmt::format("steps {} to {}", streak_start_, step);
      FP8T_FAIL("step {}: {}; skipped steps in a row: {} ({}), the limit (train.max_skipped_steps): stopping. {}",
                step, what, skipped_in_row_, steps, streak_location_);
    }
    log_->warn("step {}: {}; skipping the update ({} of at most {} in a row). {}", step, what, skipped_in_row_,
               limit, skipped_in_row_ == 1 ? streak_location_ : fmt::format("(Located at step {}.)", streak_start_));
  }

  // Names the non-finite weights and the first op producing a NaN/Inf in a re-run of `step` (step_ + 1,
  // its micro-batches replayed from the data order) with every op checked. Only called after a failure.
  std::string locate_nonfinite(int step) {
    std::string text;
    if (const std::string weights = nonfinite_weights(model_->params()); !weights.empty())
      text = fmt::format("Non-finite weights before step {}: {}. ", step, weights);
    const std::string rerun = fmt::format("Re-running step {} with every op checked{}", step,
                                          comm_.size() > 1 ? fmt::format(" on rank {}", comm_.rank()) : "");
    std::string site;
    try {
      ShardLoader replay(cfg_.data.train, cfg_.train.micro_batch, cfg_.model.seq_len, comm_.rank(), comm_.size(),
                         train_order_seed(cfg_));
      Batch b(cfg_.train.micro_batch, cfg_.model.seq_len, device_);
      for (int64_t i = 0; i < static_cast<int64_t>(step_) * accum_; ++i)
        b.skip(replay);
      auto next_micro = [&](int) {  // called for micro-batches 0, 1, ... in order
        b.load(replay);
        return std::pair{b.inputs, b.targets};
      };
      site = locate_first_nonfinite(*model_, accum_, next_micro, cfg_.train.recompute == Recompute::block,
                                    1.0f / static_cast<float>(accum_));
    } catch (const std::exception& e) {  // the report must not hide the failure it reports
      return text + fmt::format("{} failed: {}", rerun, e.what());
    }
    if (!site.empty()) return text + fmt::format("{}: first non-finite value {}", rerun, site);
    return text + fmt::format("{} found no non-finite value: {}", rerun,
                              comm_.size() > 1 ? "it came from another rank's micro-batches (see its message) or "
                                                 "the gradient reduction"
                                               : "the gradient norm overflowed (squares of finite gradients beyond "
                                                 "the float range), or the step does not reproduce");
  }

  // All-reduces (max) this step's FP8 amaxes over ranks when precision.fp8.reduce_amax is set, so
  // every rank computes the same scales; returns the non-finite ones ("" when all are finite).
  std::string reduce_fp8_amax() {
    if (!model_->fp8_enabled()) return "";
    AmaxAllReduce all_reduce_max;
    if (cfg_.precision.fp8.reduce_amax && comm_.size() > 1)
      all_reduce_max = [this](std::vector<float>& v) {
        Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(device_, MemCategory::comm);
        comm_.all_reduce(t, ReduceOp::max);
        v = t.to_float_vector();
      };
    return model_->reduce_fp8_amax(all_reduce_max);
  }

  // The mean loss of each data.val set over its first eval_steps micro-batches, in config order; empty when
  // there are none.
  std::vector<double> evaluate() {
    NoGradScope no_grad;
    std::vector<double> losses;
    for (auto& loader : val_loaders_) {
      loader->reset();
      double sum = 0;
      for (int i = 0; i < cfg_.train.eval_steps; ++i) {
        batch_->load(*loader);
        sum += model_->loss(batch_->inputs, batch_->targets)->value.to_float_vector()[0];
      }
      losses.push_back(scalar_sum_over_ranks(comm_, sum / cfg_.train.eval_steps, device_) / comm_.size());
    }
    return losses;
  }

  void keep_val(TrainResult& result, const std::vector<double>& val) const {
    if (val.empty()) return;
    result.last_val_loss = val[0];
    for (size_t i = 0; i < val.size(); ++i) result.last_val_losses[cfg_.data.val[i].name] = val[i];
  }

  void report(double loss, const std::vector<double>& val, double eta) {
    const MemoryStats mem = allocator_for(device_).stats();
    StepReport r{step_, cfg_.train.max_steps, tokens_, loss, last_lr_, last_norm_, last_step_ms_,
                 tokens_per_step_ / (last_step_ms_ / 1e3), losses_.push(loss), {}, last_skipped_, skipped_steps_,
                 mem.total_peak, eta, last_queue_ms_, last_wait_ms_};
    if (peak_.tflops > 0) r.mfu = model_->flops_per_token() * r.tokens_per_s / comm_.size() / (peak_.tflops * 1e12);
    if (step_ % cfg_.run.log_every == 0 || step_ == cfg_.train.max_steps || !val.empty())
      log_->info("{}{}", step_line(r), val.empty() ? "" : " | " + val_text(cfg_.data.val, val));
    if (!metrics_) return;
    nlohmann::json j = step_json(r);
    j["memory"] = memory_json(mem);
    if (!val.empty()) add_val_json(j, cfg_.data.val, val);
    if (cfg_.precision.compute == ComputeMode::fp8) {
      const int every = cfg_.precision.fp8.monitor_every;
      j["fp8"] = model_->fp8_stats(every > 0 && step_ % every == 0);
    }
    metrics_->write(j);
  }

  void save() {
    save_run_checkpoint(run_dir_, cfg_, comm_, *model_, *optim_, {step_, skipped_steps_, tokens_}, *log_);
  }

  void restore(const fs::path& where) {
    const RunPosition at = restore_run_checkpoint(where, cfg_, comm_, *model_, *optim_, tokens_per_step_, *log_);
    step_ = at.step;
    opt_steps_ = at.step - at.skipped_steps;  // AdamW's step counter counts updates: skipped steps made none
    skipped_steps_ = at.skipped_steps;
    tokens_ = at.tokens;
    // Replay the data order of this run's ranks so it sees the batches an uninterrupted run on them would (on
    // the host only: at most the batches of train.max_steps steps, none copied to the device).
    for (int64_t i = 0; i < static_cast<int64_t>(step_) * accum_; ++i)
      batch_->skip(*train_loader_);
    if (comm_.rank() == 0)
      if (const int dropped = drop_metrics_after(run_dir_ / "metrics.jsonl", step_); dropped > 0)
        log_->info("metrics.jsonl: dropped {} row(s) written after step {} (after the checkpoint)", dropped, step_);
    if (comm_.rank() == 0) losses_.push_from_metrics(run_dir_ / "metrics.jsonl");  // the z-score's window
  }

  Config cfg_;
  Communicator& comm_;
  fs::path run_dir_;
  Device device_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<AdamW> optim_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<ShardLoader> train_loader_;
  std::vector<std::unique_ptr<ShardLoader>> val_loaders_;  // one per cfg_.data.val set, in order
  std::unique_ptr<Batch> batch_;
  std::unique_ptr<MetricsWriter> metrics_;
  int accum_ = 1;
  bool use_graphs_ = false;  // train.cuda_graph where it applies (one CUDA rank)
  int steps_in_process_ = 0;
  std::array<std::unique_ptr<StepGraph>, 2> graphs_;  // a step's first micro-step, its later ones
  std::array<Tensor, 2> graph_loss_;                  // their losses' device scalars
  int64_t tokens_per_step_ = 0, opt_begin_ = 0, opt_end_ = 0, tokens_ = 0;
  int step_ = 0, opt_steps_ = 0;
  double last_lr_ = 0, last_norm_ = 0, last_step_ms_ = 0, last_queue_ms_ = 0, last_wait_ms_ = 0;
  bool last_skipped_ = false;
  int skipped_steps_ = 0;  // over the whole run, resumes included (state.json)
  LossWindow losses_;      // rank 0: the step line's z-score
  PeakFlops peak_;         // MFU's denominator (tflops 0: no MFU)
  int skipped_in_row_ = 0, streak_start_ = 0;  // the current streak of skipped steps and its first step
  std::string streak_location_;                 // locate_nonfinite() at the streak's first step
};

}  // namespace

TrainResult train(const Config& cfg, Communicator& comm, const std::optional<fs::path>& resume) {
  if (cfg.train.micro_batch == 0) {  // auto: planned here, on this rank's device, before the run starts
    std::string why;
    const Config planned = resolve_micro_batch(cfg, comm.size(), &why);
    if (comm.rank() == 0) fmt::print(stderr, "fp8train: {}\n", why);
    Trainer t(planned, comm, resume);
    return t.run();
  }
  Trainer t(cfg, comm, resume);
  return t.run();
}

}  // namespace fp8t
