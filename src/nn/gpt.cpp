// GPT-2 model: parameter layout, initialisation and forward.
#include "nn/gpt.h"

#include <cmath>

#include "ops/ops.h"

namespace fp8t {

std::vector<ParamSpec> gpt2_param_specs(const ModelConfig& cfg) {
  const int64_t C = cfg.d_model, Vp = cfg.padded_vocab(), T = cfg.seq_len;
  std::vector<ParamSpec> s;
  s.push_back({"wte", {Vp, C}, true});
  s.push_back({"wpe", {T, C}, true});
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    s.push_back({p + "ln_1.weight", {C}, false});
    s.push_back({p + "ln_1.bias", {C}, false});
    s.push_back({p + "attn.c_attn.weight", {3 * C, C}, true});
    s.push_back({p + "attn.c_attn.bias", {3 * C}, false});
    s.push_back({p + "attn.c_proj.weight", {C, C}, true});
    s.push_back({p + "attn.c_proj.bias", {C}, false});
    s.push_back({p + "ln_2.weight", {C}, false});
    s.push_back({p + "ln_2.bias", {C}, false});
    s.push_back({p + "mlp.c_fc.weight", {4 * C, C}, true});
    s.push_back({p + "mlp.c_fc.bias", {4 * C}, false});
    s.push_back({p + "mlp.c_proj.weight", {C, 4 * C}, true});
    s.push_back({p + "mlp.c_proj.bias", {C}, false});
  }
  s.push_back({"ln_f.weight", {C}, false});
  s.push_back({"ln_f.bias", {C}, false});
  return s;
}

GPT::GPT(const ModelConfig& cfg, Device device, DType compute_dtype, int64_t pad_multiple) : cfg_(cfg) {
  FP8T_CHECK(cfg.arch == "gpt2", "model.arch '{}' is not supported: use gpt2", cfg.arch);
  FP8T_CHECK(cfg.d_model % cfg.n_head == 0, "model.d_model {} must divide by model.n_head {}", cfg.d_model,
             cfg.n_head);
  params_ = std::make_unique<ParameterStore>(gpt2_param_specs(cfg), device, compute_dtype, pad_multiple);
}

void GPT::init(uint64_t seed) {
  // Initialise on the host in f32, then copy: identical values on every device and rank.
  Tensor host = Tensor::zeros({params_->padded_numel()}, DType::f32, Device::cpu(), MemCategory::workspace);
  float* h = host.data<float>();
  std::mt19937_64 rng(seed);
  const float resid_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  for (const auto& s : params_->specs()) {
    float* p = h + s.offset;
    const bool is_weight = s.name.ends_with(".weight") || s.name == "wte" || s.name == "wpe";
    const bool is_norm = s.name.find("ln_") != std::string::npos;
    if (is_norm) {
      if (s.name.ends_with(".weight")) std::fill(p, p + s.numel(), 1.0f);
      continue;
    }
    if (!is_weight) continue;  // biases stay 0
    const bool residual = s.name.ends_with("attn.c_proj.weight") || s.name.ends_with("mlp.c_proj.weight");
    std::normal_distribution<float> dist(0.0f, residual ? resid_std : 0.02f);
    int64_t n = s.numel();
    if (s.name == "wte") n = static_cast<int64_t>(cfg_.vocab_size) * cfg_.d_model;  // padded rows stay 0
    for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
  }
  params_->master().copy_from(host.to(params_->device(), MemCategory::workspace));
  params_->sync_compute();
}

Var GPT::block(int l, const Var& x) {
  const ParameterStore& P = *params_;
  const std::string p = "h." + std::to_string(l) + ".";
  Var h = layernorm(x, P.var(p + "ln_1.weight"), P.var(p + "ln_1.bias"));
  h = linear(h, P.var(p + "attn.c_attn.weight"), P.var(p + "attn.c_attn.bias"));
  h = attention(h, cfg_.n_head);
  h = linear(h, P.var(p + "attn.c_proj.weight"), P.var(p + "attn.c_proj.bias"));
  Var x1 = add(x, h);
  h = layernorm(x1, P.var(p + "ln_2.weight"), P.var(p + "ln_2.bias"));
  h = linear(h, P.var(p + "mlp.c_fc.weight"), P.var(p + "mlp.c_fc.bias"));
  h = gelu(h);
  h = linear(h, P.var(p + "mlp.c_proj.weight"), P.var(p + "mlp.c_proj.bias"));
  return add(x1, h);
}

Var GPT::hidden(const Tensor& tokens, bool recompute) {
  FP8T_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::i32, "tokens must be i32 (B, T), got {}",
             tokens.str());
  FP8T_CHECK(tokens.dim(1) <= cfg_.seq_len, "sequence length {} exceeds model.seq_len {}", tokens.dim(1),
             cfg_.seq_len);
  const ParameterStore& P = *params_;
  Var x = embedding(tokens, P.var("wte"), P.var("wpe"));
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (recompute && grad_enabled())
      x = checkpoint([this, l](const Var& in) { return block(l, in); }, x);
    else
      x = block(l, x);
  }
  return layernorm(x, P.var("ln_f.weight"), P.var("ln_f.bias"));
}

Var GPT::logits(const Tensor& tokens, bool recompute) {
  return linear(hidden(tokens, recompute), params_->var("wte"), nullptr);
}

Var GPT::loss(const Tensor& tokens, const Tensor& targets, bool recompute) {
  return cross_entropy(logits(tokens, recompute), targets, cfg_.vocab_size);
}

int64_t GPT::num_parameters() const {
  return params_->numel() - static_cast<int64_t>(cfg_.padded_vocab() - cfg_.vocab_size) * cfg_.d_model;
}

double GPT::flops_per_token() const {
  // 6N for the matmuls of forward+backward (N counts every parameter, as the peer does)
  // plus 12 L C T for attention scores and values.
  return 6.0 * static_cast<double>(params_->numel()) +
         12.0 * cfg_.n_layer * static_cast<double>(cfg_.d_model) * cfg_.seq_len;
}

}  // namespace fp8t
