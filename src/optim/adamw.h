// AdamW on FP32 master weights over a range of the flat buffers (the whole buffer, or this rank's
// ZeRO shard). Moments live in one flat buffer each (category optimizer), sized to the range and stored
// as optim.state_dtype says; the update reads f32 or bf16 gradients and runs in f32.
#pragma once
#include <span>
#include <vector>

#include "config/config.h"
#include "core/tensor_ops.h"
#include "nn/params.h"
#include "ops/cpu/adamw.h"
#include "core/adamw_math.h"

namespace fp8t {

class AdamW {
 public:
  // Owns moments for elements [begin, end) of the store's flat buffers, whose gradients the store must
  // hold (ParameterStore::grads_begin()).
  AdamW(const OptimConfig& cfg, ParameterStore& store, int64_t begin, int64_t end);

  // One update of master[begin, end) from the gradients of [begin, end) * grad_scale (grad_scale folds in
  // clipping and averaging). `step` is 1-based (bias correction). Returns true when it also wrote the
  // bf16 compute copy (CUDA, and this optimizer owns the whole buffer), so that no
  // ParameterStore::sync_compute() is needed.
  bool step(int step, double lr, double grad_scale);

  StateDtype state_dtype() const { return cfg_.state_dtype; }
  Tensor& m() { return m_; }              // (end - begin): f32 | bf16 | e4m3 codes
  Tensor& v() { return v_; }              // (end - begin): f32 | bf16 | bf16
  Tensor& m_scale() { return m_scale_; }  // fp8: (ceil((end - begin) / kMomentBlock)) f32; else undefined
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

  // The moments as host f32 values, decoded exactly.
  std::vector<float> m_values() const;
  std::vector<float> v_values() const;
  // Sets the moments from f32 values (end - begin each), encoded in the state dtype: bf16 rounded to
  // nearest even, fp8 in blocks as quantize_moment_blocks does. For checkpoint conversion and tests.
  void set_moments(std::span<const float> m, std::span<const float> v);

 private:
  OptimConfig cfg_;
  ParameterStore& store_;
  int64_t begin_, end_;
  std::vector<AdamWSegment> segments_;  // local indices
  Tensor segments_device_;              // CUDA: segments_ in device memory (i32 words)
  Tensor m_, v_, m_scale_;
};

}  // namespace fp8t
