// Under mpirun -np 2: the MPI collectives on random data (aliasing included), ZeRO-2's bucket
// reduction during backward, and 20 training steps at ZeRO stages 0, 1 and 2 that must end at the
// same weights, with stages 1 and 2 holding half of stage 0's optimizer state per rank.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "autograd/tape.h"
#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "dist/zero.h"
#include "nn/gpt.h"
#include "train/trainer.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<Communicator> test_comm() {
  auto comm = make_mpi_communicator();
  comm->set_timeout(120);  // a rank that failed a REQUIRE ends the job instead of hanging it
  return comm;
}

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// |a - b| <= tol * max(1, |b|) elementwise.
bool close(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > tol * std::max(1.0f, std::abs(b[i]))) return false;
  return true;
}

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<float> v(fs::file_size(p) / sizeof(float));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

// One directory for every rank of this job: rank 0's pid names it.
fs::path shared_root(const char* what) {
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return fs::temp_directory_path() / fmt::format("fp8t_mpi_{}_{}", what, pid);
}

}  // namespace

TEST_CASE("mpi: collectives on random data - including aliased buffers", "[mpi]") {
  auto comm = test_comm();
  const int R = comm->size(), me = comm->rank();
  REQUIRE(R >= 2);
  REQUIRE(comm->backend() == "mpi");
  const int64_t n = 1037;  // odd, so nothing lines up by accident
  std::vector<std::vector<float>> data;  // every rank's input, regenerated locally from its seed
  for (int r = 0; r < R; ++r) data.push_back(random_values(n * R, 100 + r));
  std::vector<float> sum(n * R, 0.0f), mx(n * R, -INFINITY);
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < n * R; ++i) {
      sum[i] += data[r][i];
      mx[i] = std::max(mx[i], data[r][i]);
    }
  auto slice = [&](const std::vector<float>& v, int r) {
    return std::vector<float>(v.begin() + r * n, v.begin() + (r + 1) * n);
  };
  const double tol = 1e-5;  // FP32 sums in another order

  Tensor t = Tensor::from_vector(data[me], {n * R});
  comm->all_reduce(t, ReduceOp::sum);
  CHECK(close(t.to_float_vector(), sum, tol));
  t = Tensor::from_vector(data[me], {n * R});
  comm->all_reduce(t, ReduceOp::max);
  CHECK(t.to_float_vector() == mx);  // max is exact

  // reduce_scatter into a separate buffer, then into in's own slice (aliased).
  Tensor in = Tensor::from_vector(data[me], {n * R});
  Tensor out = Tensor::zeros({n}, DType::f32);
  comm->reduce_scatter(in, out, ReduceOp::sum);
  CHECK(close(out.to_float_vector(), slice(sum, me), tol));
  CHECK(in.to_float_vector() == data[me]);  // input untouched
  Tensor mine = in.slice_flat(me * n, {n});
  comm->reduce_scatter(in, mine, ReduceOp::sum);
  CHECK(close(mine.to_float_vector(), slice(sum, me), tol));
  Tensor in_max = Tensor::from_vector(data[me], {n * R});
  Tensor mine_max = in_max.slice_flat(me * n, {n});
  comm->reduce_scatter(in_max, mine_max, ReduceOp::max);
  CHECK(mine_max.to_float_vector() == slice(mx, me));

  // all_gather from a separate buffer, then from out's own slice (aliased).
  std::vector<float> gathered;
  for (int r = 0; r < R; ++r) {
    const auto s = slice(data[r], r);
    gathered.insert(gathered.end(), s.begin(), s.end());
  }
  Tensor part = Tensor::from_vector(slice(data[me], me), {n});
  Tensor all = Tensor::zeros({n * R}, DType::f32);
  comm->all_gather(part, all);
  CHECK(all.to_float_vector() == gathered);
  Tensor all2 = Tensor::from_vector(data[me], {n * R});
  Tensor own = all2.slice_flat(me * n, {n});
  comm->all_gather(own, all2);
  CHECK(all2.to_float_vector() == gathered);

  // reduce to a root, broadcast from a non-zero root, barrier.
  Tensor red = Tensor::from_vector(data[me], {n * R});
  comm->reduce(red, ReduceOp::sum, R - 1);
  if (me == R - 1) CHECK(close(red.to_float_vector(), sum, tol));
  Tensor b = Tensor::from_vector(data[me], {n * R});
  comm->broadcast(b, 1);
  CHECK(b.to_float_vector() == data[1]);
  comm->barrier();
}

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
  int reduces = 0;

 private:
  Communicator& c_;
};
}  // namespace

TEST_CASE("mpi: ZeRO-2 reduces buckets during backward and matches a reduce-scatter", "[mpi][zero]") {
  auto mpi = test_comm();
  CountingComm comm(*mpi);
  const int R = comm.size(), me = comm.rank();
  ModelConfig mc;
  mc.n_layer = 3;
  mc.n_head = 2;
  mc.d_model = 32;
  mc.vocab_size = 64;
  mc.seq_len = 16;
  GPT model(mc, Device::cpu(), DType::f32, R);
  model.init(3);
  ParameterStore& P = model.params();
  DistributedConfig dc;
  dc.zero_stage = 2;
  dc.bucket_mb = 8192 * 4.0 / (1 << 20);  // 8192 floats: several buckets per shard
  GradientReducer reducer(dc, comm, P);

  std::mt19937 rng(11 + me);  // each rank its own batch
  std::vector<float> tok(2 * 16), tgt(2 * 16);
  Tensor tokens = Tensor::empty({2, 16}, DType::i32), targets = Tensor::empty({2, 16}, DType::i32);
  for (int i = 0; i < 32; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % 64);
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % 64);
  }
  P.zero_grads();
  reducer.before_forward();
  Tape tape;
  Var loss;
  {
    TapeScope scope(&tape);
    loss = model.loss(tokens, targets);
  }
  auto hook = reducer.backward_hook();
  int during = 0;
  tape.set_progress_hook([&](size_t left) {
    hook(left);
    if (left > 0) during = comm.reduces;
  });
  tape.backward(loss);
  // Reference: every rank's local gradient, reduce-scattered after the fact.
  Tensor local = P.grads().to(Device::cpu());
  // (the shard of `local` is already reduced on this rank; rebuild the local gradient instead)
  P.zero_grads();
  {
    Tape t2;
    Var l2;
    {
      TapeScope scope(&t2);
      l2 = model.loss(tokens, targets);
    }
    t2.backward(l2);
  }
  Tensor reference = P.grads().to(Device::cpu());
  const int64_t shard = P.padded_numel() / R;
  Tensor ref_mine = reference.slice_flat(me * shard, {shard});
  mpi->reduce_scatter(reference, ref_mine, ReduceOp::sum);
  P.grads().copy_from(local);
  const double sq = reducer.reduce();

  CHECK(during > 0);                 // some buckets went out while backward was still running
  CHECK(comm.reduces > during);      // and the embedding's bucket only at the end (wte is used first)
  const auto got = P.grads().slice_flat(me * shard, {shard}).to_float_vector();
  CHECK(got == ref_mine.to_float_vector());  // two ranks: a + b either way, exactly
  double ref_sq = 0;
  for (float x : ref_mine.to_float_vector()) ref_sq += static_cast<double>(x) * x;
  Tensor total = Tensor::from_vector({static_cast<float>(ref_sq)}, {1});
  mpi->all_reduce(total, ReduceOp::sum);
  CHECK(std::abs(sq - total.to_float_vector()[0]) <= 1e-5 * sq);
}

TEST_CASE("mpi: 20 steps at ZeRO stages 0 - 1 and 2 end at the same weights", "[mpi][zero][train]") {
  auto comm = test_comm();
  const int R = comm->size(), me = comm->rank();
  const fs::path root = shared_root("zero");
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

  std::vector<std::vector<float>> weights;
  std::vector<int64_t> optim_bytes, optim_file_bytes;
  for (int stage : {0, 1, 2}) {
    const std::string name = fmt::format("stage{}", stage);
    // total_batch_tokens 256 = 2 micro-batches of 4x16 per rank: stage 2 accumulates first.
    const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu, log_every: 5}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, val: {1}/data/val_*.bin}}
train: {{micro_batch: 4, total_batch_tokens: 256, max_steps: 20, eval_every: 10, eval_steps: 2, checkpoint_every: 0}}
optim: {{lr: 3.0e-3, warmup_steps: 2, schedule: cosine, weight_decay: 0.1, grad_clip: 1.0}}
distributed: {{zero_stage: {2}, bucket_mb: 0.02, timeout_s: 120}}
)",
                                         name, root.string(), stage);
    const Config cfg = parse_config(yaml, name + ".yaml");
    const TrainResult r = train(cfg, *comm);
    CHECK(r.steps == 20);
    CHECK(r.last_val_loss < r.first_val_loss);
    const fs::path ckpt = root / name / "checkpoints" / "step_00000020";
    comm->barrier();
    REQUIRE(fs::exists(ckpt / "model.bin"));
    weights.push_back(read_floats(ckpt / "model.bin"));
    REQUIRE(fs::exists(ckpt / fmt::format("optim_rank{}.bin", stage == 0 ? 0 : me)));
    optim_file_bytes.push_back(static_cast<int64_t>(fs::file_size(ckpt / fmt::format("optim_rank{}.bin", stage == 0 ? 0 : me))));
    if (stage > 0) CHECK(fs::file_size(ckpt / "optim_rank1.bin") == fs::file_size(ckpt / "optim_rank0.bin"));
    // Rank 0's allocator at the last step, as the run recorded it.
    std::ifstream mf(root / name / "metrics.jsonl");
    std::string line;
    int64_t opt = -1;
    while (std::getline(mf, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("memory")) opt = j["memory"]["current"]["optimizer"].get<int64_t>();
    }
    optim_bytes.push_back(opt);
  }

  float scale = 0;
  for (float w : weights[0]) scale = std::max(scale, std::abs(w));
  for (int s : {1, 2}) {
    INFO("stage " << s);
    REQUIRE(weights[s].size() == weights[0].size());
    double max_diff = 0;
    for (size_t i = 0; i < weights[0].size(); ++i)
      max_diff = std::max(max_diff, static_cast<double>(std::abs(weights[s][i] - weights[0][i])));
    CHECK(max_diff <= 1e-5 * scale);
    // Each rank's AdamW moments are exactly 1/R of stage 0's (the buffers are padded to R).
    CHECK(optim_file_bytes[s] * R == optim_file_bytes[0]);
    CHECK(optim_bytes[s] * R == optim_bytes[0]);
  }
  CHECK(optim_bytes[0] > 0);
  comm->barrier();
  if (me == 0) fs::remove_all(root);
}
