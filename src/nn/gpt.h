// GPT-2: token + position embedding, n_layer pre-LN blocks (attention, MLP), final LayerNorm and
// an lm_head tied to the token embedding. Parameters live in one ParameterStore.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <random>

#include "config/config.h"
#include "nn/block_plan.h"
#include "nn/params.h"
#include "ops/fp8_linear.h"

namespace fp8t {

// The collectives GPT::publish_weights needs, from the trainer's communicator (nn does not see dist). Both
// work in place on tensors of the model's device; empty functions stand for a single rank.
struct WeightCollectives {
  std::function<void(Tensor&)> all_reduce_max;  // f32
  // Rank r contributes elements [cuts[r], cuts[r + 1]) and every rank receives the whole tensor.
  std::function<void(Tensor&, const std::vector<int64_t>& cuts)> all_gather_v;
};

class GPT {
 public:
  // precision.compute fp8 runs the linears selected by precision.fp8 (kinds, first/last blocks in
  // high precision) through fp8_linear, each with its own scaling state. grad_shard: which gradients
  // the ParameterStore allocates (ZeRO stage 2: one rank's shard); master_shard: which part of the f32
  // master it keeps (ZeRO stages 1 and 2: one rank's shard; see publish_weights), taken only where the
  // parameters are published narrower than f32 (a compute dtype below f32, or FP8 weights): otherwise the
  // master is the compute copy, and the caller all-gathers it whole (ParameterStore::master_sharded() false).
  GPT(const ModelConfig& cfg, Device device, DType compute_dtype, int64_t pad_multiple = 1,
      const PrecisionConfig& precision = {}, FlatShard grad_shard = {}, FlatShard master_shard = {});

  // GPT-2 init: weights N(0, 0.02), residual projections (proj, fc2) N(0, 0.02/sqrt(2 n_layer)),
  // biases 0, LayerNorm weight 1; padded vocabulary rows 0. Deterministic in `seed`.
  void init(uint64_t seed);

  // tokens, targets: i32 (B, T) on the model's device. Returns the scalar mean loss (recorded on
  // the current tape when one is active). `recompute` keeps only block inputs for backward.
  // grad_scale: the seed the caller will pass to Tape::backward (the head's gradients are computed
  // during the forward pass for it; see lm_head_loss).
  Var loss(const Tensor& tokens, const Tensor& targets, bool recompute = false, float grad_scale = 1.0f);
  // Tokens per chunk of the head and loss (BF16 or FP8 head).
  int64_t head_chunk_rows() const;
  // Logits (B, T, Vp) for sampling/evaluation.
  Var logits(const Tensor& tokens, bool recompute = false);
  // train.recompute: layernorm: the blocks' LayerNorm outputs are released after the forward pass
  // used them and recomputed (bit-identically) by the backward closures that read them.
  void set_recompute_layernorm(bool on) { recompute_layernorm_ = on; }

  ParameterStore& params() { return *params_; }
  const ModelConfig& config() const { return cfg_; }
  // Parameters counted as in the GPT-2 paper (padded vocabulary rows excluded).
  int64_t num_parameters() const;
  // Model FLOPs per token for training: 6N + 12 L C T, as the PyTorch peer counts them.
  double flops_per_token() const;

  // ---- FP8 (all no-ops without FP8 linears)
  bool fp8_enabled() const { return !fp8_.empty(); }
  // Names of the FP8 linears, e.g. "h.0.attn.c_attn", "lm_head", in forward order.
  std::vector<std::string> fp8_layers() const;
  Fp8LinearState* fp8_state(const std::string& name);  // null if that linear is not FP8
  // After each optimizer step: new FP8 weight versions, amax histories roll, scales update.
  void on_optimizer_step();
  // With a sharded master (nn/params.h), after init, load and every on_optimizer_step(): each rank casts the
  // master it keeps into the compute copies and into the FP8 linears' weight codes (with the weight's scale
  // for this version; current scaling first max-reduces the weight amax over the ranks), then the copies
  // and the codes are all-gathered and adopted: the ranks exchange 2 bytes (BF16) or 1 byte (FP8 codes) per
  // parameter, never the f32 master. A no-op when the master is whole (the FP8 weights are then cast from it
  // on first use).
  void publish_weights(const WeightCollectives& collectives);
  // Before on_optimizer_step(): this step's amax of every FP8 tensor (input, weight, grad_output per layer)
  // max-reduced over data-parallel ranks by all_reduce_max where given (fp8/recipe.h, reduce_step_amax), and
  // "h.3.mlp.c_fc input amax is inf, ..." for the non-finite ones; empty when all are finite.
  std::string reduce_fp8_amax(const AmaxAllReduce& all_reduce_max = nullptr);
  // {layer: {input|weight|grad_output: {amax, scale, saturated}, weight_rel_error?}} (last step).
  nlohmann::json fp8_stats(bool with_weight_error) const;
  // Scales and amax histories of every FP8 tensor, for checkpoints (a resumed run then casts with
  // the scales the uninterrupted run would have used). Loading checks the layer names match.
  nlohmann::json fp8_state() const;
  void load_fp8_state(const nlohmann::json& state);

 private:
  // x_stats: x's LayerNorm statistics (and ln_1's output) where the previous block's last add computed them (or
  // null); out_stats (or null): what this block's last add leaves for the LayerNorm after it, as the caller asked
  // (RowStats: the next block's FP8 ln_1 cast ahead, or a bf16 LayerNorm's weight and bias).
  Var block(int layer, const Var& x, RowStats* x_stats = nullptr, RowStats* out_stats = nullptr);
  // LayerNorm (parameters `ln`, e.g. "h.3.ln_1") then the linear `kind` (parameters `linear`), fused into the
  // linear's FP8 cast when the plan says so (with x's statistics from x_stats where given), else taking the
  // LayerNorm's output from x_stats where the add wrote it; a separate LayerNorm output is released for recompute
  // when train.recompute is layernorm.
  Var layernorm_linear(LinearKind kind, int layer, const Var& x, const std::string& ln, const std::string& linear,
                       RowStats* x_stats = nullptr);
  // fc -> GELU -> fc2 after ln_2, as the plan fuses them; x_stats as in layernorm_linear. fc2 leaves its bias to the
  // residual add after it (LinearBias::in_reader).
  Var mlp(int layer, const Var& x, RowStats* x_stats = nullptr);
  // Asks the add that makes a LayerNorm's input (stats, before add()) for that LayerNorm's work in its pass: the
  // FP8 cast of the linear `kind` of block `layer` where it runs inside that cast, else the LayerNorm `ln`'s bf16
  // output, counted under `role`.
  void ask_for_layernorm(RowStats& stats, LinearKind kind, int layer, const std::string& ln, const char* role) const;
  // Whether block `layer`'s `kind` linear (qkv or fc) runs its LayerNorm inside its FP8 cast: the add before it
  // then computes its input's statistics.
  bool ln_in_cast(LinearKind kind, int layer) const;
  // linear() or fp8_linear() for the linear `kind` of block `layer` (-1 for the head).
  // serve_input: an FP8 linear serves x to x's other readers from its FP8 codes (fp8_linear.h).
  Var dense(LinearKind kind, int layer, const Var& x, const Var& w, const Var& b, bool serve_input = false,
            LinearBias bias_at = LinearBias::in_gemm);
  Var hidden(const Tensor& tokens, bool recompute);  // final LayerNorm output (B, T, C)

  ModelConfig cfg_;
  bool recompute_layernorm_ = false;
  std::unique_ptr<ParameterStore> params_;
  PrecisionConfig precision_;
  // FP8 states (stable addresses: tape nodes point at them) and each block's plan, which points at its own.
  std::vector<std::unique_ptr<Fp8LinearState>> fp8_;
  std::vector<BlockPlan> plans_;
  Fp8LinearState* fp8_head_ = nullptr;
  std::unique_ptr<Fp8DeviceArena> fp8_arena_;  // CUDA only: the device slots of every FP8 linear
};

std::vector<ParamSpec> gpt2_param_specs(const ModelConfig& cfg);

}  // namespace fp8t
