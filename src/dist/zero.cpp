// ZeRO stages 0-2: gradient reduction over ranks. Stage 0 all-reduces the whole gradient buffer
// after the last backward; stage 1 reduce-scatters it, each rank keeping its shard.
//
// Stage 2 (several ranks) keeps no full gradient buffer: the store allocates only this rank's shard,
// and parameters get their gradients from staging buckets (contiguous runs of whole parameters, in
// descending offsets) allocated when a gradient is first written. In every micro-batch's backward a
// bucket is launched as soon as its parameters are complete: each piece of it inside one rank's shard
// is reduced to that rank (on NCCL's communication stream, overlapping the rest of the backward); the
// bucket is retired later, once kMaxInFlight newer ones are in flight or at reduce(): the compute
// stream waits for that reduction, the owner adds it into its shard, and the staging buffer returns to
// the pool only then, so no later kernel can reuse memory that NCCL still reads. Staging therefore
// holds at most kMaxInFlight buckets in flight plus those still accumulating: wte's (the head writes
// it in the forward, the embedding at the end of the backward) and the one or two a tape node writes
// (with train.recompute: block too, as a checkpoint node's inner backward reports its progress). wte's
// bucket is as large as wte: a parameter's gradient is one view, never split across buckets.
// The cost: every micro-batch reduces the whole gradient, where stages 0 and 1 reduce once per step.
// With one rank stage 2 is stage 0 (whole buffer, nothing to reduce).
#include "dist/zero.h"

#include <algorithm>
#include <cstring>

#include "autograd/tape.h"
#include "ops/ops.h"

namespace fp8t {

FlatShard gradient_shard(const DistributedConfig& cfg, int rank, int world) {
  if (cfg.zero_stage != 2 || world == 1) return {};
  return {rank, world};
}

FlatShard master_shard(const DistributedConfig& cfg, int rank, int world) {
  if (cfg.zero_stage < 1 || world == 1) return {};
  return {rank, world};
}

WeightCollectives weight_collectives(Communicator& comm) {
  if (comm.size() == 1) return {};
  return {[&comm](Tensor& t) { comm.all_reduce(t, ReduceOp::max); },
          [&comm](Tensor& t, const std::vector<int64_t>& cuts) { comm.all_gather_v(t, cuts); }};
}

Tensor gather_master(Communicator& comm, ParameterStore& store) {
  const Tensor& master = store.master();
  if (!store.master_sharded()) return master.to(Device::cpu(), MemCategory::workspace);
  const int64_t W = comm.size(), shard = master.numel();
  FP8T_CHECK(shard * W == store.padded_numel() && store.master_begin() == comm.rank() * shard,
             "gather_master: this rank's master [{}, {}) is not shard {} of {} equal shards of {}",
             store.master_begin(), store.master_begin() + shard, comm.rank(), W, store.padded_numel());
  Tensor host = Tensor::empty({store.padded_numel()}, DType::f32, Device::cpu(), MemCategory::workspace);
  const int64_t chunk = std::min<int64_t>(shard, int64_t{16} << 20);
  Tensor buf = Tensor::empty({W * chunk}, DType::f32, master.device(), MemCategory::comm);
  for (int64_t at = 0; at < shard; at += chunk) {
    const int64_t n = std::min(chunk, shard - at);
    Tensor out = buf.slice_flat(0, {W * n});
    comm.all_gather(master.slice_flat(at, {n}), out);
    const Tensor h = out.device().is_cpu() ? out : out.to(Device::cpu(), MemCategory::workspace);
    for (int64_t r = 0; r < W; ++r)
      std::memcpy(host.data<float>() + r * shard + at, h.data<float>() + r * n, static_cast<size_t>(n) * 4);
  }
  return host;
}

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
  staged_ = cfg.zero_stage == 2 && world > 1;
  const bool shard_only = store.grads_sharded();
  FP8T_CHECK(shard_only == staged_ && (!staged_ || (store.grads_begin() == begin_ && store.grads().numel() == shard)),
             "GradientReducer: ZeRO stage {} on {} rank(s) needs a ParameterStore holding {} (make it with "
             "gradient_shard())",
             cfg.zero_stage, world, staged_ ? "only this rank's gradient shard" : "the whole gradient buffer");
  if (!staged_) return;

  // Buckets of whole parameters from the end of the buffer down (the order gradients complete in:
  // later layers first), each up to bucket_elems_ unless one parameter alone is larger.
  const auto& specs = store.specs();
  bucket_of_param_.resize(specs.size());
  for (size_t e = specs.size(); e > 0;) {
    size_t s = e - 1;
    int64_t elems = specs[s].numel();
    while (s > 0 && elems + specs[s - 1].numel() <= bucket_elems_) elems += specs[--s].numel();
    Bucket b{specs[s].offset, specs[e - 1].offset + specs[e - 1].numel(), s, e, {}, {}};
    for (int64_t r = b.begin / shard; r * shard < b.end; ++r)
      b.pieces.push_back({std::max(b.begin, r * shard), std::min(b.end, (r + 1) * shard), static_cast<int>(r)});
    for (size_t i = s; i < e; ++i) bucket_of_param_[i] = buckets_.size();
    buckets_.push_back(std::move(b));
    e = s;
  }
  for (size_t i = 0; i < specs.size(); ++i) store.var(i)->grad_cell->make_grad = [this, i] { return stage(i); };
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; staged_ && i < store_.specs().size(); ++i) store_.var(i)->grad_cell->make_grad = nullptr;
  if (in_flight_.empty()) return;
  try {  // left by an exception: the staging buffers must outlive the reductions that read them
    comm_.synchronize();
  } catch (...) {
  }
}

size_t GradientReducer::bucket_of(const std::string& param) const {
  FP8T_CHECK(staged_, "GradientReducer::bucket_of: no buckets (stage {}, {} rank(s))", cfg_.zero_stage, comm_.size());
  const auto& specs = store_.specs();
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == param) return bucket_of_param_[i];
  FP8T_FAIL("no parameter named '{}'", param);
}

int64_t GradientReducer::bucket_bytes(size_t b) const {
  const Bucket& k = buckets_.at(b);
  return (k.end - k.begin) * static_cast<int64_t>(dtype_size(store_.grad_dtype()));
}

int64_t GradientReducer::max_bucket_bytes() const {
  int64_t m = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) m = std::max(m, bucket_bytes(b));
  return m;
}

void GradientReducer::begin_micro() {
  // bf16 gradients: the biases' and norms' f32 sums go to accumulators zeroed in one pass, their adds into the
  // gradients waiting for end_micro. Not where gradients are staged (ZeRO-2 on several ranks): the ops' sums must
  // reach the buckets as they are reduced, and between steps only the gradient shard is to be held.
  if (!staged_ && !store_.grads_sharded()) store_.arm_accumulators(/*defer_commits=*/true);
  if (!staged_) return;
  FP8T_CHECK(!armed_, "GradientReducer: begin_micro() again before end_micro()");
  const size_t n = store_.specs().size();
  base_uses_.resize(n);
  base_cell_uses_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    base_uses_[i] = store_.var(i).use_count();
    base_cell_uses_[i] = store_.var(i)->grad_cell.use_count();
  }
  touched_.assign(n, false);
  next_bucket_ = 0;
  armed_ = true;
}

std::function<void(size_t)> GradientReducer::backward_hook() {
  if (!staged_) return {};
  FP8T_CHECK(armed_, "GradientReducer: begin_micro() must precede the forward pass and backward_hook()");
  return [this](size_t) { on_backward_progress(); };
}

// make_grad of parameter i: a view of its bucket's staging buffer, allocated (zeroed) on first use.
Tensor GradientReducer::stage(size_t i) {
  const ParamSpec& s = store_.specs()[i];
  FP8T_CHECK(armed_, "the gradient of {} is needed outside a micro-batch: at ZeRO stage 2 call "
             "GradientReducer::begin_micro() before the forward pass", s.name);
  touched_[i] = true;
  const size_t b = bucket_of_param_[i];
  Bucket& k = buckets_[b];
  if (!k.staging.defined()) {
    // One staging buffer per bucket: a reduction of it still in flight (an earlier micro-batch's) is
    // retired first.
    while (std::any_of(in_flight_.begin(), in_flight_.end(), [&](const InFlight& f) { return f.bucket == b; }))
      retire_oldest();
    k.staging = Tensor::zeros({k.end - k.begin}, store_.grad_dtype(), store_.device(), MemCategory::gradients);
  }
  return k.staging.slice_flat(s.offset - k.begin, s.shape);
}

// A gradient is complete once it was written and no tape node that could add to it is left: such a
// node holds the parameter's Var or its GradCell, so both use counts are back at rest. (With
// train.recompute: block a checkpoint node fetches its block's parameters when it runs; they are
// complete once its inner nodes holding them ran.)
bool GradientReducer::param_complete(size_t i) const {
  const Var& v = store_.var(i);
  return touched_[i] && v.use_count() == base_uses_[i] && v->grad_cell.use_count() == base_cell_uses_[i];
}

bool GradientReducer::bucket_complete(const Bucket& b) const {
  for (size_t i = b.first_param; i < b.end_param; ++i)
    if (!param_complete(i)) return false;
  return true;
}

// Buckets launch in one fixed order on every rank (collectives must match), each once complete.
void GradientReducer::on_backward_progress() {
  while (next_bucket_ < buckets_.size() && bucket_complete(buckets_[next_bucket_])) launch(next_bucket_++);
}

void GradientReducer::launch(size_t b) {
  Bucket& k = buckets_[b];
  // A bucket nobody wrote this micro-batch is reduced as zeros: every rank issues the same collectives.
  if (!k.staging.defined())
    k.staging = Tensor::zeros({k.end - k.begin}, store_.grad_dtype(), store_.device(), MemCategory::gradients);
  for (const Piece& p : k.pieces) {
    Tensor piece = k.staging.slice_flat(p.begin - k.begin, {p.end - p.begin});
    comm_.reduce(piece, ReduceOp::sum, p.owner);
  }
  for (size_t i = k.first_param; i < k.end_param; ++i) store_.var(i)->grad = Tensor();  // a later write restages
  in_flight_.push_back({b, std::move(k.staging), comm_.ticket()});
  k.staging = Tensor();
  while (in_flight_.size() > kMaxInFlight) retire_oldest();
}

void GradientReducer::retire_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  comm_.wait(f.ticket);
  const Bucket& k = buckets_[f.bucket];
  Tensor& shard = store_.grads();
  for (const Piece& p : k.pieces) {
    if (p.owner != comm_.rank()) continue;
    Tensor dst = shard.slice_flat(p.begin - store_.grads_begin(), {p.end - p.begin});
    add_(dst, f.staging.slice_flat(p.begin - k.begin, {p.end - p.begin}));
  }
  // f.staging is freed here; whatever reuses its memory runs on the compute stream after the wait.
}

void GradientReducer::end_micro() {
  store_.commit_accumulators();
  if (!staged_) return;
  FP8T_CHECK(armed_, "GradientReducer: end_micro() without begin_micro()");
  while (next_bucket_ < buckets_.size()) launch(next_bucket_++);
  // Written again after their launch (not seen in GPT; correct regardless): reduced once more.
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].staging.defined()) launch(b);
  armed_ = false;  // what is in flight overlaps the next forward
}

double GradientReducer::reduce() {
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
    FP8T_CHECK(!armed_, "GradientReducer: reduce() before end_micro() of the last micro-batch");
    while (!in_flight_.empty()) retire_oldest();
  }
  const int64_t off = store_.grads_begin();
  Tensor sq = Tensor::from_vector({static_cast<float>(sum_squares(grads, begin_ - off, end_ - off))}, {1});
  if (!store_.device().is_cpu()) sq = sq.to(store_.device(), MemCategory::comm);
  comm_.all_reduce(sq, ReduceOp::sum);
  return sq.to_float_vector()[0];
}

std::optional<std::pair<float, float>> GradientReducer::reduce_with_loss(const Tensor& loss_sum) {
  Tensor& grads = store_.grads();
  if (comm_.size() != 1 || !grads.device().is_cuda() || loss_sum.dtype() != DType::f32 || loss_sum.numel() != 1 ||
      loss_sum.device() != grads.device())
    return std::nullopt;
  Tensor both = Tensor::empty({2}, DType::f32, grads.device(), MemCategory::workspace);
  Tensor loss = both.slice_flat(0, {1}), sq = both.slice_flat(1, {1});
  loss.copy_from(loss_sum.view({1}));
  sum_squares_into(grads, 0, store_.padded_numel(), sq);
  const std::vector<float> host = both.to_float_vector();
  return std::pair<float, float>{host[0], host[1]};
}

}  // namespace fp8t
