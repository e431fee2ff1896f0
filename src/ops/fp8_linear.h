// FP8 linear: y = x @ w^T + b with all three GEMMs (fprop, dgrad, wgrad) on FP8 operands and FP32
// accumulation, per-tensor scales from Fp8TensorMeta, and the FP8 weight copy cast once per
// optimizer step. On the CPU it is emulated exactly: the GEMM multiplies the decoded FP8 values
// (products of two FP8 values are exact in f32) with f32 accumulation and scales the result by
// scale_inv_a * scale_inv_b, the way cuBLASLt applies its A/B scale pointers.
#pragma once
#include <cstdint>
#include <string>

#include "autograd/tape.h"
#include "config/config.h"
#include "fp8/quantize.h"
#include "fp8/scaling.h"

namespace fp8t {

// Everything one FP8 linear keeps between calls. It must outlive every tape that recorded the op
// (backward closures hold a pointer to it): the model owns one per FP8 linear.
struct Fp8LinearState {
  std::string name;   // e.g. "h.3.mlp.c_fc": metrics and NaN/Inf reports
  Fp8Config cfg;
  Fp8FormatRecipe formats;
  Fp8TensorMeta input, weight, grad_output;

  // Bumped after every optimizer step; the cached FP8 weight is valid for one version.
  uint64_t weight_version = 0;
  Fp8Tensor weight_fp8;            // (OC, IC) codes in MemCategory::fp8_cache
  uint64_t cached_version = 0;
  bool cache_valid = false;
  int64_t weight_casts = 0;        // how many times the weight was cast (tests, metrics)

  Fp8LinearState(std::string name, const Fp8Config& cfg);

  // The FP8 copy of w for the current weight_version, cast (and its amax recorded) on first use.
  const Fp8Tensor& weight_for_step(const Tensor& w);
  // After the optimizer step: new weight version, and every meta enters this step's amax into its
  // history and updates its scale. Call once per optimizer step (also for a skipped step).
  void on_optimizer_step();
  // ||dequant(q(w)) - w|| / ||w|| for the scale the next weight cast will use (no state change).
  double weight_error(const Tensor& w) const;
};

// x (..., IC) f32; w (OC, IC) f32; b (OC) or nullptr  ->  (..., OC). Same contract as linear().
// Forward: y = (q(x) @ q(w)^T) * (sx_inv * sw_inv) + b with q(.) in the forward format (E4M3).
// Backward: dx += (q(dy) @ q(w)) * (sdy_inv * sw_inv), dw += (q(dy)^T @ q(x)) * (sdy_inv * sx_inv)
// with q(dy) in the backward format (E5M2 for hybrid); db += column sums of the unquantized dy.
// Input amax is recorded only while a tape records (training), output-gradient amax in backward,
// weight amax once per weight version.
// activation_storage fp8: the tape node keeps the E4M3 codes of x (1 byte/element) instead of x;
// bf16: it keeps x as it is (f32 on the CPU, bf16 on the GPU) and re-quantizes it in backward with
// the forward's scale, which gives the same codes.
Var fp8_linear(const Var& x, const Var& w, const Var& b, Fp8LinearState& st);

}  // namespace fp8t
