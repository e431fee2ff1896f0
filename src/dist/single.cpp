// The single-process communicator, and the collectives every communicator builds from its others.
#include "dist/comm.h"

#include <algorithm>

#include "core/check.h"

namespace fp8t {

namespace {
class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce(Tensor&, ReduceOp) override {}
  void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp) override {
    if (in.raw() != out.raw()) out.copy_from(in);
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    if (in.raw() != out.raw()) out.copy_from(in);
  }
  void broadcast(Tensor&, int) override {}
  void barrier() override {}
};
class StandinCommunicator final : public Communicator {
 public:
  StandinCommunicator(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  std::string backend() const override { return "stand-in"; }
  void all_reduce(Tensor&, ReduceOp) override {}
  void reduce_scatter(const Tensor&, Tensor&, ReduceOp) override {}
  void all_gather(const Tensor&, Tensor&) override {}
  void broadcast(Tensor&, int) override {}
  void barrier() override {}

 private:
  int rank_, world_;
};
}  // namespace

std::unique_ptr<Communicator> make_standin_communicator(int rank, int world) {
  FP8T_CHECK(world >= 1 && rank >= 0 && rank < world, "stand-in communicator: rank {} of {} ranks", rank, world);
  return std::make_unique<StandinCommunicator>(rank, world);
}

void Communicator::check_gather_cuts(const Tensor& t, const std::vector<int64_t>& cuts) const {
  FP8T_CHECK(cuts.size() == static_cast<size_t>(size()) + 1 && cuts.front() >= 0 && cuts.back() <= t.numel() &&
                 std::is_sorted(cuts.begin(), cuts.end()),
             "all_gather_v: {} cuts for {} ranks and {} elements; need {} ascending offsets within the tensor",
             cuts.size(), size(), t.numel(), size() + 1);
}

void Communicator::all_gather_v(Tensor& t, const std::vector<int64_t>& cuts) {
  check_gather_cuts(t, cuts);
  for (int r = 0; r < size(); ++r) {
    if (cuts[r + 1] == cuts[r]) continue;
    Tensor part = t.slice_flat(cuts[r], {cuts[r + 1] - cuts[r]});
    broadcast(part, r);
  }
}

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace fp8t
