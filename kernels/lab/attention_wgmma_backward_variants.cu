// The lab's instances of the wgmma attention backward kernel (kernels/attention_wgmma_backward_kernel.cuh), each
// run between the product's delta and dQ passes (kernels/attention_backward_passes.cuh).
#include <type_traits>

#include "kernels/attention_wgmma_backward128_kernel.cuh"
#include "kernels/attention_wgmma_backward_kernel.cuh"
#include "kernels/lab/attention_wgmma_backward_variants.cuh"

namespace fp8t::kernels::lab {

const char* variant_name(WgmmaBackwardVariant variant) {
  switch (variant) {
    case WgmmaBackwardVariant::keys64_3_blocks: return "64 keys, 3 blocks/SM";
    case WgmmaBackwardVariant::keys128_joint: return "128 keys, joint order";
    case WgmmaBackwardVariant::atomic_dq_2_blocks: return "atomic dQ, 2 blocks/SM";
    case WgmmaBackwardVariant::atomic_dq_3_blocks: return "atomic dQ, 3 blocks/SM";
    case WgmmaBackwardVariant::tiled_dq_2_blocks: return "tiled dQ, 2 blocks/SM";
    case WgmmaBackwardVariant::p_during_dp: return "P during dP";
    case WgmmaBackwardVariant::dv_during_ds: return "dV during dS (bf16 P)";
    case WgmmaBackwardVariant::keys128_main35: return "128 keys, 35th session";
    case WgmmaBackwardVariant::keys128_mask_every_step: return "128 keys, mask every step";
    case WgmmaBackwardVariant::keys128_dq_last: return "128 keys, dQ last";
    case WgmmaBackwardVariant::keys128_lse_at_load: return "128 keys, lse at load";
    case WgmmaBackwardVariant::keys128_cp_async: return "128 keys, cp.async loads";
  }
  return "?";
}

void attention_backward_wgmma(WgmmaBackwardVariant variant, bf16* dqkv, float* dq_accum, float* delta,
                              const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B, int T,
                              int NH, cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "lab::attention_backward_wgmma: needs an sm_90a build on a Hopper GPU");
  FP8T_CHECK(B > 0 && T > 0 && NH > 0 && int64_t{B} * NH * ceil_div(T, kKeys) <= 0x7fffffff,
             "lab::attention_backward_wgmma: bad sizes B={} T={} NH={}", B, T, NH);
  FP8T_CHECK(aligned16(qkv) && aligned16(dout) && aligned16(out) && aligned16(dqkv) && aligned16(dq_accum),
             "lab::attention_backward_wgmma: qkv, dout, out, dqkv and dq_accum must be 16-byte aligned");
  const float scale = 1.0f / sqrtf(float(kHs));
  const bool rows = variant == WgmmaBackwardVariant::atomic_dq_2_blocks ||
                    variant == WgmmaBackwardVariant::atomic_dq_3_blocks;
  const DqLayout layout = rows ? DqLayout::rows : DqLayout::tiles;
  attention_backward_delta(delta, dq_accum, layout, dout, AttentionOut{.bf16 = out}, B, T, NH, kHs, stream);
  const AttentionQkv in{.bf16 = qkv};
  auto launch128 = [&](auto flags) {  // flags: std::integral_constant of Backward128Flags
    launch_backward_wgmma128<false, false, decltype(flags)::value>(dqkv, dq_accum, delta, dout, in, lse, B, T, NH,
                                                                   scale, stream, true, AttentionDyCodes{});
  };
  switch (variant) {
    case WgmmaBackwardVariant::keys64_3_blocks:
      launch_backward_wgmma<3, DqLayout::tiles>(dqkv, dq_accum, delta, dout, in, lse, B, T, NH, scale, stream);
      break;
    case WgmmaBackwardVariant::keys128_joint: launch128(std::integral_constant<int, kJoint>{}); break;
    case WgmmaBackwardVariant::keys128_main35: launch128(std::integral_constant<int, kBackward128Main35>{}); break;
    case WgmmaBackwardVariant::keys128_mask_every_step: launch128(std::integral_constant<int, kMaskEveryStep>{}); break;
    case WgmmaBackwardVariant::keys128_dq_last: launch128(std::integral_constant<int, kDqLast>{}); break;
    case WgmmaBackwardVariant::keys128_lse_at_load: launch128(std::integral_constant<int, kLseAtLoad>{}); break;
    case WgmmaBackwardVariant::keys128_cp_async: launch128(std::integral_constant<int, 0>{}); break;
    case WgmmaBackwardVariant::atomic_dq_2_blocks:
      launch_backward_wgmma<2, DqLayout::rows>(dqkv, dq_accum, delta, dout, in, lse, B, T, NH, scale, stream);
      break;
    case WgmmaBackwardVariant::atomic_dq_3_blocks:
      launch_backward_wgmma<3, DqLayout::rows>(dqkv, dq_accum, delta, dout, in, lse, B, T, NH, scale, stream);
      break;
    case WgmmaBackwardVariant::tiled_dq_2_blocks:
      launch_backward_wgmma<2, DqLayout::tiles>(dqkv, dq_accum, delta, dout, in, lse, B, T, NH, scale, stream);
      break;
    case WgmmaBackwardVariant::p_during_dp:
      launch_backward_wgmma<3, DqLayout::tiles, false, StepOrder::p_during_dp>(dqkv, dq_accum, delta, dout, in, lse, B,
                                                                               T, NH, scale, stream);
      break;
    case WgmmaBackwardVariant::dv_during_ds:
      launch_backward_wgmma<3, DqLayout::tiles, false, StepOrder::dv_during_ds>(dqkv, dq_accum, delta, dout, in, lse,
                                                                                B, T, NH, scale, stream);
      break;
  }
  attention_backward_dq(dqkv, dq_accum, layout, B, T, NH, kHs, stream);
}

void attention_backward_wgmma_dy(bool keys64, const AttentionDyCodes& dy, float* dq_accum, float* delta,
                                 const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B, int T,
                                 int NH, cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "lab::attention_backward_wgmma_dy: needs an sm_90a build on a Hopper GPU");
  FP8T_CHECK(B > 0 && T > 0 && NH > 0 && int64_t{B} * NH * ceil_div(T, kKeys) <= 0x7fffffff,
             "lab::attention_backward_wgmma_dy: bad sizes B={} T={} NH={}", B, T, NH);
  const float scale = 1.0f / sqrtf(float(kHs));
  attention_backward_delta(delta, dq_accum, DqLayout::tiles, dout, AttentionOut{.bf16 = out}, B, T, NH, kHs, stream);
  const AttentionQkv in{.bf16 = qkv};
  if (keys64)
    launch_backward_wgmma<3, DqLayout::tiles, false, kProductOrder, true>(nullptr, dq_accum, delta, dout, in, lse, B,
                                                                          T, NH, scale, stream, false, dy);
  else
    launch_backward_wgmma128<false, true>(nullptr, dq_accum, delta, dout, in, lse, B, T, NH, scale, stream, false, dy);
  attention_backward_dq_codes(dq_accum, dy, B, T, NH, stream);
}

}  // namespace fp8t::kernels::lab
