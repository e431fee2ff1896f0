// AdamW over a range of the flat buffers and the gradient sum of squares: the CPU path calls
// ops/cpu/adamw, the CUDA path kernels/adamw and kernels/global_norm.
#include "optim/adamw.h"

#include <cstring>

#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_optim.h"
#endif

namespace fp8t {

AdamW::AdamW(const OptimConfig& cfg, ParameterStore& store, int64_t begin, int64_t end)
    : cfg_(cfg), store_(store), begin_(begin), end_(end) {
  FP8T_CHECK(0 <= begin && begin <= end && end <= store.padded_numel(), "AdamW range [{}, {}) outside {}", begin,
             end, store.padded_numel());
  const int64_t g0 = store.grads_begin(), g1 = g0 + store.grads().numel();
  FP8T_CHECK(g0 <= begin && end <= g1, "AdamW range [{}, {}) outside the allocated gradients [{}, {})", begin, end,
             g0, g1);
  const int64_t m0 = store.master_begin(), m1 = m0 + store.master().numel();
  FP8T_CHECK(m0 <= begin && end <= m1, "AdamW range [{}, {}) outside the master this store keeps [{}, {})", begin,
             end, m0, m1);
  for (const DecaySegment& s : store.segments(begin, end))
    segments_.push_back(
        {s.begin - begin, s.end - begin, s.compute, s.decay ? static_cast<float>(cfg.weight_decay) : 0.0f});
  const int64_t n = end - begin;
  const Device dev = store.device();
  const DType m_dtype = cfg.state_dtype == StateDtype::fp32 ? DType::f32
                        : cfg.state_dtype == StateDtype::bf16 ? DType::bf16
                                                              : DType::e4m3;
  m_ = Tensor::zeros({n}, m_dtype, dev, MemCategory::optimizer);
  v_ = Tensor::zeros({n}, cfg.state_dtype == StateDtype::fp32 ? DType::f32 : DType::bf16, dev, MemCategory::optimizer);
  if (cfg.state_dtype == StateDtype::fp8)
    m_scale_ = Tensor::zeros({moment_blocks(n)}, DType::f32, dev, MemCategory::optimizer);
  if (dev.is_cuda() && !segments_.empty()) {
    static_assert(sizeof(AdamWSegment) % 4 == 0);
    const size_t bytes = segments_.size() * sizeof(AdamWSegment);
    segments_device_ = Tensor::empty({static_cast<int64_t>(bytes / 4)}, DType::i32, dev, MemCategory::optimizer);
    copy_bytes(segments_device_.raw(), dev, segments_.data(), Device::cpu(), bytes);
  }
}

bool AdamW::step(int step, double lr, double grad_scale) {
  const AdamWHyper h = adamw_hyper(cfg_, lr, grad_scale, step);
  Tensor& grads = store_.grads();
  // CUDA, bf16 compute copy, whole buffer here: the update kernel writes the compute copy as well.
  const bool write_compute = store_.device().is_cuda() && store_.compute_dtype() == DType::bf16 && begin_ == 0 &&
                             end_ == store_.padded_numel();
  AdamWBuffers b;
  b.params = store_.master().data<float>() + (begin_ - store_.master_begin());
  b.grads = static_cast<const char*>(grads.raw()) +
            (begin_ - store_.grads_begin()) * static_cast<int64_t>(dtype_size(grads.dtype()));
  b.grad_dtype = grads.dtype();
  b.state_dtype = cfg_.state_dtype;
  b.m = m_.raw();
  b.v = v_.raw();
  b.m_scale = m_scale_.defined() ? m_scale_.data<float>() : nullptr;
  b.params_bf16 = write_compute ? store_.compute().data<uint16_t>() : nullptr;
  b.num_segments = static_cast<int>(segments_.size());
  b.n = end_ - begin_;
  b.index_base = begin_;
#ifdef FP8T_HAVE_CUDA
  if (store_.device().is_cuda()) {
    b.segments = segments_device_.defined() ? static_cast<const AdamWSegment*>(segments_device_.raw()) : nullptr;
    cuda_ops::adamw(b, h);
    return write_compute;
  }
#endif
  b.segments = segments_.data();
  adamw_update_cpu(b, h);
  return write_compute;
}

std::vector<float> AdamW::m_values() const {
  const Tensor host = m_.device().is_cpu() ? m_ : m_.to(Device::cpu(), MemCategory::workspace);
  if (cfg_.state_dtype != StateDtype::fp8) return host.to_float_vector();
  const Tensor scales = m_scale_.device().is_cpu() ? m_scale_ : m_scale_.to(Device::cpu(), MemCategory::workspace);
  std::vector<float> out(static_cast<size_t>(host.numel()));
  dequantize_moment_blocks(host.data<uint8_t>(), scales.data<float>(), host.numel(), out.data());
  return out;
}

std::vector<float> AdamW::v_values() const { return v_.to_float_vector(); }

void AdamW::set_moments(std::span<const float> m, std::span<const float> v) {
  const auto n = static_cast<size_t>(end_ - begin_);
  FP8T_CHECK(m.size() == n && v.size() == n, "AdamW::set_moments: {} and {} values for a range of {}", m.size(),
             v.size(), n);
  Tensor hm = Tensor::empty(m_.shape(), m_.dtype(), Device::cpu(), MemCategory::workspace);
  Tensor hv = Tensor::empty(v_.shape(), v_.dtype(), Device::cpu(), MemCategory::workspace);
  if (cfg_.state_dtype == StateDtype::fp32) {
    std::memcpy(hm.raw(), m.data(), n * sizeof(float));
    std::memcpy(hv.raw(), v.data(), n * sizeof(float));
  } else {
    for (size_t i = 0; i < n; ++i) hv.data<uint16_t>()[i] = float_to_bf16(v[i]);
    if (cfg_.state_dtype == StateDtype::bf16) {
      for (size_t i = 0; i < n; ++i) hm.data<uint16_t>()[i] = float_to_bf16(m[i]);
    } else {
      Tensor hs = Tensor::empty(m_scale_.shape(), DType::f32, Device::cpu(), MemCategory::workspace);
      quantize_moment_blocks(m.data(), static_cast<int64_t>(n), hm.data<uint8_t>(), hs.data<float>());
      m_scale_.copy_from(hs);
    }
  }
  m_.copy_from(hm);
  v_.copy_from(hv);
}

}  // namespace fp8t
