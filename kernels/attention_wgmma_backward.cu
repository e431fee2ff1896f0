// The attention backward's main pass at head size 64 on Hopper's warpgroup MMA: the product's instances of the
// kernel in kernels/attention_wgmma_backward_kernel.cuh (three blocks per SM, dQ added as tiles; dK and dV into
// dqkv, or as dy codes).
#include "kernels/attention_wgmma_backward_kernel.cuh"

namespace fp8t::kernels {

void attention_backward_wgmma64(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout,
                                const AttentionQkv& qkv, const float* lse, int B, int T, int NH, float scale,
                                cudaStream_t stream, bool accumulate, const AttentionDyCodes* dy) {
  FP8T_CHECK(attention_wgmma_available(), "attention_backward_wgmma64: needs an sm_90a build on a Hopper GPU");
  constexpr auto kTiles = DqLayout::tiles;
  constexpr auto kOrder = kProductOrder;
  if (dy && qkv.e4m3)
    launch_backward_wgmma<3, kTiles, true, kOrder, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale,
                                                         stream, false, *dy);
  else if (dy)
    launch_backward_wgmma<3, kTiles, false, kOrder, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale,
                                                          stream, false, *dy);
  else if (qkv.e4m3)
    launch_backward_wgmma<3, kTiles, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, accumulate);
  else
    launch_backward_wgmma<3, kTiles>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, accumulate);
}

}  // namespace fp8t::kernels
