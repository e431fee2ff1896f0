// The attention backward's main pass at head size 64 on Hopper's warpgroup MMA: the product's instances of the
// 128-key kernels, warp-specialized with TMA loads where qkv is bf16
// (kernels/attention_wgmma_backward128_ws_kernel.cuh) and with cp.async loads where it is E4M3 codes
// (kernels/attention_wgmma_backward128_kernel.cuh); dK and dV into dqkv, or as dy codes. The 64-key kernel
// (kernels/attention_wgmma_backward_kernel.cuh) runs in the lab.
#include "kernels/attention_wgmma_backward128_kernel.cuh"
#include "kernels/attention_wgmma_backward128_ws_kernel.cuh"

namespace fp8t::kernels {

void attention_backward_wgmma64(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout,
                                const AttentionQkv& qkv, const float* lse, int B, int T, int NH, float scale,
                                cudaStream_t stream, bool accumulate, const AttentionDyCodes* dy) {
  FP8T_CHECK(attention_wgmma_available(), "attention_backward_wgmma64: needs an sm_90a build on a Hopper GPU");
  // dy with codes: dK, dV as those; dy with column sums alone: into dqkv with their sums.
  const bool codes = dy && (dy->codes || dy->codes_t);
  const AttentionDyCodes sums_only = dy && !codes ? *dy : AttentionDyCodes{};
  if (backward_ws_takes(qkv, dout)) {  // bf16 qkv: the warp-specialized kernel
    if (codes)
      launch_backward_ws<true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, false, *dy);
    else
      launch_backward_ws<false>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, accumulate, sums_only);
  } else if (codes && qkv.e4m3) {
    launch_backward_wgmma128<true, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, false, *dy);
  } else if (codes) {
    launch_backward_wgmma128<false, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, false, *dy);
  } else if (qkv.e4m3) {
    launch_backward_wgmma128<true, false>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, accumulate,
                                          sums_only);
  } else {
    launch_backward_wgmma128<false, false>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, accumulate,
                                           sums_only);
  }
}

}  // namespace fp8t::kernels
