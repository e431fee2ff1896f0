// The CPU AdamW update and the fp8 first-moment block encoding: the reference kernels/adamw matches.
#include "ops/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/check.h"

namespace fp8t {

AdamWHyper adamw_hyper(const OptimConfig& cfg, double lr, double grad_scale, int step) {
  FP8T_CHECK(step >= 1, "AdamW: step must count from 1, got {}", step);
  const auto beta1 = static_cast<float>(cfg.beta1), beta2 = static_cast<float>(cfg.beta2);
  FP8T_CHECK(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f,
             "optim.betas ({}, {}) must lie in [0, 1)", cfg.beta1, cfg.beta2);
  AdamWHyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.one_minus_beta1 = 1.0f - beta1;
  h.one_minus_beta2 = 1.0f - beta2;
  h.eps = static_cast<float>(cfg.eps);
  h.grad_scale = static_cast<float>(grad_scale);
  h.bias_corr1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), step));
  h.bias_corr2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), step));
  h.inv_bias_corr1 = 1.0f / h.bias_corr1;
  h.inv_bias_corr2 = 1.0f / h.bias_corr2;
  h.rounding_key = mix32(static_cast<uint32_t>(step) * 0x9E3779B9u);
  return h;
}

namespace {

template <class G>
float grad_at(const void* g, int64_t i) {
  if constexpr (std::is_same_v<G, float>)
    return static_cast<const float*>(g)[i];
  else
    return bf16_to_float(static_cast<const uint16_t*>(g)[i]);
}

// The segment holding local element i (segments sorted, covering [0, n)).
int segment_of(const AdamWBuffers& b, int64_t i) {
  const AdamWSegment* s = std::upper_bound(b.segments, b.segments + b.num_segments, i,
                                           [](int64_t x, const AdamWSegment& seg) { return x < seg.end; });
  return static_cast<int>(s - b.segments);
}

// Block `block` of kMomentBlock elements, as one of the kernel's warps does it.
template <class G, StateDtype S>
void update_block(const AdamWBuffers& b, const AdamWHyper& h, int64_t block) {
  const int64_t first = block * kMomentBlock, last = std::min(first + kMomentBlock, b.n);
  float m_new[kMomentBlock], v_new[kMomentBlock];
  const float scale = S == StateDtype::fp8 ? b.m_scale[block] : 0.0f;
  float amax = 0.0f;
  for (int64_t i = first, s = segment_of(b, first); i < last; ++i) {
    while (b.segments[s].end <= i) ++s;
    const AdamWSegment& seg = b.segments[s];
    float m, v;
    if constexpr (S == StateDtype::fp32) {
      m = static_cast<const float*>(b.m)[i];
      v = static_cast<const float*>(b.v)[i];
    } else {
      m = S == StateDtype::bf16 ? bf16_value(static_cast<const uint16_t*>(b.m)[i])
                                : f32_mul(fp8_to_float(static_cast<const uint8_t*>(b.m)[i], Fp8Format::e4m3), scale);
      v = bf16_value(static_cast<const uint16_t*>(b.v)[i]);
    }
    const AdamWElement e = adamw_element(b.params[i], grad_at<G>(b.grads, i), m, v, seg.weight_decay, h);
    b.params[i] = e.param;
    if (b.params_bf16 && seg.compute >= 0) b.params_bf16[seg.compute + (i - seg.begin)] = float_to_bf16(e.param);
    m_new[i - first] = e.m;
    v_new[i - first] = e.v;
    amax = std::fmax(amax, std::fabs(e.m));
  }
  const float new_scale = moment_block_scale(amax), new_inv = moment_inv_scale(new_scale);
  if (S == StateDtype::fp8) b.m_scale[block] = new_scale;
  for (int64_t i = first; i < last; ++i) {
    const float m = m_new[i - first], v = v_new[i - first];
    if constexpr (S == StateDtype::fp32) {
      static_cast<float*>(b.m)[i] = m;
      static_cast<float*>(b.v)[i] = v;
      continue;
    }
    const uint32_t bits = rounding_bits(h.rounding_key, b.index_base + i);
    if constexpr (S == StateDtype::bf16)
      static_cast<uint16_t*>(b.m)[i] = bf16_round_stochastic(m, bits);
    else
      static_cast<uint8_t*>(b.m)[i] = float_to_fp8(moment_scaled(m, new_inv), Fp8Format::e4m3);
    static_cast<uint16_t*>(b.v)[i] = bf16_round_stochastic(v, bits >> 16);
  }
}

template <class G, StateDtype S>
void update_blocks(const AdamWBuffers& b, const AdamWHyper& h) {
  const int64_t blocks = moment_blocks(b.n);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < blocks; ++k) update_block<G, S>(b, h, k);
}

template <class G>
void update_blocks_of(const AdamWBuffers& b, const AdamWHyper& h) {
  switch (b.state_dtype) {
    case StateDtype::fp32: return update_blocks<G, StateDtype::fp32>(b, h);
    case StateDtype::bf16: return update_blocks<G, StateDtype::bf16>(b, h);
    case StateDtype::fp8: return update_blocks<G, StateDtype::fp8>(b, h);
  }
}

}  // namespace

void adamw_update_cpu(const AdamWBuffers& b, const AdamWHyper& h) {
  FP8T_CHECK(b.grad_dtype == DType::f32 || b.grad_dtype == DType::bf16, "AdamW reads f32 or bf16 gradients, not {}",
             dtype_name(b.grad_dtype));
  if (b.n == 0) return;
  FP8T_CHECK(b.num_segments > 0 && b.segments[0].begin == 0 && b.segments[b.num_segments - 1].end == b.n,
             "AdamW: the segments must cover [0, {})", b.n);
  if (b.grad_dtype == DType::f32)
    update_blocks_of<float>(b, h);
  else
    update_blocks_of<uint16_t>(b, h);
}

void quantize_moment_blocks(const float* m, int64_t n, uint8_t* codes, float* scales) {
  for (int64_t k = 0; k < moment_blocks(n); ++k) {
    const int64_t first = k * kMomentBlock, last = std::min(first + kMomentBlock, n);
    float amax = 0.0f;
    for (int64_t i = first; i < last; ++i) amax = std::fmax(amax, std::fabs(m[i]));
    scales[k] = moment_block_scale(amax);
    const float inv = moment_inv_scale(scales[k]);
    for (int64_t i = first; i < last; ++i) codes[i] = float_to_fp8(moment_scaled(m[i], inv), Fp8Format::e4m3);
  }
}

void dequantize_moment_blocks(const uint8_t* codes, const float* scales, int64_t n, float* m) {
  for (int64_t i = 0; i < n; ++i) m[i] = f32_mul(fp8_to_float(codes[i], Fp8Format::e4m3), scales[i / kMomentBlock]);
}

}  // namespace fp8t
