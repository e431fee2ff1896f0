// ParameterStore: every parameter, gradient and compute copy lives in one flat buffer each;
// tensors are views. Buffers are padded to a multiple of `pad_multiple` elements so a ZeRO shard
// (an offset range) is the same size on every rank. Parameters read only by FP8 GEMMs (whose FP8
// copies are cast from the master) have no compute copy: the compute buffer holds the others,
// packed in the same order. At ZeRO stage 2 only one shard of the gradient buffer is allocated; at
// stages 1 and 2 with several ranks only one shard of the master (see ParameterStore).
#pragma once
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/add_run.h"
#include "core/tensor.h"

namespace fp8t {

struct ParamSpec {
  std::string name;   // e.g. "h.3.attn.qkv.weight"
  Shape shape;
  bool decay;         // AdamW weight decay applies (matrices and embeddings, not biases/norms)
  int64_t offset = 0; // element offset in the flat buffers
  int64_t compute_offset = -1;  // element offset in the compute buffer; -1: no compute copy
  int64_t numel() const { return shape_numel(shape); }
};

// A contiguous element range [begin, end) of the flat buffers with one decay setting, whose compute
// copy (if any) is contiguous too: elements [compute, compute + end - begin) of the compute buffer,
// or compute = -1 when the range has none (or the store has no separate compute buffer).
struct DecaySegment {
  int64_t begin, end;
  bool decay;
  int64_t compute = -1;
};

// Which part of a flat buffer a store allocates: shard `index` of `count` equal shards; count 1 is the
// whole buffer. Gradients with count > 1 (ZeRO stage 2): the parameters have no gradient views, their
// gradients come from staging buckets (GradCell::make_grad, dist/zero.h) and only the shard, which
// receives the rank-summed gradient, is kept. Master with count > 1 (ZeRO stages 1 and 2): see below.
struct FlatShard {
  int index = 0;
  int count = 1;
};

class ParameterStore {
 public:
  // Lays out `specs` (offsets assigned here) and allocates master f32 parameters and gradients in
  // grad_dtype (f32 or bf16) on `device`; if compute_dtype != f32 a compute copy in that dtype is
  // allocated too, except for the parameters named in `master_only`, whose Vars are views of the
  // master (an FP8 linear casts its FP8 weight from there). `grad_shard` says which gradients are
  // allocated; its count must divide the padded length.
  //
  // `master_shard` with count > 1 (ZeRO stages 1 and 2 on several ranks) keeps only that shard of the
  // f32 master; the parameters are then published in their compute dtype, never as f32 masters: every
  // parameter with a compute copy gets one (f32 too when compute_dtype is f32), and each `master_only`
  // parameter's Var value is its FP8 codes (`codes_dtype`, a view of codes()), cast from the master by
  // the rank owning each element. sync_compute() then writes only the copies of this rank's elements; the
  // caller all-gathers compute() and codes() with the cuts compute_cuts() / codes_cuts() (nn/gpt.h,
  // GPT::publish_weights).
  ParameterStore(std::vector<ParamSpec> specs, Device device, DType compute_dtype, int64_t pad_multiple,
                 DType grad_dtype = DType::f32, const std::vector<std::string>& master_only = {},
                 FlatShard grad_shard = {}, FlatShard master_shard = {}, DType codes_dtype = DType::e4m3);

  int64_t numel() const { return numel_; }         // real parameters
  int64_t padded_numel() const { return padded_; } // buffer length, a multiple of pad_multiple
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // f32: elements [master_begin(), master_begin() + master().numel()) of the flat buffer (all padded_numel
  // of them unless the master is sharded).
  Tensor& master() { return master_; }
  int64_t master_begin() const { return master_begin_; }
  bool master_sharded() const { return master_.numel() != padded_; }
  // Sets the master from `full` (numel() host f32 values in flat order): the elements this store keeps.
  // Then sync_compute().
  void set_master(const float* full);
  // Sharded master: the FP8 codes of the master_only parameters, packed in flat order (undefined when
  // there are none, or the master is whole).
  Tensor& codes() { return codes_; }
  // Sharded master: cuts[r] .. cuts[r + 1] is the range of compute() (of codes()) that shard r of the
  // master writes, for an all-gather with per-rank counts (count + 1 offsets).
  std::vector<int64_t> compute_cuts() const { return cuts(false); }
  std::vector<int64_t> codes_cuts() const { return cuts(true); }
  // The allocated gradients, grad_dtype: elements [grads_begin(), grads_begin() + grads().numel()) of
  // the flat buffer (all padded_numel of them unless the gradients are sharded).
  Tensor& grads() { return grads_; }
  int64_t grads_begin() const { return grads_begin_; }
  bool grads_sharded() const { return grads_.numel() != padded_; }
  DType grad_dtype() const { return grads_.dtype(); }
  // The compute copies (packed; see ParamSpec::compute_offset), or the master when there is no
  // separate compute dtype.
  Tensor& compute() { return compute_.defined() ? compute_ : master_; }
  bool has_compute_copy() const { return compute_.defined(); }
  DType compute_dtype() const { return compute_.defined() ? compute_.dtype() : master_.dtype(); }
  Device device() const { return master_.device(); }

  // The Var for parameter i: value is a view of the compute buffer, grad a view of grads() (none
  // when the gradients are sharded).
  const Var& var(size_t i) const { return vars_.at(i); }
  const Var& var(const std::string& name) const;
  // Decay segments overlapping [begin, end), clipped to it (padding counts as no-decay, without a
  // compute copy).
  std::vector<DecaySegment> segments(int64_t begin, int64_t end) const;

  void zero_grads();  // grads(): the whole buffer, or the shard
  // zero_grads without writing most of the buffer again (the trainer's step): the matrices' gradients are only marked
  // stale (GradCell::stale), so that their weight-gradient GEMMs overwrite them (beta 0) and any other first writer
  // finds them zeroed; the rest (biases, LayerNorm weights) are zeroed in one pass. Call zero_stale_grads() after the
  // step's last backward, before anything reads grads(). Where the gradients are sharded or staged (make_grad: ZeRO-2
  // on several ranks), as zero_grads().
  void zero_grads_deferred();
  // Zeroes the gradients still stale (normally none: every matrix has a writer), so that grads() holds the step's.
  // (A CUDA graph's replay clears the marks its captured run cleared: autograd's clear_stale.)
  void zero_stale_grads();
  // Where gradients are not f32: zeroes the f32 accumulators of the one-dimensional parameters (biases and
  // LayerNorm weights, whose ops sum into f32 and add that into the gradient once; ops/grad_sink.h) in one
  // pass and arms them for one micro-step (GradCell::accumulator). Allocated on the first call. Call it before
  // each micro-step's forward; without it those ops zero a temporary each. With `defer_commits` (gradients in
  // this store's buffer, not staged) the ops' adds into the gradients wait for commit_accumulators().
  void arm_accumulators(bool defer_commits = false);
  // The deferred adds of this micro-step, in one pass (add_runs_); call it after the backward.
  void commit_accumulators();
  // Refresh the compute copy from the master weights (after init, load or an optimizer step); with a
  // sharded master only the copies of this rank's elements (the codes are the caller's).
  void sync_compute();

 private:
  std::vector<int64_t> cuts(bool codes) const;

  std::vector<ParamSpec> specs_;
  int64_t numel_ = 0, padded_ = 0, grads_begin_ = 0, master_begin_ = 0, shards_ = 1;
  std::vector<ParamSpec> compute_runs_;  // maximal runs contiguous in the master and compute buffers
  std::vector<int64_t> codes_offset_;    // sharded master: each parameter's offset in codes_, or -1
  Tensor master_, grads_, compute_, codes_;
  Tensor accumulators_;  // arm_accumulators: f32, the one-dimensional parameters' packed
  std::vector<ZeroRun> eager_zero_runs_;  // zero_grads_deferred: the runs of grads_ it zeroes (built on first use)
  std::vector<Var> vars_;
};

}  // namespace fp8t
