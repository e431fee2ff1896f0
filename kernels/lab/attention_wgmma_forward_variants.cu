// The lab's variants of the bf16 wgmma attention forward (kernels/lab/attention_wgmma_forward_variants.cuh).
#include <cmath>

#include "kernels/attention_wgmma_forward_kernel.cuh"
#include "kernels/attention_wgmma_forward_ws_kernel.cuh"
#include "kernels/lab/attention_wgmma_forward_variants.cuh"

namespace fp8t::kernels::lab {
namespace {

AttentionQkv checked_qkv(const bf16* qkv, int B, int T, int NH, const char* op) {
  FP8T_CHECK(attention_wgmma_available(), "lab::{}: needs sm_90a and a Hopper GPU", op);
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "lab::{}: bad sizes B={} T={} NH={}", op, B, T, NH);
  AttentionQkv q;
  q.bf16 = qkv;
  return q;
}

}  // namespace

void attention_forward_wgmma_cp_async(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                                      cudaStream_t stream) {
  const AttentionQkv q = checked_qkv(qkv, B, T, NH, "attention_forward_wgmma_cp_async");
  launch_forward_cp_async<false>(out, lse, q, B, T, NH, 1.0f / sqrtf(float(kHs)), stream);
}

void attention_forward_wgmma_pingpong(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                                      cudaStream_t stream) {
  const AttentionQkv q = checked_qkv(qkv, B, T, NH, "attention_forward_wgmma_pingpong");
  launch_forward_ws<true, false>(out, lse, q, B, T, NH, 1.0f / sqrtf(float(kHs)), stream);
}

void attention_forward_wgmma_narrow(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                                    cudaStream_t stream) {
  const AttentionQkv q = checked_qkv(qkv, B, T, NH, "attention_forward_wgmma_narrow");
  launch_forward_ws<false, false>(out, lse, q, B, T, NH, 1.0f / sqrtf(float(kHs)), stream);
}

void attention_forward_wgmma_codes_ws(bf16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH,
                                      cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "lab::attention_forward_wgmma_codes_ws: needs sm_90a and a Hopper GPU");
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "lab::attention_forward_wgmma_codes_ws: bad sizes B={} T={} NH={}", B, T, NH);
  launch_forward_ws<false, true, true>(out, lse, qkv, B, T, NH, 1.0f / sqrtf(float(kHs)), stream);
}

}  // namespace fp8t::kernels::lab
