// ParameterStore: every parameter, gradient and compute copy lives in one flat buffer each;
// tensors are views. Buffers are padded to a multiple of `pad_multiple` elements so a ZeRO shard
// (an offset range) is the same size on every rank.
#pragma once
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace fp8t {

struct ParamSpec {
  std::string name;   // e.g. "h.3.attn.qkv.weight"
  Shape shape;
  bool decay;         // AdamW weight decay applies (matrices and embeddings, not biases/norms)
  int64_t offset = 0; // element offset in the flat buffers
  int64_t numel() const { return shape_numel(shape); }
};

// A contiguous element range [begin, end) of the flat buffers with one decay setting.
struct DecaySegment {
  int64_t begin, end;
  bool decay;
};

class ParameterStore {
 public:
  // Lays out `specs` (offsets assigned here) and allocates master f32 parameters and f32 gradients
  // on `device`; if compute_dtype != f32 a compute copy in that dtype is allocated too.
  ParameterStore(std::vector<ParamSpec> specs, Device device, DType compute_dtype, int64_t pad_multiple);

  int64_t numel() const { return numel_; }         // real parameters
  int64_t padded_numel() const { return padded_; } // buffer length, a multiple of pad_multiple
  const std::vector<ParamSpec>& specs() const { return specs_; }
  Tensor& master() { return master_; }             // f32 (padded_numel)
  Tensor& grads() { return grads_; }               // f32 (padded_numel)
  Tensor& compute() { return compute_.defined() ? compute_ : master_; }
  DType compute_dtype() const { return compute_.defined() ? compute_.dtype() : master_.dtype(); }
  Device device() const { return master_.device(); }

  // The Var for parameter i: value is a view of the compute buffer, grad a view of grads().
  const Var& var(size_t i) const { return vars_.at(i); }
  const Var& var(const std::string& name) const;
  // Decay segments overlapping [begin, end), clipped to it (padding counts as no-decay).
  std::vector<DecaySegment> segments(int64_t begin, int64_t end) const;

  void zero_grads();
  // Refresh the compute copy from the master weights (after init, load or an optimizer step).
  void sync_compute();

 private:
  std::vector<ParamSpec> specs_;
  int64_t numel_ = 0, padded_ = 0;
  Tensor master_, grads_, compute_;
  std::vector<Var> vars_;
};

}  // namespace fp8t
