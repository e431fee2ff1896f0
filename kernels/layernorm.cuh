// LayerNorm over the last dimension C (eps 1e-5): bf16 activations, bf16 weights, f32 statistics.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.cuh"

namespace fp8t::kernels {

// out (N, C) bf16; mean, rstd (N) f32 saved for backward; w, b (C) bf16
void layernorm_forward(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* inp,
                       const __nv_bfloat16* w, const __nv_bfloat16* b, int64_t N, int C, cudaStream_t stream);
// mean, rstd (N) f32: exactly the statistics layernorm_forward saves, without its output (the FP8
// cast's LayerNorm prologue, kernels/fp8_cast.cuh, applies the normalization itself).
void layernorm_stats(float* mean, float* rstd, const __nv_bfloat16* inp, int64_t N, int C, cudaStream_t stream);
// out (N, C) bf16 = a + b (the add op's rounding; out must not alias a or b), and mean, rstd (N) f32 =
// layernorm_stats(out), bit for bit, in one pass: a residual add whose sum feeds an FP8 LayerNorm cast. With b_bias
// (C), in these three: out = a + (b + b_bias) as add_forward with b_bias (kernels/add.cuh) rounds it.
void add_layernorm_stats(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* a,
                         const __nv_bfloat16* b, int64_t N, int C, cudaStream_t stream,
                         const __nv_bfloat16* b_bias = nullptr);
// add_layernorm_stats, and in the same pass the sum's LayerNorm output (w, lb) into normed (N, C) bf16, bit for bit
// layernorm_forward(normed, mean, rstd, out, w, lb): a residual add whose sum feeds a bf16 LayerNorm.
void add_layernorm_forward(__nv_bfloat16* out, __nv_bfloat16* normed, float* mean, float* rstd,
                           const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* w,
                           const __nv_bfloat16* lb, int64_t N, int C, cudaStream_t stream,
                           const __nv_bfloat16* b_bias = nullptr);
// add_layernorm_stats, and in the same pass the sum's LayerNorm output (w, lb) cast to FP8 into codes (N, C), bit for
// bit fp8_cast(out, ..., scale, stats, Fp8CastInput::layernorm, {mean, rstd, w, lb})'s row-major codes and statistics
// (no column sums): the residual add before an FP8 LayerNorm linear whose input scale is known (delayed scaling).
void add_layernorm_cast(__nv_bfloat16* out, float* mean, float* rstd, uint8_t* codes, const __nv_bfloat16* a,
                        const __nv_bfloat16* b, const __nv_bfloat16* w, const __nv_bfloat16* lb, int64_t N, int C,
                        Fp8Format format, const float* scale, Fp8CastOutputs stats, cudaStream_t stream,
                        const __nv_bfloat16* b_bias = nullptr);
// The LayerNorm backward's new dinp written also as an FP8 linear's E5M2 dy codes: the residual branch's proj or fc2,
// whose output gradient is the sum's that this LayerNorm finishes (autograd/variable.h: GradCell::residual_dy).
// codes (N, C), always (non-null), and optionally codes_t (C, N) (fp8_transpose of codes after the kernel), each code
// to_fp8(bf16(dinp) * *scale) bit for bit as fp8_cast of the bf16 dinp gives, and that cast's statistics and column
// sums added into stats (null members skipped). Or, with codes null (and codes_t too), only dinp's new values' column
// sums into stats.colsum (non-null; the rest of stats and scale unused): a BF16 linear's bias gradient.
struct LayerNormDyCodes {
  uint8_t* codes = nullptr;
  uint8_t* codes_t = nullptr;
  const float* scale = nullptr;
  Fp8CastOutputs stats;
};
// Whether layernorm_backward can write dy codes for N rows of C: the one-pass kernel's shapes.
bool layernorm_backward_writes_dy_codes(int64_t N, int C);
// dinp (N, C) bf16 +=; dw, db (C) f32 += (atomics across row chunks); dy (where layernorm_backward_writes_dy_codes and
// the rows are 16-byte aligned; else an error): dinp's new values as dy codes too, or their column sums alone.
void layernorm_backward(__nv_bfloat16* dinp, float* dw, float* db, const __nv_bfloat16* dout,
                        const __nv_bfloat16* inp, const __nv_bfloat16* w, const float* mean, const float* rstd,
                        int64_t N, int C, cudaStream_t stream, const LayerNormDyCodes* dy = nullptr);

}  // namespace fp8t::kernels
