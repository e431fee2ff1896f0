// BlockPlan: the fusion and storage rules of a block, from its linears' FP8 states.
#include "nn/block_plan.h"

namespace fp8t {

BlockPlan plan_block(const std::array<Fp8LinearState*, 4>& fp8) {
  BlockPlan p;
  p.fp8 = fp8;
  auto storage_is = [&](LinearKind k, ActivationStorage s) {
    const Fp8LinearState* st = p.state(k);
    return st && st->cfg.activation_storage == s;
  };
  auto fp8_all = [&](LinearKind k) { return storage_is(k, ActivationStorage::fp8_all); };
  // An FP8 linear normalizes its input inside its cast unless its bf16 storage would keep the LayerNorm
  // output anyway.
  auto stores_fp8 = [&](LinearKind k) { return p.state(k) && !storage_is(k, ActivationStorage::bf16); };
  p.ln_1_in_qkv_cast = stores_fp8(LinearKind::qkv);
  p.ln_2_in_fc_cast = stores_fp8(LinearKind::fc);
  p.attention_fp8 = fp8_all(LinearKind::qkv);
  p.proj_serves_input = fp8_all(LinearKind::proj);
  p.gelu_input_fp8 = fp8_all(LinearKind::fc) || fp8_all(LinearKind::fc2);
  if (!p.state(LinearKind::fc) && !p.state(LinearKind::fc2))
    p.mlp = BlockPlan::Mlp::fused_bf16;
  // fc2 casts gelu(h) straight from h when its own storage setting is the one the GELU would use: bf16
  // storage keeps its input, so no fusion.
  else if (stores_fp8(LinearKind::fc2) && p.gelu_input_fp8 == fp8_all(LinearKind::fc2))
    p.mlp = BlockPlan::Mlp::gelu_in_fc2_cast;
  else
    p.mlp = BlockPlan::Mlp::gelu_op;
  return p;
}

}  // namespace fp8t
