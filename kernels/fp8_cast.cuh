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

// What the cast reads: the input itself, or a function of it computed on the fly (a "prologue", so that
// the function's output is never stored). Every prologue takes bf16 input and rounds its f32 result to
// bf16 (round to nearest even), exactly as the unfused kernel stores it, so codes, amax and saturation
// equal those of that kernel followed by the plain cast, bit for bit.
// gelu: bf16_rn(gelu(x)) with the device GELU of kernels/gelu_math.cuh, what gelu_forward
//   (kernels/gelu.cuh) writes (the FP8 MLP's GELU fused into fc2's input cast).
// layernorm: in (rows, cols) is LayerNorm's input x, and element (r, c) reads
//   bf16_rn((x[r, c] - mean[r]) * rstd[r] * w[c] + b[c]) with the arithmetic of
//   kernels/layernorm_math.cuh, what layernorm_forward (kernels/layernorm.cuh) writes, given the mean and
//   rstd of layernorm_stats (a LayerNorm fused into the input cast of the linear that follows it).
// dgelu: in (rows, cols) is d gelu(pre), the gradient of a GELU's output, and element (r, c) reads
//   bf16_rn(gelu'(pre[r, c]) * in[r, c]) with the arithmetic of kernels/gelu_math.cuh, what
//   gelu_backward (kernels/gelu.cuh) writes into a zero-filled gradient (the FP8 MLP's GELU backward
//   fused into fc's output-gradient cast, so pre's gradient is never written).
// saved_gelu: gelu with its input given as per-row E4M3 codes (src/fp8/saved.h) in ops.pre_codes and
//   ops.row_scale_inv, not in `in` (unread, may be null): element (r, c) reads
//   bf16_rn(gelu(restore(r, c))), restore(r, c) = bf16_rn(decode(pre_codes[r, c]) * row_scale_inv[r]) as
//   fp8_restore writes it, so the codes equal those of fp8_restore then the gelu cast, bit for bit,
//   reading 1 byte per element instead of writing and reading 2 (fc2's input cast from pre's saved codes).
// saved_dgelu: dgelu with pre given as saved_gelu's codes (ops.pre_codes, ops.row_scale_inv; ops.pre
//   unused): gelu'(restore(r, c)), the rest as dgelu (colsum too).
enum class Fp8CastInput { as_is, gelu, layernorm, dgelu, saved_gelu, saved_dgelu };

// The operands of the layernorm and dgelu prologues (null where unused): the LayerNorm's per-row
// statistics (layernorm_stats) and per-column weight and bias, and the GELU's input for dgelu.
struct Fp8CastOperands {
  const float* mean = nullptr;          // layernorm: (rows) f32
  const float* rstd = nullptr;          // layernorm: (rows) f32
  const __nv_bfloat16* w = nullptr;     // layernorm: (cols) bf16
  const __nv_bfloat16* b = nullptr;     // layernorm: (cols) bf16
  const __nv_bfloat16* pre = nullptr;   // dgelu: (rows, cols) bf16, the GELU's input
  const uint8_t* pre_codes = nullptr;   // saved_gelu, saved_dgelu: (rows, cols) E4M3 codes of the GELU's input
  const float* row_scale_inv = nullptr; // saved_gelu, saved_dgelu: (rows) their scale_inv per row
};

// in (rows, cols) bf16 or f32, row-major. codes[i] = float_to_fp8(in[i] * *scale) bit-exactly as the
// host codec (RNE, satfinite, NaN -> 0x7F for E4M3 / 0x7E for E5M2). out (rows, cols) and out_t
// (cols, rows) may each be null (not both). A cast with stats.colsum set always runs the tiled
// (cast + transpose) kernel, which knows columns; without out_t it just skips the transposed stores.
// input gelu, layernorm or dgelu: the cast reads the prologue's values (see Fp8CastInput; ops holds
// their operands); always the tiled kernel; colsum only with dgelu (it sums the values the cast reads:
// fc's bias gradient).
void fp8_cast(const void* in, DType in_dtype, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t,
              Fp8Format format, const float* scale, Fp8CastOutputs stats, cudaStream_t stream,
              Fp8CastInput input = Fp8CastInput::as_is, Fp8CastOperands ops = {});

// fp8_all's MLP backward casts over the saved GELU input in one pass: what fp8_cast with saved_gelu writes into out_t
// (here gelu_t: (cols, rows) E4M3 codes of gelu(pre) with *gelu_scale, no statistics: fc2's wgrad operand) and what
// fp8_cast with saved_dgelu writes into out / out_t (`format`, *scale, stats, colsum: fc's dgrad and wgrad operands
// and bias gradient), each bit for bit, reading pre's codes (ops.pre_codes, ops.row_scale_inv) once. out or out_t may
// be null. Needs fp8_saved_gelu_pair_supported (else an error: run the two casts).
bool fp8_saved_gelu_pair_supported(const __nv_bfloat16* in, int64_t rows, int64_t cols, const uint8_t* out,
                                   const uint8_t* out_t, const uint8_t* gelu_t, const Fp8CastOperands& ops);
void fp8_cast_saved_gelu_pair(const __nv_bfloat16* in, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t,
                              uint8_t* gelu_t, Fp8Format format, const float* scale, const float* gelu_scale,
                              Fp8CastOutputs stats, const Fp8CastOperands& ops, cudaStream_t stream);

// A cast's statistics kept aside by a kernel that wrote the cast's codes itself (the attention backward's dy codes,
// kernels/attention.cuh; autograd/variable.h's PendingGrad::dy_stats): cols f32 column sums, then at the next even
// index the amax (f32) and, two floats on, the saturation count (u64), all zero to start; cast_stats_floats(cols)
// floats. fp8_add_cast_stats adds them into out as the cast would have: colsum += sums, amax = max, saturated +=.
inline constexpr int64_t cast_stats_amax_index(int64_t cols) { return (cols + 1) / 2 * 2; }
inline constexpr int64_t cast_stats_floats(int64_t cols) { return cast_stats_amax_index(cols) + 4; }
void fp8_add_cast_stats(const float* kept, int64_t cols, Fp8CastOutputs out, cudaStream_t stream);

// out (n) bf16 = fp8_to_float(codes[i]) * *scale_inv, rounded to nearest even (as the host codec).
void fp8_dequantize(const uint8_t* codes, Fp8Format format, int64_t n, const float* scale_inv, __nv_bfloat16* out,
                    cudaStream_t stream);

// out (cols, rows) bf16 = the dequantize above of codes_t (rows, cols) transposed: a cast's transposed
// copy (out_t) read back in the layout of its input, e.g. an FP8 linear's saved input for another reader.
void fp8_dequantize_transposed(const uint8_t* codes_t, Fp8Format format, int64_t rows, int64_t cols,
                               const float* scale_inv, __nv_bfloat16* out, cudaStream_t stream);

// out_t (cols, rows) = in (rows, cols) transposed, FP8 codes (or any 1-byte elements) copied unchanged: the
// transposed copy of codes cast elsewhere (a ZeRO rank's all-gathered weight codes). rows, cols >= 1.
void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out_t, cudaStream_t stream);

// *amax = max(*amax, max |in|) with NaN sticking (the caller zeroes *amax first), in (n) seen as (n / cols,
// cols). input gelu, layernorm or dgelu: the amax of the values fp8_cast with the same input and operands
// reads (layernorm needs the true cols; the others ignore it).
void fp8_amax(const void* in, DType in_dtype, int64_t n, float* amax, cudaStream_t stream,
              Fp8CastInput input = Fp8CastInput::as_is, int64_t cols = 1, Fp8CastOperands ops = {});

// Current scaling on the device: *scale = fp8_scale_from_amax(*amax, fmax, margin, *scale) and
// *scale_inv = 1 / *scale, bit-exactly as the host function (src/fp8/scaling.h).
void fp8_scale_from_amax(const float* amax, float fmax, int margin, float* scale, float* scale_inv,
                         cudaStream_t stream);

}  // namespace fp8t::kernels
