// A wgmma attention forward (head size 64) that overlaps, within each warpgroup, the softmax of key tile j with the
// P V product of tile j - 1 on the tensor cores (FlashAttention-3's intra-warpgroup pipelining), kept in the lab
// against the product's forward (kernels/attention_wgmma_forward_ws_kernel.cuh), which waits for every MMA before
// its softmax.
// Not in the product library: tests and benchmarks only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace fp8t::kernels::lab {

// out (B, T, C) bf16 and lse (B, NH, T) f32 from qkv (B, T, 3C) bf16, C = 64 NH, as kernels::attention_forward
// (causal, scale 1 / 8). Needs an sm_90a build on a Hopper GPU (kernels::attention_wgmma_available()).
void attention_forward_wgmma_pipelined(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                       cudaStream_t stream);

}  // namespace fp8t::kernels::lab
