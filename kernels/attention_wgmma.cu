// Attention forward, head size 64, on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a), and whether this build
// and device can run these kernels: bf16 qkv through the kernel fed by a loading warpgroup
// (kernels/attention_wgmma_forward_ws_kernel.cuh), E4M3 qkv (or bf16 not 16-byte aligned) through the one that loads
// with its computing threads (kernels/attention_wgmma_forward_kernel.cuh). The backward's main pass is in
// kernels/attention_wgmma_backward.cu.
#include "kernels/attention_wgmma_forward_kernel.cuh"
#include "kernels/attention_wgmma_forward_ws_kernel.cuh"

namespace fp8t::kernels {

bool attention_wgmma_available() {
#ifdef FP8T_CUDA_SM90A
  return is_hopper();
#else
  return false;
#endif
}

void attention_forward_wgmma64(bf16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH, float scale,
                               cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "attention_forward_wgmma64: needs an sm_90a build on a Hopper GPU");
  if (forward_ws_takes(qkv))
    launch_forward_ws(out, lse, qkv, B, T, NH, scale, stream);
  else if (qkv.e4m3)
    launch_forward_cp_async<true>(out, lse, qkv, B, T, NH, scale, stream);
  else
    launch_forward_cp_async<false>(out, lse, qkv, B, T, NH, scale, stream);
}

}  // namespace fp8t::kernels
