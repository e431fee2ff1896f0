// Variants of the product's bf16 wgmma attention forward (head size 64; the kernel fed by a loading warpgroup,
// kernels/attention_wgmma_forward_ws_kernel.cuh), kept in the lab against it. Both compute the product's MMAs and
// softmax in the same order, so their results are the product's bit for bit:
// - cp_async: the kernel that loads with its two computing warpgroups (cp.async, two block barriers a key tile), the
//   product's bf16 forward until the forty-ninth session; the product keeps it for E4M3 qkv
//   (kernels/attention_wgmma_forward_kernel.cuh);
// - narrow: the product's kernel with a single loading warp in place of the loading warpgroup (288 threads; ptxas
//   gives them 96 registers and they spill 8 bytes, where setmaxnreg gives the product's computing warps 104), the
//   product's bf16 forward during the fiftieth session; 1% slower on an H100;
// - pingpong: the narrow kernel with its two warpgroups taking turns issuing their MMAs (FlashAttention-3's ping-pong
//   scheduling, named barriers); 1.5% slower than the narrow one on an H100;
// - codes_ws (E4M3 qkv, against the product's cp.async kernel for codes): the product's kernel whose loading
//   warpgroup brings the codes by TMA and dequantizes them into the bf16 tiles; 3.5-5% slower on an H100.
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
void attention_forward_wgmma_narrow(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                    cudaStream_t stream);
// qkv as E4M3 codes with a scale per row (AttentionQkv's e4m3 and row_scale_inv; 16-byte aligned).
void attention_forward_wgmma_codes_ws(__nv_bfloat16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH,
                                      cudaStream_t stream);

}  // namespace fp8t::kernels::lab
