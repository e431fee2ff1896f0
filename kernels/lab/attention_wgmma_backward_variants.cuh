// The wgmma attention backward's main passes kept for comparison with the product's (128 keys per block of two
// warpgroups, dQ added as tiles: kernels/attention_wgmma_backward.cu): the 64-key kernel of one warpgroup per block
// (kernels/attention_wgmma_backward_kernel.cuh) in five forms, and the 128-key kernel with cp.async loads (the
// product's for E4M3 qkv; for bf16 qkv the product's until the forty-sixth session) as it is, with its step choices
// reverted one by one (Backward128Flags) or all as the thirty-fifth session left them. Not in the product library:
// tests and benchmarks only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.cuh"

namespace fp8t::kernels::lab {

enum class WgmmaBackwardVariant : uint8_t {
  keys64_3_blocks,     // 64 keys per block, dQ as tiles, three blocks per SM: the product until the 35th session
  keys128_joint,       // the product's 128-key kernel with P^T and dS^T made once S^T and dP^T are done
  atomic_dq_2_blocks,  // dQ by f32 atomics into (B, T, C) rows, two blocks per SM
  atomic_dq_3_blocks,  // dQ by f32 atomics into rows, three blocks per SM
  tiled_dq_2_blocks,   // dQ by bulk reductions of 64 x 64 tiles (the product's layout), two blocks per SM
  p_during_dp,         // keys64_3_blocks with P^T made while dP^T's MMAs run (StepOrder::p_during_dp)
  dv_during_ds,        // keys64_3_blocks with dV's MMAs running while dS^T is made (StepOrder::dv_during_ds)
  keys128_main35,      // the 128-key kernel as the thirty-fifth session left it (kBackward128Main35)
  keys128_mask_every_step,  // the product's 128-key kernel with kMaskEveryStep
  keys128_dq_last,          // ... with kDqLast
  keys128_lse_at_load,      // ... with kLseAtLoad
  keys128_cp_async,         // the 128-key kernel with cp.async loads by its two warpgroups: the product until the
                            // 46th session (the product now loads by TMA from a third warpgroup where qkv is bf16)
};
inline constexpr WgmmaBackwardVariant kWgmmaBackwardVariants[] = {WgmmaBackwardVariant::keys64_3_blocks,
                                                                  WgmmaBackwardVariant::keys128_joint,
                                                                  WgmmaBackwardVariant::atomic_dq_2_blocks,
                                                                  WgmmaBackwardVariant::atomic_dq_3_blocks,
                                                                  WgmmaBackwardVariant::tiled_dq_2_blocks,
                                                                  WgmmaBackwardVariant::p_during_dp,
                                                                  WgmmaBackwardVariant::dv_during_ds,
                                                                  WgmmaBackwardVariant::keys128_main35,
                                                                  WgmmaBackwardVariant::keys128_mask_every_step,
                                                                  WgmmaBackwardVariant::keys128_dq_last,
                                                                  WgmmaBackwardVariant::keys128_lse_at_load,
                                                                  WgmmaBackwardVariant::keys128_cp_async};
const char* variant_name(WgmmaBackwardVariant variant);

// kernels::attention_backward at head size 64 on a Hopper with an sm_90a build, with `variant`'s main pass
// between the product's delta and dQ passes: dqkv (B, T, 3C) bf16 += the gradient. Scratch: dq_accum,
// attention_dq_scratch_floats(B, T, NH, 64) f32 (enough for every variant), and delta (B, NH, T) f32.
void attention_backward_wgmma(WgmmaBackwardVariant variant, __nv_bfloat16* dqkv, float* dq_accum, float* delta,
                              const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                              const float* lse, int B, int T, int NH, cudaStream_t stream);

// The dy-codes backward (FP8 training's: the gradient written as the qkv linear's E5M2 codes, AttentionDyCodes) with
// the main pass of 64 keys per block and three blocks per SM (keys64) or the 128-key one with cp.async loads, between
// the product's delta and dQ-codes passes. Scratch as above.
void attention_backward_wgmma_dy(bool keys64, const AttentionDyCodes& dy, float* dq_accum, float* delta,
                                 const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                 const float* lse, int B, int T, int NH, cudaStream_t stream);

}  // namespace fp8t::kernels::lab
