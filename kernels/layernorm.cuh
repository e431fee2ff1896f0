// LayerNorm over the last dimension C (eps 1e-5): bf16 activations, bf16 weights, f32 statistics.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace fp8t::kernels {

// out (N, C) bf16; mean, rstd (N) f32 saved for backward; w, b (C) bf16
void layernorm_forward(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* inp,
                       const __nv_bfloat16* w, const __nv_bfloat16* b, int64_t N, int C, cudaStream_t stream);
// mean, rstd (N) f32: exactly the statistics layernorm_forward saves, without its output (the FP8
// cast's LayerNorm prologue, kernels/fp8_cast.cuh, applies the normalization itself).
void layernorm_stats(float* mean, float* rstd, const __nv_bfloat16* inp, int64_t N, int C, cudaStream_t stream);
// out (N, C) bf16 = a + b (the add op's rounding; out must not alias a or b), and mean, rstd (N) f32 =
// layernorm_stats(out), bit for bit, in one pass: a residual add whose sum feeds an FP8 LayerNorm cast.
void add_layernorm_stats(__nv_bfloat16* out, float* mean, float* rstd, const __nv_bfloat16* a,
                         const __nv_bfloat16* b, int64_t N, int C, cudaStream_t stream);
// The transposed FP8 codes of the LayerNorm output, which layernorm_backward can write on the way (fp8_all keeps no
// copy of the output; the linear that reads it needs them for its weight gradient): codes_t (C, N) row-major, element
// (c, r) = to_fp8<format>(y[r, c] * *scale), y[r, c] the bf16 value layernorm_forward writes (w and b its weight and
// bias); bit for bit the transposed output of fp8_cast with the layernorm prologue (kernels/fp8_cast.cuh).
struct LayerNormCodesT {
  uint8_t* codes_t = nullptr;  // null: no codes
  const float* scale = nullptr;
  const __nv_bfloat16* b = nullptr;
  Fp8Format format = Fp8Format::e4m3;
};

// dinp (N, C) bf16 +=; dw, db (C) f32 += (atomics across row chunks); codes, if codes.codes_t is set (only where
// layernorm_backward_codes_supported).
void layernorm_backward(__nv_bfloat16* dinp, float* dw, float* db, const __nv_bfloat16* dout,
                        const __nv_bfloat16* inp, const __nv_bfloat16* w, const float* mean, const float* rstd,
                        int64_t N, int C, cudaStream_t stream, const LayerNormCodesT& codes = {});
// Whether layernorm_backward can write codes_t: N % 32 == 0 (a block takes 32 rows, a 32-byte sector of each
// column), C % 8 == 0 and C <= 4096 (one pass), every buffer 16-byte aligned.
bool layernorm_backward_codes_supported(const __nv_bfloat16* dinp, const __nv_bfloat16* dout,
                                        const __nv_bfloat16* inp, const __nv_bfloat16* w, const __nv_bfloat16* b,
                                        const uint8_t* codes_t, int64_t N, int C);

}  // namespace fp8t::kernels
