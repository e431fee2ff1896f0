// FP8 storage of saved activations (src/fp8/saved.h) with one scale per row: the one-pass save
// (row amax, scale, E4M3 codes, optionally the bf16 round trip, from a single read of each row) and
// the per-row dequantize.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_cast.cuh"

namespace fp8t::kernels {

// x (rows, cols) bf16, row-major. For each row r: amax = max |x[r, :]| (NaN if the row holds one),
// scale = 448 / amax, or 1 when amax is zero or not finite or 448 / amax is not finite (the host's
// fp8_scale_from_amax(amax, 448, 0, 1), bit for bit); codes[r, c] = E4M3 satfinite_rne(x[r, c] * scale)
// (the cast kernels' codes: NaN -> 0x7F); scale_inv[r] = 1 / scale. roundtrip, if not null, receives
// bf16_rn(decode(codes[r, c]) * scale_inv[r]); it may be x itself (the round trip then replaces x in
// place) but must not overlap x otherwise. Each row is read once when it fits the registers of one
// block (up to 32768 elements when cols % 8 == 0 and the pointers allow 16-byte accesses, 8192
// otherwise); longer rows are read twice.
void fp8_save_rows(const __nv_bfloat16* x, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv,
                   __nv_bfloat16* roundtrip, cudaStream_t stream);

// fp8_save_rows without a round trip and, in the same pass, the cast of GELU of the round trip: out (rows, cols) =
// float_to_fp8(bf16_rn(gelu(restore(r, c))) * *scale) in `format`, with its amax and saturation count in stats
// (colsum must be null). Bit for bit fp8_save_rows followed by fp8_cast with the saved_gelu prologue
// (kernels/fp8_cast.cuh) on its codes, without reading the codes back: fc2's input cast under fp8_all, fused with
// the save of pre (fc's output). A GELU value depends only on the row and the code, so each row's 256 are tabulated
// once. out must not overlap x or codes.
void fp8_save_rows_gelu_cast(const __nv_bfloat16* x, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv,
                             uint8_t* out, Fp8Format format, const float* scale, Fp8CastOutputs stats,
                             cudaStream_t stream);

// out (rows, cols) bf16 = bf16_rn(decode(codes[r, c]) * scale_inv[r]), E4M3 codes.
void fp8_dequantize_rows(const uint8_t* codes, int64_t rows, int64_t cols, const float* scale_inv,
                         __nv_bfloat16* out, cudaStream_t stream);

}  // namespace fp8t::kernels
