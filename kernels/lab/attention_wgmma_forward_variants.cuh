// Variants of the product's bf16 wgmma attention forward (head size 64; the loading-warp kernel,
// kernels/attention_wgmma_forward_ws_kernel.cuh), kept in the lab against it. Both compute the product's MMAs and
// softmax in the same order, so their results are the product's bit for bit:
// - cp_async: the kernel that loads with its two computing warpgroups (cp.async, two block barriers a key tile), the
//   product's bf16 forward until the forty-ninth session; the product keeps it for E4M3 qkv
//   (kernels/attention_wgmma_forward_kernel.cuh);
// - pingpong: the loading-warp kernel with its two warpgroups taking turns issuing their MMAs (FlashAttention-3's
//   ping-pong scheduling, named barriers);
// - wide: the loading-warp kernel with a whole loading warpgroup, three of its warps idle, so that setmaxnreg can give
//   the computing warps 104 registers where the product's 288-thread block has 96;
// - codes_ws (E4M3 qkv, against the product's cp.async kernel for codes): the wide kernel whose loading warpgroup
//   brings the codes by TMA and dequantizes them into the bf16 tiles.
// Not in the product library: tests and benchmarks only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/attention.cuh"

namespace fp8t::kernels::lab {

// out (B, T, C) bf16 and lse (B, NH, T) f32 from qkv (B, T, 3C) bf16 (16-byte aligned), C = 64 NH, as
// kernels::attention_forward (causal, scale 1 / 8). Need an sm_90a build on a Hopper GPU
// (kernels::attention_wgmma_available()).
void attention_forward_wgmma_cp_async(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                      cudaStream_t stream);
void attention_forward_wgmma_pingpong(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                      cudaStream_t stream);
void attention_forward_wgmma_wide(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                  cudaStream_t stream);
// qkv as E4M3 codes with a scale per row (AttentionQkv's e4m3 and row_scale_inv; 16-byte aligned).
void attention_forward_wgmma_codes_ws(__nv_bfloat16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH,
                                      cudaStream_t stream);

}  // namespace fp8t::kernels::lab
