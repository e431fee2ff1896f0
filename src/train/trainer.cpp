// The training loop.
#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "autograd/tape.h"
#include "data/shard.h"
#include "dist/zero.h"
#include "nn/gpt.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

#ifdef FP8T_HAVE_CUDA
#include "kernels/matmul.cuh"
#endif

namespace fp8t {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

DType compute_dtype_for(const Config& cfg) {
  if (cfg.run.device.is_cpu()) return DType::f32;  // the CPU computes in f32 (FP8 is emulated per op)
  return cfg.precision.compute == ComputeMode::fp32 ? DType::f32 : DType::bf16;
}

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02d}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02d}s", s / 60, s % 60);
}

// The training loader's shuffle seed; ShardLoader reads 0 as file order, so run.seed 0 maps to another value.
uint64_t train_order_seed(const Config& cfg) {
  if (!cfg.data.shuffle) return 0;
  return cfg.run.seed != 0 ? cfg.run.seed : 0x9E3779B97F4A7C15ull;
}

// One micro-batch of tokens and targets on the model's device.
struct Batch {
  std::vector<int32_t> h_inputs, h_targets;
  Tensor inputs, targets;
  Batch(int B, int T, Device d)
      : h_inputs(static_cast<size_t>(B) * T), h_targets(h_inputs.size()),
        inputs(Tensor::empty({B, T}, DType::i32, d, MemCategory::activations)),
        targets(Tensor::empty({B, T}, DType::i32, d, MemCategory::activations)) {}
  void load(ShardLoader& loader) {
    loader.next_batch(h_inputs.data(), h_targets.data());
    copy_bytes(inputs.raw(), inputs.device(), h_inputs.data(), Device::cpu(), inputs.nbytes());
    copy_bytes(targets.raw(), targets.device(), h_targets.data(), Device::cpu(), targets.nbytes());
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
#ifdef FP8T_HAVE_CUDA
    kernels::set_matmul_autotune(cfg.run.gemm_autotune);
#endif

    fs::create_directories(run_dir_);
    log_ = make_run_logger(run_dir_, comm.rank());
    model_ = std::make_unique<GPT>(cfg.model, device_, compute_dtype_for(cfg), world, cfg.precision,
                                   gradient_shard(cfg.distributed, comm.rank(), world));
    model_->set_recompute_layernorm(cfg.train.recompute == Recompute::layernorm);
    model_->init(cfg.run.seed);
    ParameterStore& P = model_->params();
    shard_ = P.padded_numel() / world;
    reducer_ = std::make_unique<GradientReducer>(cfg.distributed, comm, P);
    opt_begin_ = reducer_->shard_begin();
    opt_end_ = reducer_->shard_end();
    optim_ = std::make_unique<AdamW>(cfg.optim, P, opt_begin_, opt_end_);

    train_loader_ = std::make_unique<ShardLoader>(cfg.data.train, cfg.train.micro_batch, cfg.model.seq_len,
                                                  comm.rank(), world, train_order_seed(cfg));
    for (const ValSet& set : cfg.data.val)  // unshuffled: every evaluation sees the same tokens
      val_loaders_.push_back(std::make_unique<ShardLoader>(set.glob, cfg.train.micro_batch, cfg.model.seq_len,
                                                           comm.rank(), world, 0));
    batch_ = std::make_unique<Batch>(cfg.train.micro_batch, cfg.model.seq_len, device_);

    if (resume) restore(*resume);
    if (comm.rank() == 0) {
      std::ofstream(run_dir_ / "config.yaml") << cfg.to_yaml();
      metrics_ = std::make_unique<MetricsWriter>(run_dir_ / "metrics.jsonl", step_ > 0);
    }
    log_->info("fp8train: run '{}' on {} x {} ({} backend), {} parameters, {} tokens/step ({} micro-batches "
               "of {}x{} per rank), zero_stage {}",
               cfg.run.name, world, world > 1 && device_.is_cuda() ? std::string("cuda") : device_.str(), comm.backend(), model_->num_parameters(), tokens_per_step_,
               accum_, cfg.train.micro_batch, cfg.model.seq_len, cfg.distributed.zero_stage);
  }

  TrainResult run() {
    TrainResult result;
    const std::vector<double> first_val = evaluate();
    result.first_val_loss = result.last_val_loss =
        first_val.empty() ? std::numeric_limits<double>::quiet_NaN() : first_val[0];
    keep_val(result, first_val);
    if (!first_val.empty()) {
      log_->info("step {:5d} | {}", step_, val_text(first_val));
      nlohmann::json j = {{"step", step_}, {"tokens", tokens_}};
      add_val_json(j, first_val);
      if (metrics_) metrics_->write(j);
    }
    const auto t_start = Clock::now();
    const int first_step = step_;
    while (step_ < cfg_.train.max_steps) {
      result.last_train_loss = train_step();
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / (step_ - first_step) * (cfg_.train.max_steps - step_);
      const bool last = step_ == cfg_.train.max_steps;
      std::vector<double> val;
      if (last || (cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0)) val = evaluate();
      report(result.last_train_loss, val, eta);
      keep_val(result, val);
      const int every = cfg_.train.checkpoint_every;
      if ((last && every >= 0) || (every > 0 && step_ % every == 0)) save();
    }
    result.steps = step_;
    return result;
  }

 private:
  double train_step() {
    const auto t0 = Clock::now();
    allocator_for(device_).reset_peaks();
    ParameterStore& P = model_->params();
    P.zero_grads();  // at ZeRO stage 2 only this rank's shard exists
    Tensor loss_sum;  // summed on the device: one host read per step, not one per micro-step
    for (int micro = 0; micro < accum_; ++micro) {
      batch_->load(*train_loader_);
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
      if (!loss_sum.defined()) loss_sum = zeros_like(loss->value, loss->value.dtype());
      add_(loss_sum, loss->value);
    }
    const double local_loss = loss_sum.to_float_vector()[0] / accum_;
    const double loss = scalar_sum_over_ranks(comm_, local_loss, device_) / comm_.size();

    // Gradients: sum over ranks (stage 0: everywhere; stages 1, 2: only this rank's shard).
    const int world = comm_.size();
    const double sq = reducer_->reduce();
    const double norm = std::sqrt(sq) / world;  // norm of the rank-averaged gradient
    const double lr = lr_at(cfg_.optim, step_, cfg_.train.max_steps);
    bool skipped = false;
    if (!std::isfinite(norm) || !std::isfinite(loss)) {
      const std::string where = nonfinite_report();
      if (!cfg_.train.skip_nonfinite_steps)
        FP8T_FAIL("step {}: non-finite loss ({}) or gradient norm ({}) {}. Lower optim.lr, or set "
                  "train.skip_nonfinite_steps: true to skip such steps",
                  step_ + 1, loss, norm, where);
      log_->warn("step {}: non-finite loss or gradients {}; skipping the update", step_ + 1, where);
      skipped = true;
    }
    // FP8: a saturating cast hides Inf/NaN from the loss, so the amaxes are checked on their own.
    if (const std::string bad = reduce_fp8_amax(); !bad.empty() && !skipped) {
      if (!cfg_.train.skip_nonfinite_steps)
        FP8T_FAIL("step {}: non-finite FP8 amax: {}. Lower optim.lr, or set train.skip_nonfinite_steps: true "
                  "to skip such steps", step_ + 1, bad);
      log_->warn("step {}: non-finite FP8 amax: {}; skipping the update", step_ + 1, bad);
      skipped = true;
    }
    if (!skipped) {
      double scale = 1.0 / world;
      if (cfg_.optim.grad_clip > 0 && norm > cfg_.optim.grad_clip) scale *= cfg_.optim.grad_clip / norm;
      const bool compute_written = optim_->step(++opt_steps_, lr, scale);
      if (cfg_.distributed.zero_stage >= 1 && world > 1) {
        Tensor mine = P.master().slice_flat(opt_begin_, {shard_});
        comm_.all_gather(mine, P.master());
      }
      if (!compute_written) P.sync_compute();
    }
    // Also after a skipped step: its non-finite amaxes are dropped, not carried into the next one.
    model_->on_optimizer_step();
    ++step_;
    tokens_ += tokens_per_step_;
    last_lr_ = lr;
    last_norm_ = norm;
    last_step_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    last_skipped_ = skipped;
    return loss;
  }

  // Which parameter gradients in this rank's reduced range hold NaN/Inf (checked only when something went
  // wrong).
  std::string nonfinite_report() {
    ParameterStore& P = model_->params();
    const int64_t off = P.grads_begin();
    std::string bad;
    for (const auto& s : P.specs()) {
      const int64_t b = std::max(s.offset, opt_begin_), e = std::min(s.offset + s.numel(), opt_end_);
      if (b >= e) continue;
      const double ss = sum_squares(P.grads(), b - off, e - off);
      if (!std::isfinite(ss)) bad += (bad.empty() ? "" : ", ") + s.name;
      if (bad.size() > 200) break;
    }
    const std::string fp8 = model_->fp8_nonfinite_report();
    const bool sharded = opt_end_ - opt_begin_ < P.padded_numel();
    const std::string none = sharded ? "(not in this rank's gradient shard: in another rank's, or the loss itself)"
                                     : "(the loss itself)";
    return (bad.empty() ? none : "in the gradient of " + bad) +
           (fp8.empty() ? "" : "; non-finite FP8 amax: " + fp8);
  }

  // All-reduces (max) this step's FP8 amaxes over ranks when precision.fp8.reduce_amax is set, so
  // every rank computes the same scales; returns the non-finite ones ("" when all are finite).
  std::string reduce_fp8_amax() {
    if (!model_->fp8_enabled()) return "";
    if (cfg_.precision.fp8.reduce_amax && comm_.size() > 1) {
      std::vector<float*> slots = model_->amax_slots();
      std::vector<float> v(slots.size());
      // NaN goes over the wire as +inf: a max reduction may drop NaN but never inf.
      for (size_t i = 0; i < slots.size(); ++i) v[i] = std::isnan(*slots[i]) ? INFINITY : *slots[i];
      Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(device_, MemCategory::comm);
      comm_.all_reduce(t, ReduceOp::max);
      v = t.to_float_vector();
      for (size_t i = 0; i < slots.size(); ++i) *slots[i] = v[i];
    }
    return model_->fp8_nonfinite_report();
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

  // "val_loss 5.1234 | sotu 5.4321": the first set keeps the name val_loss, the others go by theirs.
  std::string val_text(const std::vector<double>& val) const {
    std::string text = fmt::format("val_loss {:.4f}", val[0]);
    for (size_t i = 1; i < val.size(); ++i) text += fmt::format(" | {} {:.4f}", cfg_.data.val[i].name, val[i]);
    return text;
  }

  // metrics.jsonl: val_loss is the first set, "val" holds every set by name.
  void add_val_json(nlohmann::json& j, const std::vector<double>& val) const {
    j["val_loss"] = val[0];
    nlohmann::json& sets = j["val"] = nlohmann::json::object();
    for (size_t i = 0; i < val.size(); ++i) sets[cfg_.data.val[i].name] = val[i];
  }

  void keep_val(TrainResult& result, const std::vector<double>& val) const {
    if (val.empty()) return;
    result.last_val_loss = val[0];
    for (size_t i = 0; i < val.size(); ++i) result.last_val_losses[cfg_.data.val[i].name] = val[i];
  }

  void report(double loss, const std::vector<double>& val, double eta) {
    const double tps = tokens_per_step_ / (last_step_ms_ / 1e3);
    const MemoryStats mem = allocator_for(device_).stats();
    if (step_ % cfg_.run.log_every == 0 || step_ == cfg_.train.max_steps || !val.empty()) {
      std::string line = fmt::format("step {:5d}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} ms | {:.0f} tok/s | "
                                     "mem {} | ETA {}",
                                     step_, cfg_.train.max_steps, loss, last_lr_, last_norm_, last_step_ms_, tps,
                                     format_bytes(mem.total_peak), format_eta(eta));
      if (!val.empty()) line += " | " + val_text(val);
      log_->info(line);
    }
    if (!metrics_) return;
    nlohmann::json j = {{"step", step_},           {"tokens", tokens_},      {"loss", loss},
                        {"lr", last_lr_},          {"grad_norm", last_norm_}, {"step_ms", last_step_ms_},
                        {"tokens_per_s", tps},     {"memory", memory_json(mem)}};
    if (device_.is_cuda()) j["mfu"] = model_->flops_per_token() * tps / comm_.size() / 989.4e12;
    if (last_skipped_) j["skipped"] = true;
    if (!val.empty()) add_val_json(j, val);
    if (cfg_.precision.compute == ComputeMode::fp8) {
      const int every = cfg_.precision.fp8.monitor_every;
      j["fp8"] = model_->fp8_stats(every > 0 && step_ % every == 0);
    }
    metrics_->write(j);
  }

  void save() {
    const fs::path tmp = checkpoint_tmp_dir(run_dir_, step_);
    ParameterStore& P = model_->params();
    if (comm_.rank() == 0) {
      write_tensor_file(tmp / "model.bin", P.master());
      write_checkpoint_state(tmp, {step_, comm_.size(), cfg_.distributed.zero_stage, tokens_, cfg_.to_yaml()});
    }
    save_optimizer_state(tmp, comm_, cfg_.distributed.zero_stage, *optim_);
    if (model_->fp8_enabled())  // per rank: without reduce_amax the ranks' scales differ
      std::ofstream(tmp / fmt::format("fp8_rank{}.json", comm_.rank())) << model_->fp8_state().dump();
    comm_.barrier();
    if (comm_.rank() == 0) {
      const fs::path dst = finalize_checkpoint(run_dir_, step_);
      log_->info("checkpoint: {}", dst.string());
    }
    comm_.barrier();
  }

  void restore(const fs::path& where) {
    const auto dir = latest_checkpoint(where);
    FP8T_CHECK(dir, "--resume {}: no complete checkpoint found (expected {}/checkpoints/latest)", where.string(),
               where.string());
    const CheckpointState s = read_checkpoint_state(*dir);
    const bool sharded = cfg_.distributed.zero_stage >= 1;
    FP8T_CHECK(!sharded || s.world_size == comm_.size() || s.zero_stage == 0,
               "checkpoint {} was written by {} ranks with ZeRO stage {}; resume it with the same number of ranks",
               dir->string(), s.world_size, s.zero_stage);
    ParameterStore& P = model_->params();
    read_tensor_file(*dir / "model.bin", P.master());
    P.sync_compute();
    if (const std::string changed = load_optimizer_state(*dir, s.world_size, s.zero_stage, *optim_); !changed.empty())
      log_->warn("{}", changed);
    if (model_->fp8_enabled()) {
      fs::path f = *dir / fmt::format("fp8_rank{}.json", comm_.rank());
      if (!fs::exists(f)) f = *dir / "fp8_rank0.json";  // resumed on more ranks
      if (fs::exists(f)) model_->load_fp8_state(nlohmann::json::parse(std::ifstream(f)));
      else log_->warn("checkpoint {} has no FP8 scaling state: FP8 scales start fresh", dir->string());
    }
    step_ = opt_steps_ = s.step;
    tokens_ = s.tokens;
    // Replay the data order so the resumed run sees the batches the uninterrupted one would.
    for (int64_t i = 0; i < static_cast<int64_t>(step_) * accum_; ++i) batch_->load(*train_loader_);
    log_->info("resumed from {} at step {}", dir->string(), step_);
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
  int64_t tokens_per_step_ = 0, shard_ = 0, opt_begin_ = 0, opt_end_ = 0, tokens_ = 0;
  int step_ = 0, opt_steps_ = 0;
  double last_lr_ = 0, last_norm_ = 0, last_step_ms_ = 0;
  bool last_skipped_ = false;
};

}  // namespace

TrainResult train(const Config& cfg, Communicator& comm, const std::optional<fs::path>& resume) {
  Trainer t(cfg, comm, resume);
  return t.run();
}

}  // namespace fp8t
