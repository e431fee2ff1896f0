// The non-finite weights of a model and the checked re-run of a failed step.
#include "train/nonfinite.h"

#include <algorithm>
#include <cctype>
#include <fmt/ranges.h>

#include "autograd/finite_watch.h"
#include "autograd/tape.h"
#include "ops/ops.h"

namespace fp8t {

namespace {

double element(const Tensor& t, int64_t i) {
  Tensor one = t.slice_flat(i, {1});
  if (!one.device().is_cpu()) one = one.to(Device::cpu(), MemCategory::workspace);
  return cast(one, DType::f64, MemCategory::workspace).data<double>()[0];
}

// "h.2.attn.c_proj" -> ", in block 2"; "" for places outside the blocks.
std::string block_of(const std::string& layer) {
  if (!layer.starts_with("h.")) return "";
  size_t end = 2;
  while (end < layer.size() && std::isdigit(static_cast<unsigned char>(layer[end]))) ++end;
  if (end == 2 || (end < layer.size() && layer[end] != '.')) return "";
  return ", in block " + layer.substr(2, end - 2);
}

// While alive, every parameter's gradient comes from a fresh zeroed buffer (reset by next_micro()), so
// the re-run neither reads nor writes the step's gradients or ZeRO-2's staging buckets.
class ScratchParamGrads {
 public:
  explicit ScratchParamGrads(ParameterStore& P) : P_(P) {
    for (size_t i = 0; i < P.specs().size(); ++i) {
      GradCell& cell = *P.var(i)->grad_cell;
      saved_.push_back({cell.grad, std::move(cell.make_grad), cell.stale});
      cell.grad = Tensor();
      cell.stale = false;
      cell.make_grad = [shape = P.specs()[i].shape, dtype = P.grad_dtype(), device = P.device()] {
        return Tensor::zeros(shape, dtype, device, MemCategory::gradients);
      };
    }
  }
  ~ScratchParamGrads() {
    for (size_t i = 0; i < saved_.size(); ++i) {
      GradCell& cell = *P_.var(i)->grad_cell;
      cell.grad = std::move(saved_[i].grad);
      cell.make_grad = std::move(saved_[i].make_grad);
      cell.stale = saved_[i].stale;
    }
  }
  ScratchParamGrads(const ScratchParamGrads&) = delete;
  ScratchParamGrads& operator=(const ScratchParamGrads&) = delete;

  void next_micro() {
    for (size_t i = 0; i < saved_.size(); ++i) P_.var(i)->grad_cell->grad = Tensor();
  }

 private:
  struct Saved {
    Tensor grad;
    std::function<Tensor()> make_grad;
    bool stale;
  };
  ParameterStore& P_;
  std::vector<Saved> saved_;
};

}  // namespace

std::string nonfinite_weights(ParameterStore& P, size_t max_names) {
  // One reduction per buffer when all is well; the per-parameter search only when something is not.
  if (!first_nonfinite(P.master()) && !(P.has_compute_copy() && first_nonfinite(P.compute()))) return "";
  std::vector<std::string> bad;
  size_t count = 0;
  const int64_t m0 = P.master_begin(), m1 = m0 + P.master().numel();  // the master this rank keeps
  for (size_t i = 0; i < P.specs().size(); ++i) {
    const ParamSpec& s = P.specs()[i];
    const int64_t b = std::clamp(s.offset, m0, m1), e = std::clamp(s.offset + s.numel(), m0, m1);
    // The parameter's elements [b - offset, e - offset) in this rank's master, as a flat piece.
    const Tensor master = P.master().slice_flat(b - m0, {e - b});
    // What the ops read: the compute copy, or a view of the master (FP8 codes of a sharded master saturate
    // and are not checked).
    const Tensor& value = P.var(i)->value;
    std::optional<int64_t> at = first_nonfinite(master);
    const bool in_master = at.has_value();
    if (in_master) *at += b - s.offset;
    else if (!is_fp8_dtype(value.dtype())) at = first_nonfinite(value);
    if (!at) continue;
    if (++count > max_names) continue;
    const Tensor& where = in_master ? master : value;
    const int64_t where_at = in_master ? *at - (b - s.offset) : *at;
    std::string index = std::to_string(*at);
    if (s.shape.size() > 1) index += fmt::format(" [{}, {}]", *at / s.shape[1], *at % s.shape[1]);
    bad.push_back(fmt::format("{} element {} is {}{}", s.name, index, element(where, where_at),
                              in_master ? "" : fmt::format(" (in its {} copy only)", dtype_name(value.dtype()))));
  }
  std::string text = fmt::format("{}", fmt::join(bad, ", "));
  if (count > max_names) text += fmt::format(" and {} more parameters", count - max_names);
  return text;
}

std::string locate_first_nonfinite(GPT& model, int micro_batches, const MicroBatchFn& batch, bool recompute,
                                   float grad_scale) {
  ScratchParamGrads scratch(model.params());
  for (int micro = 0; micro < micro_batches; ++micro) {
    scratch.next_micro();
    const auto [inputs, targets] = batch(micro);
    FiniteWatch watch;
    FiniteWatchScope watching(&watch);
    Tape tape;
    try {
      Var loss;
      {
        TapeScope scope(&tape);
        loss = model.loss(inputs, targets, recompute, grad_scale);
      }
      watch.begin_backward();
      tape.backward(loss, grad_scale);
    } catch (const NonfiniteFound& found) {
      const NonfiniteSite& s = found.site();
      const std::string micro_text =
          micro_batches > 1 ? fmt::format(" of micro-batch {} of {}", micro + 1, micro_batches) : "";
      return fmt::format("in the {} pass{}{}: {}", s.backward ? "backward" : "forward", micro_text, block_of(s.layer),
                         found.what());
    }
  }
  return "";
}

}  // namespace fp8t
