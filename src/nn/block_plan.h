// How one transformer block runs, decided once when the model is built: which of its linears are FP8 (each
// with its scaling state), which LayerNorms and GELUs are fused into an FP8 cast, and what is stored for
// backward. GPT::block then states only the math (LayerNorm -> attention -> residual -> LayerNorm -> MLP ->
// residual); another block type reuses the plan and its rules.
#pragma once
#include <array>

#include "ops/fp8_linear.h"

namespace fp8t {

// The linears of a block and the head; FP8 selection (precision.fp8.layers) names these kinds.
enum class LinearKind { qkv, proj, fc, fc2, lm_head };

struct BlockPlan {
  std::array<Fp8LinearState*, 4> fp8{};  // by LinearKind qkv, proj, fc, fc2; null: a bf16 (or f32) linear
  // qkv's and fc's FP8 casts normalize their input themselves (fp8_linear_ln): no LayerNorm output exists.
  bool ln_1_in_qkv_cast = false;
  bool ln_2_in_fc_cast = false;
  bool attention_fp8 = false;      // attention keeps its qkv input as FP8 codes (fp8_all)
  bool proj_serves_input = false;  // attention's output is kept once, as the projection's FP8 codes
  // The MLP: fc, GELU, fc2 as one op (both linears in high precision); fc2's FP8 cast applying the GELU to
  // its input (fp8_linear_gelu); or a GELU op between the two linears.
  enum class Mlp { fused_bf16, gelu_in_fc2_cast, gelu_op } mlp = Mlp::fused_bf16;
  bool gelu_input_fp8 = false;  // the GELU input is stored as FP8 (gelu(x, store_fp8), fp8_linear_gelu)

  Fp8LinearState* state(LinearKind k) const { return fp8[static_cast<size_t>(k)]; }
};

// The plan for a block whose linears have these FP8 states (null where the linear is not FP8).
BlockPlan plan_block(const std::array<Fp8LinearState*, 4>& fp8);

}  // namespace fp8t
