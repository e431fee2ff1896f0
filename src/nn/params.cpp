// Flat parameter/gradient buffers and their views.
#include "nn/params.h"

#include "ops/ops.h"

namespace fp8t {

ParameterStore::ParameterStore(std::vector<ParamSpec> specs, Device device, DType compute_dtype,
                               int64_t pad_multiple)
    : specs_(std::move(specs)) {
  FP8T_CHECK(pad_multiple >= 1, "pad_multiple must be >= 1");
  for (auto& s : specs_) {
    s.offset = numel_;
    numel_ += s.numel();
  }
  padded_ = (numel_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  master_ = Tensor::zeros({padded_}, DType::f32, device, MemCategory::parameters);
  grads_ = Tensor::zeros({padded_}, DType::f32, device, MemCategory::gradients);
  if (compute_dtype != DType::f32)
    compute_ = Tensor::zeros({padded_}, compute_dtype, device, MemCategory::parameters);
  for (const auto& s : specs_) {
    Var v = make_var(compute().slice_flat(s.offset, s.shape), true, s.name);
    v->grad = grads_.slice_flat(s.offset, s.shape);
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
  auto push = [&](int64_t b, int64_t e, bool decay) {
    b = std::max(b, begin);
    e = std::min(e, end);
    if (b >= e) return;
    if (!out.empty() && out.back().end == b && out.back().decay == decay)
      out.back().end = e;
    else
      out.push_back({b, e, decay});
  };
  for (const auto& s : specs_) push(s.offset, s.offset + s.numel(), s.decay);
  push(numel_, padded_, false);
  return out;
}

void ParameterStore::zero_grads() { grads_.zero_(); }

void ParameterStore::sync_compute() {
  if (!compute_.defined()) return;
  cast_into(compute_, master_);  // in place: no full-size temporary
}

}  // namespace fp8t
