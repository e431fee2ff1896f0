// Flat parameter/gradient buffers and their views.
#include "nn/params.h"

#include <algorithm>
#include <climits>

#include "ops/ops.h"

namespace fp8t {

ParameterStore::ParameterStore(std::vector<ParamSpec> specs, Device device, DType compute_dtype,
                               int64_t pad_multiple, DType grad_dtype, const std::vector<std::string>& master_only,
                               FlatShard grad_shard, FlatShard master_shard, DType codes_dtype)
    : specs_(std::move(specs)), shards_(master_shard.count) {
  FP8T_CHECK(pad_multiple >= 1, "pad_multiple must be >= 1");
  FP8T_CHECK(grad_dtype == DType::f32 || grad_dtype == DType::bf16, "gradients must be f32 or bf16, not {}",
             dtype_name(grad_dtype));
  FP8T_CHECK(is_fp8_dtype(codes_dtype),
             "the codes of parameters without a compute copy must be FP8, not {}", dtype_name(codes_dtype));
  const bool sharded = master_shard.count > 1;
  const bool separate = compute_dtype != DType::f32 || sharded;  // a sharded master is never read by ops
  int64_t compute_numel = 0, codes_numel = 0;
  for (auto& s : specs_) {
    s.offset = numel_;
    numel_ += s.numel();
    const bool master_read = std::find(master_only.begin(), master_only.end(), s.name) != master_only.end();
    s.compute_offset = separate && !master_read ? compute_numel : -1;
    if (s.compute_offset >= 0) compute_numel += s.numel();
    codes_offset_.push_back(sharded && master_read ? codes_numel : -1);
    if (codes_offset_.back() >= 0) codes_numel += s.numel();
  }
  for (const std::string& name : master_only)
    FP8T_CHECK(std::any_of(specs_.begin(), specs_.end(), [&](const ParamSpec& s) { return s.name == name; }),
               "no parameter named '{}' (asked to have no compute copy)", name);
  padded_ = (numel_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  FP8T_CHECK(master_shard.count >= 1 && master_shard.index >= 0 && master_shard.index < master_shard.count &&
                 padded_ % master_shard.count == 0,
             "master shard {} of {} does not cut the {} padded elements evenly (pad to a multiple of the ranks)",
             master_shard.index, master_shard.count, padded_);
  master_begin_ = master_shard.index * (padded_ / master_shard.count);
  master_ = Tensor::zeros({padded_ / master_shard.count}, DType::f32, device, MemCategory::parameters);
  FP8T_CHECK(grad_shard.count >= 1 && grad_shard.index >= 0 && grad_shard.index < grad_shard.count &&
                 padded_ % grad_shard.count == 0,
             "gradient shard {} of {} does not cut the {} padded elements evenly (pad to a multiple of the ranks)",
             grad_shard.index, grad_shard.count, padded_);
  const int64_t grads_numel = padded_ / grad_shard.count;
  grads_begin_ = grad_shard.index * grads_numel;
  grads_ = Tensor::zeros({grads_numel}, grad_dtype, device, MemCategory::gradients);
  if (separate && compute_numel > 0)
    compute_ = Tensor::zeros({compute_numel}, compute_dtype, device, MemCategory::parameters);
  if (codes_numel > 0) codes_ = Tensor::zeros({codes_numel}, codes_dtype, device, MemCategory::fp8_cache);
  for (const auto& s : specs_) {  // runs of parameters contiguous in both buffers, for sync_compute
    if (s.compute_offset < 0) continue;
    ParamSpec* last = compute_runs_.empty() ? nullptr : &compute_runs_.back();
    if (last && last->offset + last->numel() == s.offset && last->compute_offset + last->numel() == s.compute_offset)
      last->shape = {last->numel() + s.numel()};
    else
      compute_runs_.push_back({"", {s.numel()}, false, s.offset, s.compute_offset});
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    Tensor value = s.compute_offset >= 0   ? compute_.slice_flat(s.compute_offset, s.shape)
                   : codes_offset_[i] >= 0 ? codes_.slice_flat(codes_offset_[i], s.shape)
                                           : master_.slice_flat(s.offset, s.shape);
    Var v = make_var(std::move(value), true, s.name);
    if (!grads_sharded()) v->grad = grads_.slice_flat(s.offset, s.shape);
    vars_.push_back(std::move(v));
  }
}

const Var& ParameterStore::var(const std::string& name) const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return vars_[i];
  FP8T_FAIL("no parameter named '{}'", name);
}

std::vector<DecaySegment> ParameterStore::segments(int64_t begin, int64_t end) const {
  std::vector<DecaySegment> out;
  // compute: the compute offset of element b0 of [b0, e0) before clipping, or -1.
  auto push = [&](int64_t b0, int64_t e0, bool decay, int64_t compute) {
    const int64_t b = std::max(b0, begin), e = std::min(e0, end);
    if (b >= e) return;
    const int64_t c = compute >= 0 ? compute + (b - b0) : -1;
    DecaySegment* last = out.empty() ? nullptr : &out.back();
    const bool contiguous = last && last->end == b && last->decay == decay &&
                            (c < 0 ? last->compute < 0 : last->compute >= 0 && last->compute + (b - last->begin) == c);
    if (contiguous)
      last->end = e;
    else
      out.push_back({b, e, decay, c});
  };
  for (const auto& s : specs_) push(s.offset, s.offset + s.numel(), s.decay, s.compute_offset);
  push(numel_, padded_, false, -1);
  return out;
}

void ParameterStore::zero_grads() {
  grads_.zero_();
  for (const Var& v : vars_) v->grad_cell->stale = false;
}

void ParameterStore::zero_grads_deferred() {
  const bool staged =
      std::any_of(vars_.begin(), vars_.end(), [](const Var& v) { return static_cast<bool>(v->grad_cell->make_grad); });
  if (grads_sharded() || staged) return zero_grads();
  if (eager_zero_runs_.empty()) {
    for (const ParamSpec& s : specs_) {
      if (s.shape.size() == 2) continue;
      ZeroRun* last = eager_zero_runs_.empty() ? nullptr : &eager_zero_runs_.back();
      if (last && last->offset + last->n == s.offset)
        last->n += s.numel();
      else
        eager_zero_runs_.push_back({s.offset, s.numel()});
    }
  }
  zero_runs_(grads_, eager_zero_runs_);
  for (size_t i = 0; i < specs_.size(); ++i) {
    GradCell& cell = *vars_[i]->grad_cell;
    FP8T_CHECK(cell.grad.defined(), "zero_grads_deferred: {} has no view of the gradient buffer", specs_[i].name);
    cell.stale = specs_[i].shape.size() == 2;
  }
}

void ParameterStore::zero_stale_grads() {
  for (const Var& v : vars_) {
    GradCell& cell = *v->grad_cell;
    if (!cell.stale) continue;
    cell.grad.zero_();
    cell.stale = false;
  }
}

void ParameterStore::arm_accumulators(bool defer_commits) {
  if (grad_dtype() == DType::f32) return;
  FP8T_CHECK(!defer_commits || !grads_sharded(), "arm_accumulators: deferred commits need the whole gradient buffer");
  if (!accumulators_.defined()) {
    auto padded = [](int64_t n) { return (n + 3) / 4 * 4; };  // each accumulator 16-byte aligned
    int64_t n = 0;
    for (const ParamSpec& s : specs_) n += s.shape.size() == 1 ? padded(s.numel()) : 0;
    if (n == 0) return;
    FP8T_CHECK(n <= INT32_MAX, "arm_accumulators: {} accumulator elements exceed 2^31", n);
    // Workspace, not gradients: zeroed every micro-step, they hold nothing between steps (the gradients' bytes stay
    // the buffer ZeRO shards).
    accumulators_ = Tensor::empty({n}, DType::f32, device(), MemCategory::workspace);
    n = 0;
    for (size_t i = 0; i < specs_.size(); ++i) {
      if (specs_[i].shape.size() != 1) continue;
      vars_[i]->grad_cell->accumulator = accumulators_.slice_flat(n, specs_[i].shape);
      n += padded(specs_[i].numel());
    }
  }
  accumulators_.zero_();
  for (const Var& v : vars_) {
    GradCell& cell = *v->grad_cell;
    if (!cell.accumulator.defined()) continue;
    cell.accumulator_armed = true;
    cell.accumulator_deferred = defer_commits;
    cell.accumulator_pending = false;
  }
}

void ParameterStore::commit_accumulators() {
  if (!accumulators_.defined()) return;
  std::vector<AddRun> runs;
  const auto* base = static_cast<const char*>(accumulators_.raw());
  for (size_t i = 0; i < vars_.size(); ++i) {
    GradCell& cell = *vars_[i]->grad_cell;
    if (!cell.accumulator_pending) continue;
    cell.accumulator_pending = false;
    const Tensor& g = vars_[i]->grad;
    FP8T_CHECK(!grads_sharded() && g.defined() && g.raw() == grads_.slice_flat(specs_[i].offset, specs_[i].shape).raw(),
               "commit_accumulators: the gradient of {} is not its view of the store's buffer", specs_[i].name);
    const auto src = (static_cast<const char*>(cell.accumulator.raw()) - base) / static_cast<int64_t>(sizeof(float));
    runs.push_back({specs_[i].offset, static_cast<int32_t>(src), static_cast<int32_t>(specs_[i].numel())});
  }
  add_runs_(grads_, accumulators_, runs);
}

void ParameterStore::sync_compute() {
  if (!compute_.defined()) return;
  const int64_t m0 = master_begin_, m1 = master_begin_ + master_.numel();
  for (const ParamSpec& s : compute_runs_) {  // in place: no full-size temporary
    const int64_t b = std::max(s.offset, m0), e = std::min(s.offset + s.numel(), m1);
    if (b >= e) continue;
    Tensor dst = compute_.slice_flat(s.compute_offset + (b - s.offset), {e - b});
    cast_into(dst, master_.slice_flat(b - m0, {e - b}));
  }
}

void ParameterStore::set_master(const float* full) {
  const int64_t n = std::min(numel_, master_begin_ + master_.numel()) - master_begin_;
  if (n > 0) copy_bytes(master_.raw(), master_.device(), full + master_begin_, Device::cpu(), n * sizeof(float));
  sync_compute();
}

std::vector<int64_t> ParameterStore::cuts(bool codes) const {
  const int64_t shard = padded_ / shards_;
  std::vector<int64_t> out;
  for (int64_t r = 0; r <= shards_; ++r) {
    const int64_t x = r * shard;
    int64_t at = 0;  // elements of the packed buffer before flat element x
    for (size_t i = 0; i < specs_.size(); ++i) {
      const ParamSpec& s = specs_[i];
      if ((codes ? codes_offset_[i] : s.compute_offset) >= 0) at += std::clamp(x - s.offset, int64_t{0}, s.numel());
    }
    out.push_back(at);
  }
  return out;
}

}  // namespace fp8t
