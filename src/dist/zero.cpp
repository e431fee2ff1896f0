// ZeRO stages 0-2: gradient reduction over ranks and sharded optimizer checkpoints.
//
// Stage 2 and memory. Every parameter's gradient is a view of one flat buffer (ParameterStore),
// and micro-batches before the last accumulate into all of it, so the flat buffer stays allocated
// at full size. What stage 2 changes: during the last backward each bucket is reduced to the rank
// that owns it as soon as its gradients are complete, overlapping communication with the rest of
// the backward (on NCCL's communication stream); afterwards only this rank's shard holds summed
// values, and the rest of the buffer (this rank's own partial sums) is never read again. Freeing
// that rest would need per-bucket gradient buffers and a reduction after every micro-batch, which
// this trainer does not do; so stage 2 saves no gradient memory here, only optimizer memory (as
// stage 1) and communication time.
#include "dist/zero.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "train/checkpoint.h"

namespace fp8t {

namespace fs = std::filesystem;

GradientReducer::GradientReducer(const DistributedConfig& cfg, Communicator& comm, ParameterStore& store)
    : cfg_(cfg), comm_(comm), store_(store) {
  FP8T_CHECK(cfg.zero_stage >= 0 && cfg.zero_stage <= 2, "distributed.zero_stage {} is not supported; use 0, 1 or 2",
             cfg.zero_stage);
  FP8T_CHECK(cfg.bucket_mb > 0, "distributed.bucket_mb must be > 0, got {}", cfg.bucket_mb);
  const int64_t padded = store.padded_numel(), world = comm.size();
  FP8T_CHECK(padded % world == 0, "the flat buffers ({} elements) are not padded to a multiple of {} ranks", padded,
             world);
  const int64_t shard = padded / world;
  begin_ = cfg.zero_stage >= 1 ? comm.rank() * shard : 0;
  end_ = cfg.zero_stage >= 1 ? begin_ + shard : padded;
  bucket_elems_ = std::max<int64_t>(1, static_cast<int64_t>(cfg.bucket_mb * (1 << 20) / sizeof(float)));
  if (cfg.zero_stage != 2) return;

  // Buckets from the end of the buffer down (the order gradients complete in: later layers
  // first), cut at shard boundaries so that each has a single owner.
  const auto& specs = store.specs();
  for (int64_t r = world - 1; r >= 0; --r) {
    for (int64_t e = (r + 1) * shard; e > r * shard;) {
      const int64_t b = std::max(r * shard, e - bucket_elems_);
      size_t first = specs.size();
      for (size_t i = 0; i < specs.size(); ++i)
        if (specs[i].offset + specs[i].numel() > b) {
          first = i;
          break;
        }
      buckets_.push_back({b, e, static_cast<int>(r), first});
      e = b;
    }
  }
}

void GradientReducer::before_forward() {
  if (cfg_.zero_stage != 2) return;
  const size_t n = store_.specs().size();
  base_refs_.resize(n);
  for (size_t i = 0; i < n; ++i) base_refs_[i] = store_.var(i).use_count();
  next_bucket_ = 0;
  ready_from_ = n;
  armed_ = true;
}

std::function<void(size_t)> GradientReducer::backward_hook() {
  if (cfg_.zero_stage != 2) return {};
  FP8T_CHECK(armed_, "GradientReducer: before_forward() must precede backward_hook()");
  // A parameter is tracked if the tape references it now. With activation recompute a block's
  // parameters are referenced only inside its checkpoint node, so they are not tracked and their
  // buckets are reduced after the backward instead (correct, without overlap).
  const size_t n = store_.specs().size();
  seen_.assign(n, false);
  for (size_t i = 0; i < n; ++i) seen_[i] = store_.var(i).use_count() > base_refs_[i];
  return [this](size_t) { on_backward_progress(); };
}

// A gradient is complete once no tape node that could add to it is left: the nodes hold the
// parameter's Var, so its use count is back where it was before the forward.
bool GradientReducer::param_complete(size_t i) const {
  return seen_[i] && store_.var(i).use_count() == base_refs_[i];
}

void GradientReducer::on_backward_progress() {
  while (ready_from_ > 0 && param_complete(ready_from_ - 1)) --ready_from_;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first_param >= ready_from_)
    launch(buckets_[next_bucket_++]);
}

void GradientReducer::launch(const Bucket& b) {
  Tensor view = store_.grads().slice_flat(b.begin, {b.end - b.begin});
  comm_.reduce(view, ReduceOp::sum, b.owner);
}

double GradientReducer::reduce() {
  inject_test_fault();
  Tensor& grads = store_.grads();
  const int64_t padded = store_.padded_numel();
  if (comm_.size() == 1) return sum_squares(grads, 0, padded);
  if (cfg_.zero_stage == 0) {
    for (int64_t b = 0; b < padded; b += bucket_elems_) {
      Tensor view = grads.slice_flat(b, {std::min(bucket_elems_, padded - b)});
      comm_.all_reduce(view, ReduceOp::sum);
    }
    return sum_squares(grads, 0, padded);
  }
  if (cfg_.zero_stage == 1) {
    Tensor mine = grads.slice_flat(begin_, {end_ - begin_});
    comm_.reduce_scatter(grads, mine, ReduceOp::sum);
  } else {
    FP8T_CHECK(armed_, "GradientReducer: ZeRO stage 2 needs before_forward() before the last micro-batch");
    while (next_bucket_ < buckets_.size()) launch(buckets_[next_bucket_++]);
    comm_.synchronize();
    armed_ = false;
  }
  Tensor sq = Tensor::from_vector({static_cast<float>(sum_squares(grads, begin_, end_))}, {1});
  if (!store_.device().is_cpu()) sq = sq.to(store_.device(), MemCategory::comm);
  comm_.all_reduce(sq, ReduceOp::sum);
  return sq.to_float_vector()[0];
}

// Fault injection for the dead-rank tests: FP8T_TEST_DIE_AT_STEP=N makes the last rank exit
// abruptly at step N's reduction, FP8T_TEST_HANG_AT_STEP=N makes it stop responding there.
void GradientReducer::inject_test_fault() {
  ++steps_;
  if (comm_.rank() != comm_.size() - 1 || comm_.size() == 1) return;
  auto at = [&](const char* name) {
    const char* v = std::getenv(name);
    return v && std::atoi(v) == steps_;
  };
  if (at("FP8T_TEST_DIE_AT_STEP")) _exit(1);
  if (at("FP8T_TEST_HANG_AT_STEP"))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

void save_optimizer_state(const fs::path& dir, const Communicator& comm, int zero_stage, AdamW& opt) {
  if (zero_stage == 0 && comm.rank() != 0) return;  // identical on every rank
  write_tensor_file(dir / fmt::format("optim_rank{}.bin", comm.rank()), opt.m());
  write_tensor_file(dir / fmt::format("optim_v_rank{}.bin", comm.rank()), opt.v());
}

namespace {
// Fills dst (elements [begin, end) of the logical vector stored as `files` in rank order) from
// the files; elements past their end (padding of a smaller world) are zero.
void read_logical_range(const std::vector<fs::path>& files, int64_t begin, int64_t end, Tensor& dst) {
  std::vector<float> host(static_cast<size_t>(end - begin), 0.0f);
  int64_t file_begin = 0;
  for (const fs::path& f : files) {
    FP8T_CHECK(fs::exists(f), "checkpoint is missing {}", f.string());
    const int64_t n = static_cast<int64_t>(fs::file_size(f) / sizeof(float));
    const int64_t b = std::max(begin, file_begin), e = std::min(end, file_begin + n);
    if (b < e) {
      std::ifstream in(f, std::ios::binary);
      in.seekg(static_cast<std::streamoff>((b - file_begin) * sizeof(float)));
      in.read(reinterpret_cast<char*>(host.data() + (b - begin)), static_cast<std::streamsize>((e - b) * sizeof(float)));
      FP8T_CHECK(in.good(), "could not read {} elements at {} of {}", e - b, b - file_begin, f.string());
    }
    file_begin += n;
  }
  dst.copy_from(Tensor::from_vector(host, {end - begin}));
}
}  // namespace

void load_optimizer_state(const fs::path& dir, int ckpt_world, int ckpt_zero_stage, AdamW& opt) {
  const int files = ckpt_zero_stage == 0 ? 1 : ckpt_world;
  std::vector<fs::path> m_files, v_files;
  for (int r = 0; r < files; ++r) {
    m_files.push_back(dir / fmt::format("optim_rank{}.bin", r));
    v_files.push_back(dir / fmt::format("optim_v_rank{}.bin", r));
  }
  read_logical_range(m_files, opt.begin(), opt.end(), opt.m());
  read_logical_range(v_files, opt.begin(), opt.end(), opt.v());
}

}  // namespace fp8t
