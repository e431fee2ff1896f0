// Flat parameter/gradient buffers and their views.
#include "nn/params.h"

#include <algorithm>

#include "ops/ops.h"

namespace fp8t {

ParameterStore::ParameterStore(std::vector<ParamSpec> specs, Device device, DType compute_dtype,
                               int64_t pad_multiple, DType grad_dtype, const std::vector<std::string>& master_only,
                               GradShard grad_shard)
    : specs_(std::move(specs)) {
  FP8T_CHECK(pad_multiple >= 1, "pad_multiple must be >= 1");
  FP8T_CHECK(grad_dtype == DType::f32 || grad_dtype == DType::bf16, "gradients must be f32 or bf16, not {}",
             dtype_name(grad_dtype));
  const bool separate = compute_dtype != DType::f32;
  int64_t compute_numel = 0;
  for (auto& s : specs_) {
    s.offset = numel_;
    numel_ += s.numel();
    const bool master_read = std::find(master_only.begin(), master_only.end(), s.name) != master_only.end();
    s.compute_offset = separate && !master_read ? compute_numel : -1;
    if (s.compute_offset >= 0) compute_numel += s.numel();
  }
  for (const std::string& name : master_only)
    FP8T_CHECK(std::any_of(specs_.begin(), specs_.end(), [&](const ParamSpec& s) { return s.name == name; }),
               "no parameter named '{}' (asked to have no compute copy)", name);
  padded_ = (numel_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  master_ = Tensor::zeros({padded_}, DType::f32, device, MemCategory::parameters);
  FP8T_CHECK(grad_shard.count >= 1 && grad_shard.index >= 0 && grad_shard.index < grad_shard.count &&
                 padded_ % grad_shard.count == 0,
             "gradient shard {} of {} does not cut the {} padded elements evenly (pad to a multiple of the ranks)",
             grad_shard.index, grad_shard.count, padded_);
  const int64_t grads_numel = padded_ / grad_shard.count;
  grads_begin_ = grad_shard.index * grads_numel;
  grads_ = Tensor::zeros({grads_numel}, grad_dtype, device, MemCategory::gradients);
  if (separate && compute_numel > 0)
    compute_ = Tensor::zeros({compute_numel}, compute_dtype, device, MemCategory::parameters);
  for (const auto& s : specs_) {  // runs of parameters contiguous in both buffers, for sync_compute
    if (s.compute_offset < 0) continue;
    ParamSpec* last = compute_runs_.empty() ? nullptr : &compute_runs_.back();
    if (last && last->offset + last->numel() == s.offset && last->compute_offset + last->numel() == s.compute_offset)
      last->shape = {last->numel() + s.numel()};
    else
      compute_runs_.push_back({"", {s.numel()}, false, s.offset, s.compute_offset});
  }
  for (const auto& s : specs_) {
    Tensor value = s.compute_offset >= 0 ? compute_.slice_flat(s.compute_offset, s.shape)
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

void ParameterStore::zero_grads() { grads_.zero_(); }

void ParameterStore::sync_compute() {
  if (!compute_.defined()) return;
  for (const ParamSpec& s : compute_runs_) {  // in place: no full-size temporary
    Tensor dst = compute_.slice_flat(s.compute_offset, {s.numel()});
    cast_into(dst, master_.slice_flat(s.offset, {s.numel()}));
  }
}

}  // namespace fp8t
