// Under mpirun -np 2 and -np 3: ZeRO-2's gradient shard and staging buckets reduced during every backward
// (within the staging bound), a sharded master's FP8 codes, and 20 training steps at ZeRO stages 0, 1 and 2
// that must end at the same weights, stages 1 and 2 holding 1/N of stage 0's optimizer state per rank and
// stage 2 1/N of its gradients.
#include <algorithm>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstring>
#include <random>

#include "autograd/tape.h"
#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "dist/zero.h"
#include "nn/gpt.h"
#include "train/trainer.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/util/model_test_util.h"

using namespace fp8t;

#define FP8_TOL 1e-2
namespace fs = std::filesystem;

namespace {

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<float> v(fs::file_size(p) / sizeof(float));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

}  // namespace

namespace {
// Forwards to another communicator and counts reduce calls.
class CountingComm final : public Communicator {
 public:
  explicit CountingComm(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string backend() const override { return c_.backend(); }
  void all_reduce(Tensor& t, ReduceOp op) override { c_.all_reduce(t, op); }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override { c_.reduce_scatter(in, out, op); }
  void all_gather(const Tensor& in, Tensor& out) override { c_.all_gather(in, out); }
  void broadcast(Tensor& t, int root) override { c_.broadcast(t, root); }
  void barrier() override { c_.barrier(); }
  void reduce(Tensor& t, ReduceOp op, int root) override {
    ++reduces;
    c_.reduce(t, op, root);
  }
  void synchronize() override { c_.synchronize(); }
  uint64_t ticket() override { return c_.ticket(); }
  void wait(uint64_t ticket) override { c_.wait(ticket); }
  int reduces = 0;

 private:
  Communicator& c_;
};
}  // namespace

namespace {
ModelConfig staged_model() { return test::gpt_config(6, 32, 64, 16); }

// Random tokens and targets (2, 16), different on every rank and micro-batch.
std::pair<Tensor, Tensor> batch(int rank, int micro) {
  std::mt19937 rng(static_cast<uint32_t>(11 + 7 * rank + micro));
  Tensor tokens = Tensor::empty({2, 16}, DType::i32), targets = Tensor::empty({2, 16}, DType::i32);
  for (int i = 0; i < 32; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 64);
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 64);
  }
  return {tokens, targets};
}

}  // namespace

TEST_CASE("mpi: ZeRO-2 keeps a gradient shard and staging buckets and matches a reduce-scatter",
          "[mpi][zero]") {
  auto mpi = test::mpi_comm();
  CountingComm comm(*mpi);
  const int R = comm.size(), me = comm.rank();
  const ModelConfig mc = staged_model();
  constexpr int kMicro = 2;
  // Plain, with block recompute (parameters written inside checkpoint nodes), and with FP8 linears
  // (emulated; f32 gradients so that the comparison stays tight).
  for (const char* variant : {"plain", "recompute", "fp8"}) {
    INFO(variant);
    const bool recompute = std::string(variant) == "recompute";
    PrecisionConfig pc;
    if (std::string(variant) == "fp8") {
      pc.compute = ComputeMode::fp8;
      pc.grad_dtype = GradDtype::fp32;
    }
    Allocator& alloc = allocator_for(Device::cpu());
    const int64_t grads_before = alloc.stats().cur(MemCategory::gradients);
    GPT model(mc, Device::cpu(), DType::f32, R, pc, FlatShard{me, R});
    model.init(3);
    ParameterStore& P = model.params();
    const int64_t shard = P.padded_numel() / R;
    REQUIRE(P.grads().numel() == shard);
    DistributedConfig dc;
    dc.zero_stage = 2;
    dc.bucket_mb = 2048 * 4.0 / (1 << 20);  // 2048 floats: many buckets per shard
    GradientReducer reducer(dc, comm, P);
    // Some shard boundary falls inside a parameter: that bucket goes to two owners.
    bool cut_inside = false;
    for (const auto& s : P.specs())
      for (int r = 1; r < R; ++r) cut_inside |= s.offset < r * shard && r * shard < s.offset + s.numel();
    CHECK(cut_inside);

    alloc.reset_peaks();
    P.zero_grads();
    int during = 0, total_before_last = 0;
    for (int micro = 0; micro < kMicro; ++micro) {
      auto [tokens, targets] = batch(me, micro);
      reducer.begin_micro();
      Tape tape;
      Var loss;
      {
        TapeScope scope(&tape);
        loss = model.loss(tokens, targets, recompute, 1.0f / kMicro);
      }
      auto hook = reducer.backward_hook();
      tape.set_progress_hook([&](size_t left) {
        hook(left);
        if (left > 0) during = comm.reduces - total_before_last;
      });
      tape.backward(loss, 1.0f / kMicro);
      reducer.end_micro();
      if (micro < kMicro - 1) total_before_last = comm.reduces;
    }
    const double sq = reducer.reduce();
    const MemoryStats mem = alloc.stats();
    const int64_t elem = 4, shard_bytes = shard * elem, buffer_bytes = P.padded_numel() * elem;
    // Every micro-batch reduced buckets while its backward still ran, the embedding's only at the end.
    CHECK(during > 0);
    CHECK(comm.reduces - total_before_last > during);
    // Memory: the shard stays, every staging buffer is gone; the peak is the shard plus the staging
    // bound (zero.cpp): kMaxInFlight buckets in flight, wte's, and the one or two a node writes (with
    // recompute too: the inner backward of a block reports its progress), never the full buffer.
    CHECK(mem.cur(MemCategory::gradients) - grads_before == shard_bytes);
    const int64_t bound = static_cast<int64_t>(GradientReducer::kMaxInFlight + 2) * reducer.max_bucket_bytes() +
                          reducer.bucket_bytes(reducer.bucket_of("wte"));
    const int64_t peak = mem.pk(MemCategory::gradients) - grads_before;
    INFO("rank " << me << ": peak gradient bytes " << peak << ", shard " << shard_bytes << " + bound " << bound
                 << ", whole buffer " << buffer_bytes);
    CHECK(peak <= shard_bytes + bound);
    CHECK(shard_bytes + bound < buffer_bytes);
    const std::vector<float> got = P.grads().to_float_vector();

    // Reference: the same model with the whole buffer, both micro-batches accumulated locally, then
    // reduce-scattered.
    GPT ref(mc, Device::cpu(), DType::f32, R, pc);
    ref.init(3);
    ParameterStore& Q = ref.params();
    Q.zero_grads();
    for (int micro = 0; micro < kMicro; ++micro) {
      auto [tokens, targets] = batch(me, micro);
      Tape tape;
      Var loss;
      {
        TapeScope scope(&tape);
        loss = ref.loss(tokens, targets, recompute, 1.0f / kMicro);
      }
      tape.backward(loss, 1.0f / kMicro);
    }
    Tensor ref_mine = Q.grads().slice_flat(me * shard, {shard});
    mpi->reduce_scatter(Q.grads(), ref_mine, ReduceOp::sum);
    const std::vector<float> want = ref_mine.to_float_vector();
    float scale = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, std::abs(want[i]));
      diff = std::max(diff, std::abs(got[i] - want[i]));
    }
    CHECK(scale > 0);
    CHECK(diff <= 1e-5f * scale);  // FP32 sums in another order (per micro-batch over ranks, then over them)
    double ref_sq = 0;
    for (float x : want) ref_sq += static_cast<double>(x) * x;
    Tensor total = Tensor::from_vector({static_cast<float>(ref_sq)}, {1});
    mpi->all_reduce(total, ReduceOp::sum);
    CHECK(std::abs(sq - total.to_float_vector()[0]) <= 1e-4 * sq);
  }
}

TEST_CASE("mpi: a sharded master publishes the FP8 codes and copies a whole master casts - bit for bit",
          "[mpi][zero]") {
  auto comm = test::mpi_comm();
  const int R = comm->size(), me = comm->rank();
  const ModelConfig mc = staged_model();  // 6 layers of 32 channels: the shard cuts fall inside weights
  for (const Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    INFO((scaling == Fp8Scaling::delayed ? "delayed" : "current") << " scaling, " << R << " ranks");
    PrecisionConfig pc;
    pc.compute = ComputeMode::fp8;
    pc.grad_dtype = GradDtype::fp32;
    pc.fp8.scaling = scaling;
    Allocator& alloc = allocator_for(Device::cpu());
    const int64_t params_before = alloc.stats().cur(MemCategory::parameters);
    GPT sharded(mc, Device::cpu(), DType::f32, R, pc, {}, FlatShard{me, R});
    const int64_t params_sharded = alloc.stats().cur(MemCategory::parameters) - params_before;
    GPT whole(mc, Device::cpu(), DType::f32, R, pc);
    ParameterStore& S = sharded.params();
    ParameterStore& W = whole.params();
    REQUIRE(S.master_sharded());
    REQUIRE(!W.master_sharded());
    CHECK(S.master().numel() * R == W.padded_numel());
    CHECK(S.master_begin() == me * S.master().numel());
    // The f32 parameters this rank holds: its master shard, plus copies of what the FP8 linears do not read.
    CHECK(params_sharded == (S.master().numel() + S.compute().numel()) * 4);
    CHECK(S.compute().numel() + S.codes().numel() == W.numel());

    for (int step = 0; step < 3; ++step) {
      INFO("version " << step);
      if (step == 0) {
        sharded.init(11);
        whole.init(11);
      } else {  // an update: the same new master on both (the whole one's, cut to this rank's shard)
        std::vector<float> m = W.master().to_float_vector();
        const std::vector<float> noise = test::seeded_normal(W.padded_numel(), 100 + step);
        for (size_t i = 0; i < m.size(); ++i) m[i] += (i < static_cast<size_t>(W.numel())) ? 0.01f * noise[i] : 0;
        W.set_master(m.data());
        S.set_master(m.data());
        // As the trainer ends a step: the amaxes max-reduced over the ranks (each rank cast its pieces), then
        // the scales of the new version.
        (void)sharded.reduce_fp8_amax([&](std::vector<float>& v) {
          Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
          comm->all_reduce(t, ReduceOp::max);
          v = t.to_float_vector();
        });
        (void)whole.reduce_fp8_amax();
        sharded.on_optimizer_step();
        whole.on_optimizer_step();
      }
      sharded.publish_weights(weight_collectives(*comm));
      whole.publish_weights(weight_collectives(*comm));  // a whole master: nothing to do
      for (size_t i = 0; i < W.specs().size(); ++i) {
        const std::string& name = W.specs()[i].name;
        const Tensor& got = S.var(i)->value;
        if (got.dtype() == DType::f32) {  // a compute copy, gathered: the master's values
          INFO(name);
          CHECK(got.to_float_vector() == W.var(i)->value.to_float_vector());
          continue;
        }
        // An FP8 weight: the gathered codes are the codes a whole-master cast makes, with its scale.
        const std::string layer = name.substr(0, name.size() - std::string(".weight").size());
        Fp8LinearState* ws = whole.fp8_state(layer);
        Fp8LinearState* ss = sharded.fp8_state(layer);
        REQUIRE(ws);
        REQUIRE(ss);
        const QuantizedTensor& wq = ws->weight_for_step(W.var(i)->value);
        const QuantizedTensor& sq = ss->weight_for_step(got);
        INFO(layer);
        REQUIRE(sq.codes.nbytes() == wq.codes.nbytes());
        CHECK(std::memcmp(sq.codes.raw(), wq.codes.raw(), wq.codes.nbytes()) == 0);
        CHECK(sq.tensor_scale_inv() == wq.tensor_scale_inv());
        // This rank's part of the amax; reduced over the ranks, the whole weight's.
        Tensor amax = Tensor::from_vector({ss->weight.amax_this_step}, {1});
        comm->all_reduce(amax, ReduceOp::max);
        CHECK(amax.to_float_vector()[0] == ws->weight.amax_this_step);
      }
      // The whole master, gathered for a checkpoint, is the whole store's.
      CHECK(gather_master(*comm, S).to_float_vector() == W.master().to_float_vector());
      // The same forward: the same loss, bit for bit.
      Tensor tokens = Tensor::empty({2, 16}, DType::i32), targets = Tensor::empty({2, 16}, DType::i32);
      for (int i = 0; i < 32; ++i) {
        tokens.data<int32_t>()[i] = (i * 5 + step) % 64;
        targets.data<int32_t>()[i] = (i * 3 + 1) % 64;
      }
      CHECK(sharded.loss(tokens, targets)->value.to_float_vector() ==
            whole.loss(tokens, targets)->value.to_float_vector());
    }
  }
}

TEST_CASE("mpi: 20 steps at ZeRO stages 0 - 1 and 2 end at the same weights", "[mpi][zero][train]") {
  auto comm = test::mpi_comm();
  const int R = comm->size(), me = comm->rank();
  const fs::path root = test::job_root("zero");
  if (me == 0) {
    fs::remove_all(root);
    fs::create_directories(root / "data");
    std::mt19937 rng(5);
    for (const char* name : {"train_000000.bin", "val_000000.bin"}) {
      std::vector<uint16_t> toks(20000);
      for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7 + rng() % 3) % 64);
      write_shard((root / "data" / name).string(), toks);
    }
  }
  comm->barrier();

  struct Run {
    int stage;
    const char* grad_dtype;
    const char* recompute;
    const char* compute;  // fp32, or fp8 (FP8 weights: stages 1 and 2 keep a master shard and gather codes)
    std::vector<float> weights;
    int64_t optim_bytes = -1, optim_file_bytes = -1, grad_bytes = -1, grad_peak = -1;  // rank 0's, last step
    int64_t param_bytes = -1, fp8_cache_bytes = -1;                                    // rank 0's, last step
  };
  std::vector<Run> runs;
  for (auto [stage, grad_dtype, recompute, compute] :
       {std::tuple{0, "fp32", "none", "fp32"}, {1, "fp32", "none", "fp32"}, {2, "fp32", "none", "fp32"},
        {0, "bf16", "none", "fp32"}, {2, "bf16", "none", "fp32"}, {0, "fp32", "block", "fp32"},
        {2, "fp32", "block", "fp32"}, {0, "fp32", "none", "fp8"}, {1, "fp32", "none", "fp8"},
        {2, "fp32", "none", "fp8"}})
    runs.push_back({stage, grad_dtype, recompute, compute, {}});
  for (Run& run : runs) {
    const std::string name = fmt::format("stage{}_{}_{}_{}", run.stage, run.grad_dtype, run.recompute, run.compute);
    // total_batch_tokens = 2 micro-batches of 4x16 per rank: stage 2 reduces both; 3 layers of 32
    // channels, so the shard cuts of 2 and 3 ranks fall inside layers.
    const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu, log_every: 5}}
model: {{n_layer: 3, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, val: {1}/data/val_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: {5}, max_steps: 20, eval_every: 10, eval_steps: 2, checkpoint_every: 0, recompute: {4}}}
optim: {{lr: 3.0e-3, warmup_steps: 2, schedule: cosine, weight_decay: 0.1, grad_clip: 1.0}}
precision: {{compute: {6}, grad_dtype: {3}}}
distributed: {{zero_stage: {2}, bucket_mb: 0.01, timeout_s: 120}}
)",
                                         name, root.string(), run.stage, run.grad_dtype, run.recompute, 128 * R,
                                         run.compute);
    const Config cfg = parse_config(yaml, name + ".yaml");
    const TrainResult r = train(cfg, *comm);
    CHECK(r.steps == 20);
    CHECK(r.last_val_loss.value() < r.first_val_loss.value());
    const fs::path ckpt = root / name / "checkpoints" / "step_00000020";
    comm->barrier();
    REQUIRE(fs::exists(ckpt / "model.bin"));
    run.weights = read_floats(ckpt / "model.bin");
    const fs::path optim_file = ckpt / fmt::format("optim_rank{}.bin", run.stage == 0 ? 0 : me);
    REQUIRE(fs::exists(optim_file));
    run.optim_file_bytes = static_cast<int64_t>(fs::file_size(optim_file));
    if (run.stage > 0) CHECK(fs::file_size(ckpt / "optim_rank1.bin") == fs::file_size(ckpt / "optim_rank0.bin"));
    // Rank 0's allocator at the last step, as the run recorded it.
    std::ifstream mf(root / name / "metrics.jsonl");
    std::string line;
    while (std::getline(mf, line)) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("memory")) continue;
      run.optim_bytes = j["memory"]["current"]["optimizer"].get<int64_t>();
      run.grad_bytes = j["memory"]["current"]["gradients"].get<int64_t>();
      run.grad_peak = j["memory"]["peak"]["gradients"].get<int64_t>();
      run.param_bytes = j["memory"]["current"]["parameters"].get<int64_t>();
      run.fp8_cache_bytes = j["memory"]["current"]["fp8_cache"].get<int64_t>();
    }
  }

  // Each run against stage 0 with the same gradient dtype and recompute: f32 sums in another order
  // (1e-5 of the largest weight); bf16 gradients round at other points (stage 2 rounds every
  // micro-batch's rank sum, stage 0 the local sum over micro-batches), each up to 2^-9 relative and
  // amplified by AdamW's normalisation where a gradient is near zero: BF16 tolerance, measured against
  // the difference bf16 gradients make at stage 0 (runs[3] against runs[0]).
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
    return d;
  };
  float scale = 0;
  for (float w : runs[0].weights) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    if (run.stage == 0) continue;
    const Run& base = *std::find_if(runs.begin(), runs.end(), [&](const Run& b) {
      return b.stage == 0 && std::string(b.grad_dtype) == run.grad_dtype && std::string(b.recompute) == run.recompute &&
             std::string(b.compute) == run.compute;
    });
    INFO("stage " << run.stage << " grad_dtype " << run.grad_dtype << " recompute " << run.recompute << " compute "
                  << run.compute << " (" << R << " ranks)");
    REQUIRE(run.weights.size() == base.weights.size());
    const double d = max_diff(run.weights, base.weights), bf16_gap = max_diff(runs[3].weights, runs[0].weights);
    INFO("max weight difference " << d << ", largest weight " << scale << "; stage 0 bf16 vs fp32 gradients "
                                  << bf16_gap);
    if (std::string(run.compute) == "fp8") {
      CHECK(d <= FP8_TOL * scale);
    } else if (std::string(run.grad_dtype) == "bf16") {
      CHECK(d <= 1e-2 * scale);
      CHECK(d <= 2 * bf16_gap);  // no further from stage 0 than bf16 rounding itself takes it
    } else {
      CHECK(d <= 1e-5 * scale);
    }
    // Each rank's AdamW moments are exactly 1/R of stage 0's (the buffers are padded to R).
    CHECK(run.optim_file_bytes * R == base.optim_file_bytes);
    CHECK(run.optim_bytes * R == base.optim_bytes);
    CHECK(run.optim_bytes > 0);
    if (run.stage == 2) {
      // Between steps only the 1/R gradient shard exists; within one the staging buckets come and go.
      CHECK(run.grad_bytes * R == base.grad_bytes);
      CHECK(run.grad_peak < base.grad_peak);
    } else {
      CHECK(run.grad_bytes == base.grad_bytes);
    }
    if (std::string(run.compute) == "fp8") {
      // The f32 master is sharded: 1/R of stage 0's per rank, plus the f32 copies of the parameters the
      // FP8 linears do not read (embeddings, LayerNorms, biases: what publish_weights gathers for the ops),
      // while the FP8 weights exist whole only as 1-byte codes.
      const ModelConfig mc = parse_config(fmt::format(R"(
model: {{n_layer: 3, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {0}/data/train_*.bin}}
precision: {{compute: fp8}}
)", root.string()), "model.yaml").model;
      PrecisionConfig pc;
      pc.compute = ComputeMode::fp8;
      GPT whole(mc, Device::cpu(), DType::f32, R, pc);
      const ParameterStore& P = whole.params();
      int64_t fp8_weights = 0;
      for (const std::string& layer : whole.fp8_layers())
        if (layer != "lm_head") fp8_weights += P.var(layer + ".weight")->value.numel();
      REQUIRE(fp8_weights > 0);
      const int64_t copies = P.padded_numel() - fp8_weights - (P.padded_numel() - P.numel());
      CHECK(base.param_bytes == P.padded_numel() * 4);
      CHECK(run.param_bytes == P.padded_numel() / R * 4 + copies * 4);
      CHECK(run.fp8_cache_bytes >= fp8_weights);
    }
  }
  comm->barrier();
  if (me == 0) fs::remove_all(root);
}
