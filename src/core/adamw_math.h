// AdamW's per-element arithmetic and moment encodings, compiled for the host (the CPU update) and the
// device (kernels/adamw.cu) alike, so that both write the same bits: the CUDA kernel is tested against
// the CPU loop exactly, and a checkpoint resumes exactly on either backend.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

#ifdef __CUDACC__
#define FP8T_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FP8T_HOST_DEVICE inline
#endif

namespace fp8t {

// The fp8 first moment has one f32 scale per block of this many consecutive elements of the optimizer's
// range, counted from the range's first element (the last block may be shorter).
inline constexpr int64_t kMomentBlock = 128;
inline constexpr float kMomentCodeMax = 448.0f;  // E4M3's largest finite value

// The scalars of one AdamW step, computed once on the host (adamw_hyper in optim/adamw.h).
struct AdamWHyper {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale;
  float bias_corr1, bias_corr2;  // 1 - beta^step
  float inv_bias_corr1, inv_bias_corr2;  // 1 / bias_corr (f32): an element multiplies instead of dividing
  uint32_t rounding_key;         // keys the stochastic rounding of this step (rounding_bits)
};

// A run of the optimizer's range with one weight decay, in local indices [begin, end).
struct AdamWSegment {
  int64_t begin, end;
  int64_t compute;  // index into the compute copy of element `begin`; -1: this run has none
  float weight_decay;
};

// One AdamW update over n elements, as raw pointers (host or device, all on one side).
struct AdamWBuffers {
  float* params = nullptr;            // (n) f32 master weights
  const void* grads = nullptr;        // (n) grad_dtype: f32 or bf16
  DType grad_dtype = DType::f32;
  StateDtype state_dtype = StateDtype::fp32;
  void* m = nullptr;                  // (n) f32 | bf16 | e4m3 codes
  void* v = nullptr;                  // (n) f32 | bf16 | bf16
  float* m_scale = nullptr;           // fp8: (ceil(n / kMomentBlock)) block scales; else unused
  uint16_t* params_bf16 = nullptr;    // compute copy (bf16 bits) written where a segment has one; may be null
  const AdamWSegment* segments = nullptr;  // sorted, covering [0, n) without gaps
  int num_segments = 0;
  int64_t n = 0;
  int64_t index_base = 0;             // flat-buffer index of element 0: stochastic rounding draws per flat index
};

// ---- f32 arithmetic that nvcc may not contract or reorder (the _rn intrinsics); the host spells the same
// operations, which x86-64 compilers do not contract without FMA instructions (-march flags enabling FMA
// would need -ffp-contract=off for the CPU result to stay bit-identical to the kernel's).
FP8T_HOST_DEVICE float f32_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FP8T_HOST_DEVICE float f32_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FP8T_HOST_DEVICE float f32_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FP8T_HOST_DEVICE float f32_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FP8T_HOST_DEVICE float f32_sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
FP8T_HOST_DEVICE uint32_t f32_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}
FP8T_HOST_DEVICE float f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

// ---- the update of one element: m, v and the parameter in f32
struct AdamWElement {
  float param, m, v;
};

FP8T_HOST_DEVICE AdamWElement adamw_element(float param, float grad, float m, float v, float weight_decay,
                                            const AdamWHyper& h) {
  const float g = f32_mul(grad, h.grad_scale);
  const float m1 = f32_add(f32_mul(h.beta1, m), f32_mul(h.one_minus_beta1, g));
  const float v1 = f32_add(f32_mul(h.beta2, v), f32_mul(f32_mul(h.one_minus_beta2, g), g));
  // One division and one square root per element: the update is compute-bound on the GPU, where each
  // correctly rounded division or root is a subroutine of a dozen or more instructions.
  const float mhat = f32_mul(m1, h.inv_bias_corr1), vhat = f32_mul(v1, h.inv_bias_corr2);
  const float step = f32_add(f32_div(mhat, f32_add(f32_sqrt(vhat), h.eps)), f32_mul(weight_decay, param));
  return {f32_sub(param, f32_mul(h.lr, step)), m1, v1};
}

// ---- stochastic rounding bits: a counter-based hash (murmur3's finalizer) of the flat element index
// under the step's key, so every backend, shard layout and resumed run draws the same bits. The low 16
// bits round m, the high 16 bits round v.
FP8T_HOST_DEVICE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x;
}
// The hash of the index's high word under the key, which rounding_bits_low finishes with the low word: a kernel
// hashes the high word once for the consecutive indices that share it.
FP8T_HOST_DEVICE uint32_t rounding_high(uint32_t key, int64_t index) {
  return mix32(static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32) ^ key);
}
FP8T_HOST_DEVICE uint32_t rounding_bits_low(uint32_t high, int64_t index) {
  return mix32(static_cast<uint32_t>(static_cast<uint64_t>(index)) ^ high);
}
FP8T_HOST_DEVICE uint32_t rounding_bits(uint32_t key, int64_t index) {
  return rounding_bits_low(rounding_high(key, index), index);
}

// x to bf16, rounded up in magnitude with probability (dropped bits) / 2^16: adding 16 uniform bits
// below the kept ones and truncating. Unbiased, E[bf16(x)] = x, where nearest rounding would drop every
// increment below half a bf16 ulp of the moment. NaN stays a quiet NaN (as float_to_bf16).
FP8T_HOST_DEVICE uint16_t bf16_round_stochastic(float x, uint32_t bits16) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + (bits16 & 0xFFFFu)) >> 16);
}
FP8T_HOST_DEVICE float bf16_value(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// ---- the fp8 first moment of a block: scale = amax / 448 (0 for a block of zeros, whose codes are 0),
// code = e4m3(m * (1 / scale)) (round to nearest even, saturating), value = e4m3 value * scale.
FP8T_HOST_DEVICE float moment_block_scale(float amax) {
  return amax > 0.0f ? f32_div(amax, kMomentCodeMax) : 0.0f;
}
// 1 / scale, once per block (0 for a zero block), so that encoding an element multiplies.
FP8T_HOST_DEVICE float moment_inv_scale(float scale) { return scale > 0.0f ? f32_div(1.0f, scale) : 0.0f; }
// What gets encoded as the code of m: m * (1 / scale), or 0 in a zero block (NaN stays NaN).
FP8T_HOST_DEVICE float moment_scaled(float m, float inv_scale) {
  return inv_scale > 0.0f ? f32_mul(m, inv_scale) : (m != m ? m : 0.0f);
}

}  // namespace fp8t
