// FP8 linear: y = x @ w^T + b with all three GEMMs (fprop, dgrad, wgrad) on FP8 operands and FP32
// accumulation, per-tensor scales from Fp8TensorMeta, and the FP8 weight copy cast once per
// optimizer step. On CUDA the GEMMs run on cuBLASLt (bf16 x, w and b; bf16 output) with the scales
// on the device (fp8/device_meta.h). On the CPU it is emulated exactly: the GEMM multiplies the decoded FP8 values
// (products of two FP8 values are exact in f32) with f32 accumulation and scales the result by
// scale_inv_a * scale_inv_b, the way cuBLASLt applies its A/B scale pointers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "autograd/tape.h"
#include "config/config.h"
#include "fp8/device_meta.h"
#include "fp8/quantize.h"
#include "fp8/quantized_tensor.h"
#include "fp8/scaling.h"
#include "ops/ops.h"

namespace fp8t {

// Everything one FP8 linear keeps between calls. It must outlive every tape that recorded the op
// (backward closures hold a pointer to it): the model owns one per FP8 linear.
struct Fp8LinearState {
  std::string name;   // e.g. "h.3.mlp.c_fc": metrics and NaN/Inf reports
  Fp8Config cfg;
  Fp8RoleFormats formats;
  Fp8TensorMeta input, weight, grad_output;

  // Bumped after every optimizer step; the cached FP8 weight is valid for one version.
  uint64_t weight_version = 0;
  // (OC, IC) per-tensor codes in MemCategory::fp8_cache; on CUDA also codes_t (IC, OC) of the same cast, for
  // dgrad (K-major), and scale_inv a view of the weight's device slot.
  QuantizedTensor weight_fp8;
  uint64_t cached_version = 0;
  bool cache_valid = false;
  int64_t weight_casts = 0;        // how many times the weight was cast (tests, metrics)

  // CUDA: the scales and this step's amax/saturation of input, weight and grad_output on the device.
  Fp8DeviceState device;

  Fp8LinearState(std::string name, const Fp8Config& cfg);
  Fp8Metas metas() { return {&input, &weight, &grad_output}; }

  // The FP8 copy of w for the current weight_version, cast (and its amax recorded) on first use.
  const QuantizedTensor& weight_for_step(const Tensor& w);
  // CUDA: moves this step's device amax/saturation into the host metas (one device-to-host copy;
  // see fp8/device_meta.h). Idempotent within a step; a no-op on the CPU path.
  void collect_device_stats() { device.collect(metas()); }
  // After the optimizer step: new weight version, and every meta enters this step's amax into its
  // history and updates its scale. Call once per optimizer step (also for a skipped step).
  void on_optimizer_step();
  // ||dequant(q(w)) - w|| / ||w|| for the scale the next weight cast will use (no state change).
  double weight_error(const Tensor& w) const;

  // ---- A sharded master (ZeRO stages 1 and 2 on several ranks, nn/params.h): each rank casts the part of
  // the weight whose f32 master it keeps, the codes are all-gathered, and the weight's Var value is then
  // the codes themselves (nn/gpt.h, GPT::publish_weights). Per optimizer step, after on_optimizer_step():
  // Current scaling (weight.recipe->scale_from_tensor()): amax[index] = max(amax[index], max |piece|), f32
  // on the piece's device; once max-reduced over the ranks, weight_scale_from_amax sets this version's scale.
  void weight_piece_amax(const Tensor& piece, Tensor& amax, int64_t index);
  void weight_scale_from_amax(const Tensor& amax, int64_t index);
  // codes (n) = this version's cast of piece (n f32 master values, a part of the weight), with the weight's
  // scale; its amax and saturation count are recorded as this rank's part (precision.fp8.reduce_amax
  // completes them). Every rank calls it for every FP8 weight, with an empty piece where it keeps none.
  void cast_weight_piece(const Tensor& piece, Tensor codes);
  // The all-gathered codes (OC, IC) of the whole weight serve this weight version (on CUDA with their
  // transposed copy, made here).
  void adopt_weight_codes(const Tensor& codes);
  // A weight given as codes (a sharded master) serves only once adopted for this version: else an error.
  void check_codes_adopted(const Tensor& w) const;
};

// x (..., IC) f32; w (OC, IC) f32; b (OC) or nullptr  ->  (..., OC). Same contract as linear().
// On CUDA: x, w, b bf16 (w's gradient f32, x's bf16), IC, OC and the rows of x multiples of 16.
// Forward: y = (q(x) @ q(w)^T) * (sx_inv * sw_inv) + b with q(.) in the forward format (E4M3).
// Backward: dx += (q(dy) @ q(w)) * (sdy_inv * sw_inv), dw += (q(dy)^T @ q(x)) * (sdy_inv * sx_inv)
// with q(dy) in the backward format (E5M2 for hybrid); db += column sums of the unquantized dy. On CUDA
// dy may be a pending GELU backward left by fp8_linear_gelu (see there), applied in dy's cast.
// Input amax is recorded only while a tape records (training), output-gradient amax in backward,
// weight amax once per weight version.
// activation_storage fp8: the tape node keeps the E4M3 codes of x (1 byte/element) instead of x;
// bf16: it keeps x as it is (f32 on the CPU, bf16 on the GPU) and re-quantizes it in backward with
// the forward's scale, which gives the same codes.
//
// serve_input (FP8 storage only): x's value is dropped after the forward and served to whoever reads it
// later (value_of, autograd/tape.h) from this linear's saved codes, dequantized: one FP8 copy of x for
// both readers. The block uses it for attention's output, which the projection's wgrad and attention's
// backward (its delta = rowsum(dO * O)) both read. Without a tape, or with bf16 storage, it does nothing.
// bias_at (ops.h, LinearBias): in_reader leaves b out of the output (the residual add after it adds it).
Var fp8_linear(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, bool serve_input = false,
               LinearBias bias_at = LinearBias::in_gemm);

// fp8_linear(gelu(pre), w, b, st), bit for bit (the FP8 MLP's second linear with its GELU): on CUDA
// the GELU runs inside the input's FP8 cast (kernels/fp8_cast.cuh, Fp8CastInput::gelu), so gelu(pre)
// is never written or read in bf16; backward computes d gelu(pre) with the dgrad GEMM, and wgrad reads
// the forward's transposed codes. When pre has no gradient yet and its producer is an FP8 linear on CUDA
// (which marks its output so), d gelu(pre) is left as pre's pending gradient (autograd/variable.h,
// PendingGrad) and the producer's backward applies the GELU backward inside its dy cast
// (Fp8CastInput::dgelu), so pre's gradient is never written; anything else that reads it first gets it
// written by the GELU backward kernel. Otherwise the GELU backward kernel adds into pre's gradient here.
// The node keeps pre (bf16), or with activation_storage fp8_all its FP8 codes, the forward then running
// on their round trip, written over pre's value in place, as gelu(pre, store_fp8 = true) does; fp8_all
// then keeps no codes of gelu(pre) either: backward casts them again from the restored round trip with
// the forward's scale (the same codes). The CPU emulation and activation_storage
// bf16 (which would keep gelu(pre) to re-cast it in backward) run the composition itself, with
// gelu's store_fp8 = (activation_storage == fp8_all).
// pre is taken by value: a caller that moves in its last handle (no other Var or view shares pre's
// storage) leaves no reader of pre after the op, so on CUDA, where the cast reads pre's codes, the round
// trip is not written over pre at all (2 bytes per element less; the block's MLP does this).
Var fp8_linear_gelu(Var pre, const Var& w, const Var& b, Fp8LinearState& st, LinearBias bias_at = LinearBias::in_gemm);

// fp8_linear(layernorm(x, ln_w, ln_b), w, b, st), bit for bit (an FP8 qkv or fc with the LayerNorm
// before it): on CUDA a statistics kernel writes LayerNorm's (mean, rstd) and the normalization runs
// inside the input's FP8 cast (kernels/fp8_cast.cuh, Fp8CastInput::layernorm), so layernorm(x) is never
// written or read in bf16; backward computes d layernorm(x) with the dgrad GEMM into a temporary, and
// the LayerNorm backward kernel adds x's, ln_w's and ln_b's gradients; wgrad reads the forward's
// transposed codes. The node keeps x (the residual stream, which the unfused LayerNorm keeps too), mean,
// rstd, ln_w and ln_b; there is no LayerNorm output to release for recompute. With fp8_all the node keeps
// no codes of layernorm(x) either: backward casts them again from x and the statistics with the
// forward's scale (the same codes), so the linear saves nothing beyond what LayerNorm's backward reads. The CPU emulation and
// activation_storage bf16 (which would keep layernorm(x) to re-cast it in backward) run the composition.
// x_stats (optional): x's RowStats as add() computed them with x (the residual add before this LayerNorm), used on
// CUDA instead of a statistics pass over x (the same bits); ignored where undefined and on the CPU.
Var fp8_linear_ln(const Var& x, const Var& ln_w, const Var& ln_b, const Var& w, const Var& b, Fp8LinearState& st,
                  const RowStats* x_stats = nullptr);

// fp8_linear_ln's input cast done ahead by the residual add that writes x: x_stats->cast_ahead, set before
// add(a, b, x_stats), makes the add's kernel write layernorm(x, ln_w, ln_b)'s FP8 codes, with st's input scale and
// into its statistics, in the pass that writes x and its LayerNorm statistics (kernels/layernorm.cuh,
// add_layernorm_cast), and fp8_linear_ln(x, ln_w, ln_b, ..., st, x_stats) takes them instead of casting x again:
// the same codes, one read of x fewer. It applies on CUDA with activation_storage fp8_all and a scale known before
// the cast (delayed scaling), where the linear keeps no transposed codes of its input (x needs a gradient, or no
// tape records); fp8_ln_cast_ahead returns null where the state rules it out, and add() casts nothing where the
// rest does.
struct Fp8LnCastAhead {
  Fp8LinearState* st = nullptr;
  Var ln_w, ln_b;
  Tensor codes;  // (rows, C), written by add(); the linear takes them (moves them out)
};
std::shared_ptr<Fp8LnCastAhead> fp8_ln_cast_ahead(Fp8LinearState& st, const Var& ln_w, const Var& ln_b);

// The FP8 head and its loss a chunk of tokens at a time, as lm_head_loss (ops/ops.h) is for BF16: the mean
// cross-entropy of fp8_linear(h, w) (no bias; w (Vp, C), the tied embedding) against targets (B, T), over chunks of
// chunk_rows tokens (B * T need not divide), so the (B * T, Vp) logits never exist at once. Each chunk runs
// fp8_linear and cross_entropy on a tape of its own and its backward right away, for the seed grad_scale that the
// caller's tape must then use (Tape::require_seed): d(w) goes into w's gradient during the forward pass and d(h)
// into h's during the backward pass. With delayed scaling the statistics accumulate over the chunks as over one
// cast of the whole tensor (the same scales, so the same codes); with current scaling each chunk's cast takes its
// own amax. The GEMMs see fewer rows, and d(w) is summed chunk by chunk.
Var fp8_lm_head_loss(const Var& h, const Var& w, Fp8LinearState& st, const Tensor& targets, int64_t vocab_size,
                     int64_t chunk_rows, float grad_scale = 1.0f);

}  // namespace fp8t
