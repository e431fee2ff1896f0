// The lab's cp.async wgmma attention forward on bf16 qkv (kernels/lab/attention_wgmma_forward_cp_async.cuh).
#include <cmath>

#include "kernels/attention_wgmma_forward_kernel.cuh"
#include "kernels/lab/attention_wgmma_forward_cp_async.cuh"

namespace fp8t::kernels::lab {

void attention_forward_wgmma_cp_async(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH,
                                      cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "lab::attention_forward_wgmma_cp_async: needs sm_90a and a Hopper GPU");
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "lab::attention_forward_wgmma_cp_async: bad sizes B={} T={} NH={}", B, T, NH);
  AttentionQkv q;
  q.bf16 = qkv;
  launch_forward_cp_async<false>(out, lse, q, B, T, NH, 1.0f / sqrtf(float(kHs)), stream);
}

}  // namespace fp8t::kernels::lab
