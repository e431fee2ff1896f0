// FP8 casts: bf16/f32 -> E4M3/E5M2 with a per-tensor scale read from device memory, optionally also
// the transposed copy (Hopper FP8 GEMMs take both operands K-major), recording the tensor's amax and
// saturation count in the same pass. Plus the amax-only pass and the device scale update that
// current scaling needs.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace fp8t::kernels {

// Device-side statistics a cast accumulates; any pointer may be null.
struct Fp8CastOutputs {
  float* amax = nullptr;                  // max |x| (unscaled), as float bits; NaN sticks. Zero it to start.
  unsigned long long* saturated = nullptr;  // += count of |x * scale| > fmax (infinities included)
  // (cols): colsum[c] += sum over rows of the unscaled in[:, c], in f32 (a bias gradient read off the
  // same pass over dy). Added with atomics, one per column per 128-row tile, so the order of the f32
  // additions varies from run to run; NaN and inf propagate as in any sum. Not zeroed by the cast.
  float* colsum = nullptr;
};

// What the cast reads: the input itself, or gelu(input) computed on the fly (the FP8 MLP's GELU fused
// into fc2's input cast, so the GELU output is never stored). gelu: bf16 input only; each value is
// bf16_rn(gelu(x)) with the device GELU of kernels/gelu_math.cuh, exactly what gelu_forward
// (kernels/gelu.cuh) writes, so codes, amax and saturation equal those of gelu_forward then the plain
// cast, bit for bit.
enum class Fp8CastInput { as_is, gelu };

// in (rows, cols) bf16 or f32, row-major. codes[i] = float_to_fp8(in[i] * *scale) bit-exactly as the
// host codec (RNE, satfinite, NaN -> 0x7F for E4M3 / 0x7E for E5M2). out (rows, cols) and out_t
// (cols, rows) may each be null (not both). A cast with stats.colsum set always runs the tiled
// (cast + transpose) kernel, which knows columns; without out_t it just skips the transposed stores.
// input gelu: in[i] stands for bf16_rn(gelu(in[i])) (see Fp8CastInput); always the tiled kernel, and
// no colsum.
void fp8_cast(const void* in, DType in_dtype, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t,
              Fp8Format format, const float* scale, Fp8CastOutputs stats, cudaStream_t stream,
              Fp8CastInput input = Fp8CastInput::as_is);

// out (n) bf16 = fp8_to_float(codes[i]) * *scale_inv, rounded to nearest even (as the host codec).
void fp8_dequantize(const uint8_t* codes, Fp8Format format, int64_t n, const float* scale_inv, __nv_bfloat16* out,
                    cudaStream_t stream);

// *amax = max(*amax, max |in|) with NaN sticking (the caller zeroes *amax first). input gelu (bf16
// only): the amax of bf16_rn(gelu(in)), the values fp8_cast with the same input reads.
void fp8_amax(const void* in, DType in_dtype, int64_t n, float* amax, cudaStream_t stream,
              Fp8CastInput input = Fp8CastInput::as_is);

// Current scaling on the device: *scale = fp8_scale_from_amax(*amax, fmax, margin, *scale) and
// *scale_inv = 1 / *scale, bit-exactly as the host function (src/fp8/scaling.h).
void fp8_scale_from_amax(const float* amax, float fmax, int margin, float* scale, float* scale_inv,
                         cudaStream_t stream);

}  // namespace fp8t::kernels
