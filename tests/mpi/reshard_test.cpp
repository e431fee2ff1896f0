// Under mpirun -np 2 and -np 3 (R ranks): a checkpoint written on N ranks at ZeRO stage s resumes on M
// ranks at stage t. Each run trains 8 steps of a fixed global batch (384 tokens: 6, 3 or 2 micro-batches
// per rank on 1, 2 or 3 ranks) on an unshuffled stream, so every world size reads the same tokens in each
// step (ShardLoader: rank r of world W takes window r of each group of W windows) and runs on any world
// size differ only in reduction order. The reference of a resume from step 4 on M ranks is the
// uninterrupted M-rank run from step 0 (with FP8 linears, the N-rank run that wrote the checkpoint: see
// below): the resumed run's losses of steps 5-8 and its final weights must match it within the reduction
// tolerance measured between the FP32 runs on N and M ranks. 1-rank runs run on rank 0 alone; under -np 3
// a 2-rank world of ranks 0 and 1 over TCP gives 2 -> 3 and 3 -> 2.
#include <algorithm>
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "train/trainer.h"
#include "tests/mpi/mpi_test_util.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 8, kCheckpointStep = 4;

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<float> v(fs::file_size(p) / sizeof(float));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::map<int, double> losses_of(const fs::path& run) {
  std::map<int, double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int>()] = j["loss"].get<double>();
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

// Which ranks of the job a run uses: rank 0 alone, all R over MPI, or ranks 0 and 1 over TCP (R = 3).
enum class World { one, all, two };

struct Job {
  Communicator& mpi;
  fs::path root;
  std::unique_ptr<Communicator> single, tcp;

  int size(World w) const { return w == World::one ? 1 : w == World::two ? 2 : mpi.size(); }
  Communicator* comm(World w) {
    if (w == World::all) return &mpi;
    if (w == World::one) return mpi.rank() == 0 ? single.get() : nullptr;
    return mpi.rank() < 2 ? tcp.get() : nullptr;
  }

  Config config(const std::string& name, int stage, const std::string& compute) const {
    const std::string yaml = fmt::format(R"(
run: {{name: {0}, out_dir: {1}/{0}, seed: 7, device: cpu, log_every: 100}}
model: {{n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, seq_len: 16}}
data: {{train: {1}/data/train_*.bin, shuffle: false}}
train: {{micro_batch: 4, total_batch_tokens: 384, max_steps: {3}, checkpoint_every: {4}}}
optim: {{lr: 1.0e-2, warmup_steps: 2, schedule: cosine, weight_decay: 0.1, grad_clip: 1.0}}
precision: {{compute: {5}, grad_dtype: fp32}}
distributed: {{zero_stage: {2}, bucket_mb: 0.01, timeout_s: 120}}
)",
                                         name, root.string(), stage, kSteps, kCheckpointStep, compute);
    return parse_config(yaml, name + ".yaml");
  }

  // Trains run `name` on world w (ranks outside it wait), from step 0 or resumed from `from`; the job's
  // ranks meet afterwards. Returns its run directory.
  fs::path train_on(World w, const std::string& name, int stage, const std::string& compute,
                    const std::optional<fs::path>& from = {}) {
    if (Communicator* c = comm(w)) CHECK(train(config(name, stage, compute), *c, from).steps == kSteps);
    mpi.barrier();
    return root / name;
  }
};

const char* world_name(World w) { return w == World::one ? "1" : w == World::two ? "2tcp" : "R"; }

}  // namespace

TEST_CASE("mpi: a checkpoint resumes on another number of ranks and ZeRO stage like a run there",
          "[mpi][zero][reshard]") {
  auto mpi = test::mpi_comm();
  const int R = mpi->size(), me = mpi->rank();
  Job job{*mpi, test::job_root("reshard"), make_single_communicator(), {}};
  if (me == 0) {
    fs::remove_all(job.root);
    fs::create_directories(job.root / "data");
    std::mt19937 rng(5);
    std::vector<uint16_t> toks(20000);  // 52 steps of 384 tokens: no run reaches the end of the shard
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7 + rng() % 3) % 64);
    write_shard((job.root / "data" / "train_000000.bin").string(), toks);
  }
  mpi->barrier();
  if (R == 3 && me < 2) job.tcp = make_tcp_communicator(me, 2, job.root / "tcp_rendezvous", 120);

  struct Case {
    World from;
    int from_stage;
    World to;
    int to_stage;
    const char* compute;
  };
  std::vector<Case> cases = {{World::all, 1, World::one, 1, "fp32"},   // R -> 1
                             {World::one, 1, World::all, 2, "fp32"},   // 1 -> R, stage 1 -> 2
                             {World::all, 2, World::one, 1, "fp32"},   // R -> 1, stage 2 -> 1
                             {World::all, 1, World::all, 2, "fp32"},   // stage 1 -> 2 on R ranks
                             {World::all, 1, World::one, 1, "fp8"},    // R -> 1, FP8 state merged
                             {World::all, 1, World::all, 2, "fp8"}};   // sharded master to sharded master
  if (R == 3) {
    cases.push_back({World::two, 1, World::all, 1, "fp32"});  // 2 -> 3
    cases.push_back({World::all, 1, World::two, 2, "fp32"});  // 3 -> 2, stage 1 -> 2
  }
  std::map<std::string, fs::path> full;  // uninterrupted runs, by world, stage and compute
  auto full_run = [&](World w, int stage, const std::string& compute) {
    const std::string name = fmt::format("full_{}_s{}_{}", world_name(w), stage, compute);
    if (!full.count(name)) full[name] = job.train_on(w, name, stage, compute);
    return full[name];
  };
  for (const Case& c : cases) {
    const int N = job.size(c.from), M = job.size(c.to);
    INFO(N << " ranks at stage " << c.from_stage << " -> " << M << " ranks at stage " << c.to_stage << ", "
           << c.compute << " (job of " << R << " ranks)");
    const bool fp8 = std::string(c.compute) == "fp8";
    const fs::path written = full_run(c.from, c.from_stage, c.compute);
    // FP8 runs part early: the first steps cast with the fresh scale 1 (empty amax histories), which flushes
    // gradients scaled by 1 / micro-batches per rank, so runs on N and M ranks are not a reduction order
    // apart. The resumed FP8 run is compared with the run that wrote the checkpoint: from the same state,
    // the same tokens per step and (merged, rescaled) scales it goes on as that run within reduction order.
    const fs::path ref = fp8 ? written : full_run(c.to, c.to_stage, c.compute);
    // The reduction-order gap between these world sizes, measured in FP32.
    const fs::path gap_from = full_run(c.from, c.from_stage, "fp32"), gap_to = full_run(c.to, c.to_stage, "fp32");
    const std::string name = fmt::format("resumed_{}_s{}_to_{}_s{}_{}", world_name(c.from), c.from_stage,
                                         world_name(c.to), c.to_stage, c.compute);
    const fs::path ckpt = written / "checkpoints" / fmt::format("step_{:08d}", kCheckpointStep);
    const fs::path resumed = job.train_on(c.to, name, c.to_stage, c.compute, ckpt);
    if (me != 0) continue;  // rank 0 takes part in every world: it compares the files

    CHECK(slurp(resumed / "log.txt").find(fmt::format("resharded from {} rank{} at ZeRO stage {} to {} rank{} at "
                                                      "ZeRO stage {}", N, N == 1 ? "" : "s", c.from_stage, M,
                                                      M == 1 ? "" : "s", c.to_stage)) != std::string::npos);
    const std::map<int, double> got = losses_of(resumed), want = losses_of(ref), other = losses_of(gap_from),
                                other_ref = losses_of(gap_to);
    REQUIRE(got.size() == size_t(kSteps - kCheckpointStep));
    const auto final_weights = [](const fs::path& run) {
      return read_floats(run / "checkpoints" / fmt::format("step_{:08d}", kSteps) / "model.bin");
    };
    const std::vector<float> w = final_weights(resumed), w_ref = final_weights(ref);
    REQUIRE(w.size() >= w_ref.size() - 3);  // model.bin is padded to a multiple of its ranks
    REQUIRE(w.size() <= w_ref.size() + 3);
    float scale = 0;
    for (float x : w_ref) scale = std::max(scale, std::abs(x));
    // The reduction tolerance: the gap between the uninterrupted FP32 runs on N and M ranks, which differ only
    // in reduction order (sums in another order, amplified by AdamW's normalisation where a gradient is near
    // zero). The resumed run, on N ranks for 4 steps and on M for 4, must be no farther from its reference
    // than twice that gap, plus 1e-5 of the largest weight (zero_test's FP32 tolerance). A resume that lost
    // the moments, misplaced a shard or the data position moves the weights by ~lr (1e-2), hundreds of
    // times more.
    const double gap = max_diff(final_weights(gap_from), final_weights(gap_to)), d = max_diff(w, w_ref);
    const double fp32_tol = 1e-5 * scale;
    const double tol = fp32_tol + 2 * gap;
    INFO("final weights: resumed vs reference " << d << ", N-rank run vs reference " << gap << ", tolerance " << tol
                                                << ", largest weight " << scale);
    CHECK(d <= tol);
    CHECK(gap <= 1e-4 * scale);  // the runs on N and M ranks agree: the tolerance stays small
    CHECK(max_diff(w, read_floats(ckpt / "model.bin")) > 100 * fp32_tol);  // the 4 steps moved the weights
    for (const auto& [step, loss] : got) {
      INFO("step " << step << ": resumed " << loss << ", reference " << want.at(step) << ", FP32 on N and M ranks "
                   << other.at(step) << ", " << other_ref.at(step));
      const double loss_gap = std::abs(other.at(step) - other_ref.at(step));
      CHECK(std::abs(loss - want.at(step)) <= 2e-5 * std::abs(loss) + 2 * loss_gap);
    }
  }
  mpi->barrier();
  if (me == 0) fs::remove_all(job.root);
}
