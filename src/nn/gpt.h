// GPT-2: token + position embedding, n_layer pre-LN blocks (attention, MLP), final LayerNorm and
// an lm_head tied to the token embedding. Parameters live in one ParameterStore.
#pragma once
#include <memory>
#include <random>

#include "config/config.h"
#include "nn/params.h"

namespace fp8t {

// The linears of a block and the head; FP8 selection (precision.fp8.layers) names these kinds.
enum class LinearKind { qkv, proj, fc, fc2, lm_head };

class GPT {
 public:
  GPT(const ModelConfig& cfg, Device device, DType compute_dtype, int64_t pad_multiple = 1);

  // GPT-2 init: weights N(0, 0.02), residual projections (proj, fc2) N(0, 0.02/sqrt(2 n_layer)),
  // biases 0, LayerNorm weight 1; padded vocabulary rows 0. Deterministic in `seed`.
  void init(uint64_t seed);

  // tokens, targets: i32 (B, T) on the model's device. Returns the scalar mean loss (recorded on
  // the current tape when one is active). `recompute` keeps only block inputs for backward.
  Var loss(const Tensor& tokens, const Tensor& targets, bool recompute = false);
  // Logits (B, T, Vp) for sampling/evaluation.
  Var logits(const Tensor& tokens, bool recompute = false);

  ParameterStore& params() { return *params_; }
  const ModelConfig& config() const { return cfg_; }
  // Parameters counted as in the GPT-2 paper (padded vocabulary rows excluded).
  int64_t num_parameters() const;
  // Model FLOPs per token for training: 6N + 12 L C T, as the PyTorch peer counts them.
  double flops_per_token() const;

 private:
  Var block(int layer, const Var& x);
  Var hidden(const Tensor& tokens, bool recompute);  // final LayerNorm output (B, T, C)

  ModelConfig cfg_;
  std::unique_ptr<ParameterStore> params_;
};

std::vector<ParamSpec> gpt2_param_specs(const ModelConfig& cfg);

}  // namespace fp8t
