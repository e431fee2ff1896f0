// The wgmma attention forward (head size 64) with its loads issued by its two computing warpgroups (cp.async, two
// block barriers a key tile), run on bf16 qkv: the product's bf16 forward until the forty-ninth session, which moved
// it to a loading warp with TMA (kernels/attention_wgmma_forward_ws_kernel.cuh); the product keeps it for E4M3 qkv.
// Kept in the lab against the product. Not in the product library: tests and benchmarks only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace fp8t::kernels::lab {

// out (B, T, C) bf16 and lse (B, NH, T) f32 from qkv (B, T, 3C) bf16, C = 64 NH, as kernels::attention_forward
// (causal, scale 1 / 8). Needs an sm_90a build on a Hopper GPU (kernels::attention_wgmma_available()).
void attention_forward_wgmma_cp_async(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B, int T, int NH,
                                      cudaStream_t stream);

}  // namespace fp8t::kernels::lab
