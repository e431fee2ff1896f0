// AdamW update and gradient norm (CPU; the CUDA path calls kernels/adamw and kernels/global_norm).
#include "optim/adamw.h"

#include <cmath>

#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_optim.h"
#endif

namespace fp8t {

void adamw_update_cpu(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, float grad_scale, int step) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

AdamW::AdamW(const OptimConfig& cfg, ParameterStore& store, int64_t begin, int64_t end)
    : cfg_(cfg), store_(store), begin_(begin), end_(end), segments_(store.segments(begin, end)) {
  FP8T_CHECK(0 <= begin && begin <= end && end <= store.padded_numel(), "AdamW range [{}, {}) outside {}", begin,
             end, store.padded_numel());
  m_ = Tensor::zeros({end - begin}, DType::f32, store.device(), MemCategory::optimizer);
  v_ = Tensor::zeros({end - begin}, DType::f32, store.device(), MemCategory::optimizer);
}

bool AdamW::step(int step, double lr, double grad_scale) {
  float* p = store_.master().data<float>();
  const float* g = store_.grads().data<float>();
  // CUDA, bf16 compute copy, whole buffer here: the update kernel writes the compute copy as well.
  const bool write_compute = store_.device().is_cuda() && store_.compute_dtype() == DType::bf16 && begin_ == 0 &&
                             end_ == store_.padded_numel();
  for (const DecaySegment& s : segments_) {
    const int64_t n = s.end - s.begin, local = s.begin - begin_;
    const float wd = s.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
#ifdef FP8T_HAVE_CUDA
    if (store_.device().is_cuda()) {
      void* compute = write_compute ? store_.compute().data<uint16_t>() + s.begin : nullptr;
      cuda_ops::adamw(p + s.begin, g + s.begin, m_.data<float>() + local, v_.data<float>() + local, n,
                      static_cast<float>(lr), static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                      static_cast<float>(cfg_.eps), wd, static_cast<float>(grad_scale), step, compute);
      continue;
    }
#endif
    adamw_update_cpu(p + s.begin, g + s.begin, m_.data<float>() + local, v_.data<float>() + local, n,
                     static_cast<float>(lr), static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                     static_cast<float>(cfg_.eps), wd, static_cast<float>(grad_scale), step);
  }
  return write_compute;
}

double sum_squares(const Tensor& t, int64_t begin, int64_t end) {
  FP8T_CHECK(t.dtype() == DType::f32, "sum_squares needs f32, got {}", t.str());
#ifdef FP8T_HAVE_CUDA
  if (t.device().is_cuda()) return cuda_ops::sum_squares(t.data<float>() + begin, end - begin);
#endif
  const float* x = t.data<float>();
  double acc = 0.0;
#pragma omp parallel for reduction(+ : acc) schedule(static)
  for (int64_t i = begin; i < end; ++i) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

}  // namespace fp8t
