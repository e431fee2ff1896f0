// AdamW: one fused pass reading params, grads, m, v and writing params, m, v (+ bf16 copy). A warp owns
// one kMomentBlock block at a time, so the fp8 first moment's new block amax is a warp reduction and the
// re-quantized codes are written in the same pass.
#include <type_traits>

#include "kernels/adamw.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/fp8_codec.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kPerLane = kMomentBlock / kWarp;  // lane l holds elements l, l + 32, l + 64, l + 96 of a block
static_assert(kMomentBlock % kWarp == 0);

// ------------------------------------------------------------------------------------------------
// CUDA kernels

template <class G>
__device__ __forceinline__ float grad_at(const G* g, int64_t i) {
  if constexpr (std::is_same_v<G, float>)
    return g[i];
  else
    return __bfloat162float(g[i]);
}

// The first segment whose end lies past i (segments sorted, covering [0, n)).
__device__ __forceinline__ int segment_of(const AdamWSegment* segs, int count, int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (segs[mid].end > i)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

template <class G, StateDtype S>
__global__ void adamw_kernel(AdamWBuffers b, AdamWHyper h) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / kWarp);
  const int64_t blocks = (b.n + kMomentBlock - 1) / kMomentBlock;
  const G* grads = static_cast<const G*>(b.grads);
  for (int64_t blk = int64_t{blockIdx.x} * (blockDim.x / kWarp) + threadIdx.x / kWarp; blk < blocks; blk += warps) {
    const int64_t first = blk * kMomentBlock;
    const float scale = S == StateDtype::fp8 ? b.m_scale[blk] : 0.0f;  // read by every lane before lane 0 writes
    int s = segment_of(b.segments, b.num_segments, first);
    float rm[kPerLane], rv[kPerLane];  // updated moments, in f32
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = first + j * kWarp + lane;
      rm[j] = rv[j] = 0.0f;
      if (i >= b.n) continue;
      while (b.segments[s].end <= i) ++s;
      const AdamWSegment& seg = b.segments[s];
      float m, v;
      if constexpr (S == StateDtype::fp32) {
        m = static_cast<const float*>(b.m)[i];
        v = static_cast<const float*>(b.v)[i];
      } else {
        m = S == StateDtype::bf16 ? bf16_value(static_cast<const uint16_t*>(b.m)[i])
                                  : f32_mul(from_fp8<Fp8Format::e4m3>(static_cast<const uint8_t*>(b.m)[i]), scale);
        v = bf16_value(static_cast<const uint16_t*>(b.v)[i]);
      }
      const AdamWElement e = adamw_element(b.params[i], grad_at(grads, i), m, v, seg.weight_decay, h);
      b.params[i] = e.param;
      if (b.params_bf16 && seg.compute >= 0)
        reinterpret_cast<bf16*>(b.params_bf16)[seg.compute + (i - seg.begin)] = __float2bfloat16_rn(e.param);
      rm[j] = e.m;
      rv[j] = e.v;
      amax = fmaxf(amax, fabsf(e.m));
    }
    float new_scale = 0.0f;
    if constexpr (S == StateDtype::fp8) {
      new_scale = moment_block_scale(warp_max(amax));  // the whole warp is here: blk is warp-uniform
      if (lane == 0) b.m_scale[blk] = new_scale;
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = first + j * kWarp + lane;
      if (i >= b.n) continue;
      if constexpr (S == StateDtype::fp32) {
        static_cast<float*>(b.m)[i] = rm[j];
        static_cast<float*>(b.v)[i] = rv[j];
      } else {
        const uint32_t bits = rounding_bits(h.rounding_key, b.index_base + i);
        if constexpr (S == StateDtype::bf16)
          static_cast<uint16_t*>(b.m)[i] = bf16_round_stochastic(rm[j], bits);
        else
          static_cast<uint8_t*>(b.m)[i] = to_fp8<Fp8Format::e4m3>(moment_scaled(rm[j], new_scale));
        static_cast<uint16_t*>(b.v)[i] = bf16_round_stochastic(rv[j], bits >> 16);
      }
    }
  }
}

template <class G>
void launch(const AdamWBuffers& b, const AdamWHyper& h, int grid, int threads, cudaStream_t stream) {
  switch (b.state_dtype) {
    case StateDtype::fp32: adamw_kernel<G, StateDtype::fp32><<<grid, threads, 0, stream>>>(b, h); break;
    case StateDtype::bf16: adamw_kernel<G, StateDtype::bf16><<<grid, threads, 0, stream>>>(b, h); break;
    case StateDtype::fp8: adamw_kernel<G, StateDtype::fp8><<<grid, threads, 0, stream>>>(b, h); break;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void adamw_update(const AdamWBuffers& b, const AdamWHyper& h, cudaStream_t stream) {
  FP8T_CHECK(b.grad_dtype == DType::f32 || b.grad_dtype == DType::bf16,
             "adamw_update: gradients must be f32 or bf16, not {}", dtype_name(b.grad_dtype));
  FP8T_CHECK(b.n >= 0 && h.bias_corr1 > 0.0f && h.bias_corr2 > 0.0f,
             "adamw_update: n {} and bias corrections ({}, {}) must be >= 0 and > 0 (step counts from 1)", b.n,
             h.bias_corr1, h.bias_corr2);
  if (b.n == 0) return;
  FP8T_CHECK(b.segments && b.num_segments > 0, "adamw_update: {} elements need segments", b.n);
  FP8T_CHECK(b.state_dtype != StateDtype::fp8 || b.m_scale, "adamw_update: fp8 moments need block scales");
  constexpr int kThreads = 256;
  const int64_t warps_needed = (b.n + kMomentBlock - 1) / kMomentBlock;
  const int grid = static_cast<int>(std::min<int64_t>((warps_needed + kThreads / kWarp - 1) / (kThreads / kWarp),
                                                      132 * 16));
  if (b.grad_dtype == DType::f32)
    launch<float>(b, h, grid, kThreads, stream);
  else
    launch<bf16>(b, h, grid, kThreads, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
