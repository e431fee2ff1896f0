// AdamW on FP32 master weights over a range of the flat buffers (the whole buffer, or this rank's
// ZeRO shard). Moments live in one flat buffer each (category optimizer), sized to the range.
#pragma once
#include "config/config.h"
#include "nn/params.h"

namespace fp8t {

class AdamW {
 public:
  // Owns moments for elements [begin, end) of the store's flat buffers.
  AdamW(const OptimConfig& cfg, ParameterStore& store, int64_t begin, int64_t end);

  // One update of master[begin, end) from grads[begin, end) * grad_scale (grad_scale folds in
  // clipping and averaging). `step` is 1-based (bias correction). Returns true when it also wrote the
  // bf16 compute copy (CUDA, and this optimizer owns the whole buffer), so that no
  // ParameterStore::sync_compute() is needed.
  bool step(int step, double lr, double grad_scale);

  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  OptimConfig cfg_;
  ParameterStore& store_;
  int64_t begin_, end_;
  std::vector<DecaySegment> segments_;
  Tensor m_, v_;
};

// Sum of squares of t[begin, end) (f32 buffer, any device), in double.
double sum_squares(const Tensor& t, int64_t begin, int64_t end);

// The CPU AdamW update of n elements (shared by the CPU path and the CUDA kernel's test).
void adamw_update_cpu(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, float grad_scale, int step);

}  // namespace fp8t
