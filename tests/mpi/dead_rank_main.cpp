// A 2-rank training run for the dead-rank tests: the last rank dies (`die`) or stops responding
// (`hang`) at step 3's gradient reduction, through a communicator that wraps the real one; the
// survivors must end within distributed.timeout_s with a message, not hang.
// Usage: fp8t_mpi_dead_rank WORK_DIR die|hang
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string_view>
#include <thread>

#include "config/config.h"
#include "data/shard.h"
#include "dist/bootstrap.h"
#include "train/trainer.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

// The real communicator, except that on the last rank the `fault_at`-th reduce-scatter (ZeRO-1
// reduces once per step) exits abruptly or never returns.
class FaultyCommunicator : public Communicator {
 public:
  FaultyCommunicator(std::unique_ptr<Communicator> real, bool hang, int fault_at)
      : real_(std::move(real)), hang_(hang), fault_at_(fault_at) {}
  int rank() const override { return real_->rank(); }
  int size() const override { return real_->size(); }
  std::string backend() const override { return real_->backend(); }
  void all_reduce(Tensor& t, ReduceOp op) override { real_->all_reduce(t, op); }
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    if (rank() == size() - 1 && ++reductions_ == fault_at_) {
      if (!hang_) _exit(1);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    real_->reduce_scatter(in, out, op);
  }
  void all_gather(const Tensor& in, Tensor& out) override { real_->all_gather(in, out); }
  void broadcast(Tensor& t, int root) override { real_->broadcast(t, root); }
  void barrier() override { real_->barrier(); }
  void reduce(Tensor& t, ReduceOp op, int root) override { real_->reduce(t, op, root); }
  void set_timeout(double seconds) override { real_->set_timeout(seconds); }
  void synchronize() override { real_->synchronize(); }
  uint64_t ticket() override { return real_->ticket(); }
  void wait(uint64_t ticket) override { real_->wait(ticket); }

 private:
  std::unique_ptr<Communicator> real_;
  bool hang_;
  int fault_at_;
  int reductions_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string_view(argv[2]) != "die" && std::string_view(argv[2]) != "hang")) {
    std::fprintf(stderr, "usage: %s WORK_DIR die|hang\n", argv[0]);
    return 2;
  }
  const bool hang = std::string_view(argv[2]) == "hang";
  const fs::path root = argv[1];
  const std::string yaml = fmt::format(R"(
run: {{name: dead_rank, out_dir: {0}/run, seed: 7, device: cpu}}
model: {{n_layer: 1, n_head: 2, d_model: 16, vocab_size: 64, seq_len: 16}}
data: {{train: {0}/data/train_*.bin}}
train: {{micro_batch: 2, max_steps: 1000, eval_every: 0, checkpoint_every: 0}}
distributed: {{zero_stage: 1, timeout_s: 5}}
)",
                                       root.string());
  try {
    Config cfg = parse_config(yaml, "dead_rank.yaml");
    auto comm = std::make_unique<FaultyCommunicator>(bootstrap(cfg), hang, /*fault_at=*/3);
    if (comm->rank() == 0) {
      fs::create_directories(root / "data");
      std::vector<uint16_t> toks(4096);
      std::mt19937 rng(1);
      for (auto& t : toks) t = static_cast<uint16_t>(rng() % 64);
      write_shard((root / "data" / "train_000000.bin").string(), toks);
    }
    comm->barrier();
    train(cfg, *comm);
  } catch (const Error& e) {
    std::fprintf(stderr, "fp8train: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "dead_rank: training finished although a rank was told to die\n");
  return 0;
}
