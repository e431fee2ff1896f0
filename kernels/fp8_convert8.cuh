// The eight-value FP8 encode with the cast statistics (max |x| and the saturation count), shared by the FP8 casts
// (kernels/fp8_cast_common.cuh) and the kernels that write a cast's codes themselves (the attention backward's
// qkv gradient, kernels/attention_dy_codes.cuh): each code bit for bit the cast's.
#pragma once
#include <cstdint>

#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_codec.cuh"

namespace fp8t::kernels {
namespace {

// Two values rounded to bf16 (nearest even) and widened back: lane for lane __float2bfloat16_rn, in one
// cvt.rn.bf16x2.f32 instead of two conversions (which issue at an eighth of the FP32 rate: the GELU casts' bound).
__device__ __forceinline__ float2 bf16_round2(float a, float b) {
  return __bfloat1622float2(__floats2bfloat162_rn(a, b));
}

// Per-thread running statistics: |x| as float bits (unsigned order = float order for |x|, and every
// NaN compares above +inf, so NaN sticks), and the saturation count.
struct ThreadStats {
  unsigned amax_bits = 0;
  unsigned saturated = 0;
  __device__ __forceinline__ void add(float x, float v, float fmax) {
    amax_bits = max(amax_bits, __float_as_uint(fabsf(x)));
    saturated += fabsf(v) > fmax ? 1u : 0u;
  }
};

// Eight values -> eight codes (x[j] in byte j % 4 of word j / 4), each bit-exactly to_fp8<F>(x[j] *
// scale), with their statistics. A zero adds nothing to the statistics (also when scale is inf or NaN:
// a NaN product is not counted as saturated), so tiles pad with zeros. The statistics take the exact per-element
// path (ThreadStats::add, and the NaN codes fixed) only for a group with a code at the top of the range (any_top_code):
// every saturated product and every NaN product (a NaN x, or 0 * inf) has one. Otherwise nothing saturated and every
// x is a number, so the group adds only its largest |x|, whose bits are the largest of the |x|'s bits.
template <Fp8Format F>
__device__ __forceinline__ uint2 convert8(const float (&x)[8], float scale, ThreadStats& st) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(x[j], scale);  // the f32 product, as the host codec takes it
  uint32_t w[2];
  to_fp8x8_raw<F>(v, w);
  if (any_top_code<F>(w)) {
#pragma unroll
    for (int j = 0; j < 8; ++j) st.add(x[j], v[j], fp8_max(F));
    fix_nan_codes<F>(v, w);
  } else {
    const float m = fmaxf(fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3]))),
                          fmaxf(fmaxf(fabsf(x[4]), fabsf(x[5])), fmaxf(fabsf(x[6]), fabsf(x[7]))));
    st.amax_bits = max(st.amax_bits, __float_as_uint(m));
  }
  return {w[0], w[1]};
}

// The block's statistics into out with one atomic per statistic (blockDim.x == kBlockThreads, a multiple of 32; every
// thread of the block calls it).
template <int kBlockThreads>
__device__ __forceinline__ void flush_block_stats(ThreadStats s, const Fp8CastOutputs& out) {
  static_assert(kBlockThreads % 32 == 0 && kBlockThreads <= 1024);
  __shared__ unsigned s_amax[kBlockThreads / 32], s_sat[kBlockThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  s.amax_bits = __reduce_max_sync(0xffffffffu, s.amax_bits);
  s.saturated = __reduce_add_sync(0xffffffffu, s.saturated);
  if (lane == 0) {
    s_amax[warp] = s.amax_bits;
    s_sat[warp] = s.saturated;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned a = 0, n = 0;
    for (int w = 0; w < kBlockThreads / 32; ++w) {
      a = max(a, s_amax[w]);
      n += s_sat[w];
    }
    if (out.amax && a) atomicMax(reinterpret_cast<unsigned*>(out.amax), a);
    if (out.saturated && n) atomicAdd(out.saturated, static_cast<unsigned long long>(n));
  }
}

}  // namespace
}  // namespace fp8t::kernels
