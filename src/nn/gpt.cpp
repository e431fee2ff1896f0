// GPT-2 model: parameter layout, initialisation and forward.
#include "nn/gpt.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/finite_watch.h"
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

namespace {
// In LinearKind order: BlockPlan::fp8 is indexed by the kind.
constexpr std::array<LinearKind, 4> kBlockKinds{LinearKind::qkv, LinearKind::proj, LinearKind::fc, LinearKind::fc2};
constexpr std::array<const char*, 4> kBlockLinearNames{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

const char* kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::qkv: return "qkv";
    case LinearKind::proj: return "proj";
    case LinearKind::fc: return "fc";
    case LinearKind::fc2: return "fc2";
    case LinearKind::lm_head: return "lm_head";
  }
  return "?";
}

// The parameter holding an FP8 linear's weight: "<layer>.weight", or the tied wte for the head.
std::string fp8_weight_param(const std::string& layer) { return layer == "lm_head" ? "wte" : layer + ".weight"; }
}  // namespace

GPT::GPT(const ModelConfig& cfg, Device device, DType compute_dtype, int64_t pad_multiple,
         const PrecisionConfig& precision, FlatShard grad_shard, FlatShard master_shard)
    : cfg_(cfg), precision_(precision) {
  FP8T_CHECK(cfg.arch == "gpt2", "model.arch '{}' is not supported: use gpt2", cfg.arch);
  FP8T_CHECK(cfg.d_model % cfg.n_head == 0, "model.d_model {} must divide by model.n_head {}", cfg.d_model,
             cfg.n_head);
  const DType grad_dtype = precision.bf16_grads() ? DType::bf16 : DType::f32;
  plans_.assign(static_cast<size_t>(cfg.n_layer), plan_block({}));
  if (precision.compute != ComputeMode::fp8) {
    params_ = std::make_unique<ParameterStore>(gpt2_param_specs(cfg), device, compute_dtype, pad_multiple, grad_dtype,
                                               std::vector<std::string>{}, grad_shard,
                                               compute_dtype != DType::f32 ? master_shard : FlatShard{});
    return;
  }
  const Fp8Config& f = precision.fp8;
  auto listed = [&](LinearKind k) {
    return std::find(f.layers.begin(), f.layers.end(), kind_name(k)) != f.layers.end();
  };
  for (int l = f.bf16_first_blocks; l < cfg.n_layer - f.bf16_last_blocks; ++l) {
    std::array<Fp8LinearState*, 4> states{};
    for (size_t k = 0; k < kBlockKinds.size(); ++k) {
      if (!listed(kBlockKinds[k])) continue;
      fp8_.push_back(std::make_unique<Fp8LinearState>(fmt::format("h.{}.{}", l, kBlockLinearNames[k]), f));
      states[k] = fp8_.back().get();
    }
    plans_[static_cast<size_t>(l)] = plan_block(states);
  }
  if (listed(LinearKind::lm_head)) {
    fp8_.push_back(std::make_unique<Fp8LinearState>("lm_head", f));
    fp8_head_ = fp8_.back().get();
  }
  // A block linear's weight feeds only its FP8 GEMMs, which cast it from the master: no compute copy.
  // The head's weight is the tied wte, which the embedding reads in the compute dtype.
  std::vector<std::string> master_only;
  for (const auto& st : fp8_)
    if (st.get() != fp8_head_) master_only.push_back(fp8_weight_param(st->name));
  params_ = std::make_unique<ParameterStore>(gpt2_param_specs(cfg), device, compute_dtype, pad_multiple, grad_dtype,
                                             master_only, grad_shard,
                                             compute_dtype != DType::f32 || !master_only.empty() ? master_shard
                                                                                               : FlatShard{},
                                             fp8_dtype(Fp8RoleFormats::from(f.format).forward));
  // CUDA: all FP8 scaling state in one device buffer, moved once per step (fp8/device_meta.h).
  if (device.is_cuda() && !fp8_.empty()) {
    std::vector<std::pair<Fp8DeviceState*, Fp8Metas>> states;
    for (const auto& st : fp8_) states.emplace_back(&st->device, st->metas());
    fp8_arena_ = std::make_unique<Fp8DeviceArena>();
    fp8_arena_->init(device, std::move(states));
  }
}

Var GPT::dense(LinearKind kind, int layer, const Var& x, const Var& w, const Var& b, bool serve_input,
               LinearBias bias_at) {
  Fp8LinearState* st = kind == LinearKind::lm_head ? fp8_head_ : plans_[static_cast<size_t>(layer)].state(kind);
  return st ? fp8_linear(x, w, b, *st, serve_input, bias_at) : linear(x, w, b, bias_at);
}

std::vector<std::string> GPT::fp8_layers() const {
  std::vector<std::string> names;
  for (const auto& st : fp8_) names.push_back(st->name);
  return names;
}

Fp8LinearState* GPT::fp8_state(const std::string& name) {
  for (const auto& st : fp8_)
    if (st->name == name) return st.get();
  return nullptr;
}

void GPT::on_optimizer_step() {
  for (const auto& st : fp8_) st->on_optimizer_step();
  if (fp8_arena_) fp8_arena_->upload();  // the new scales and zeroed statistics, one copy
}

void GPT::publish_weights(const WeightCollectives& c) {
  ParameterStore& P = *params_;
  if (!P.master_sharded()) return;
  P.sync_compute();
  const int64_t m0 = P.master_begin(), m1 = m0 + P.master().numel();
  struct Piece {  // the part of an FP8 weight this rank keeps the master of
    Fp8LinearState* st;
    size_t param;
    int64_t begin, end;  // flat elements, begin == end where none
  };
  std::vector<Piece> pieces;
  bool from_tensor = false;
  for (const auto& st : fp8_) {
    if (st.get() == fp8_head_) continue;  // the tied wte has a compute copy, cast from it on first use
    const std::string name = fp8_weight_param(st->name);
    size_t i = 0;
    while (P.specs()[i].name != name) ++i;
    const ParamSpec& s = P.specs()[i];
    const int64_t b = std::clamp(s.offset, m0, m1), e = std::clamp(s.offset + s.numel(), m0, m1);
    pieces.push_back({st.get(), i, b, std::max(b, e)});
    from_tensor = from_tensor || st->weight.recipe->scale_from_tensor();
  }
  auto master_of = [&](const Piece& p) {  // (an empty view where this rank keeps none of the weight)
    return P.master().slice_flat(p.end > p.begin ? p.begin - m0 : 0, {p.end - p.begin});
  };
  if (from_tensor) {  // current scaling: the scale of the whole weight, from its amax over every rank's part
    Tensor amax = Tensor::zeros({static_cast<int64_t>(pieces.size())}, DType::f32, P.device(), MemCategory::comm);
    for (size_t k = 0; k < pieces.size(); ++k)
      pieces[k].st->weight_piece_amax(master_of(pieces[k]), amax, static_cast<int64_t>(k));
    if (c.all_reduce_max) c.all_reduce_max(amax);
    for (size_t k = 0; k < pieces.size(); ++k)
      if (pieces[k].st->weight.recipe->scale_from_tensor())
        pieces[k].st->weight_scale_from_amax(amax, static_cast<int64_t>(k));
  }
  for (const Piece& p : pieces) {
    const ParamSpec& s = P.specs()[p.param];
    const Tensor codes = P.var(p.param)->value.slice_flat(p.end > p.begin ? p.begin - s.offset : 0, {p.end - p.begin});
    p.st->cast_weight_piece(master_of(p), codes);
  }
  if (c.all_gather_v) {
    if (P.has_compute_copy()) c.all_gather_v(P.compute(), P.compute_cuts());
    if (P.codes().defined()) c.all_gather_v(P.codes(), P.codes_cuts());
  }
  for (const Piece& p : pieces) p.st->adopt_weight_codes(P.var(p.param)->value);
}

std::string GPT::reduce_fp8_amax(const AmaxAllReduce& all_reduce_max) {
  std::vector<Fp8TensorMeta*> metas;
  metas.reserve(3 * fp8_.size());
  for (const auto& st : fp8_) {
    st->collect_device_stats();  // CUDA: this step's device amaxes to the host (the first call copies them all)
    for (Fp8TensorMeta* m : {&st->input, &st->weight, &st->grad_output}) metas.push_back(m);
  }
  static constexpr const char* kRoles[] = {"input", "weight", "grad_output"};  // metas' order within a linear
  const auto name_of = [this](size_t i) { return fp8_[i / 3]->name + " " + kRoles[i % 3]; };
  return reduce_step_amax(metas, name_of, all_reduce_max);
}

nlohmann::json GPT::fp8_stats(bool with_weight_error) const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& st : fp8_) {
    nlohmann::json layer;
    const std::pair<const char*, const Fp8TensorMeta*> metas[] = {
        {"input", &st->input}, {"weight", &st->weight}, {"grad_output", &st->grad_output}};
    for (const auto& [what, m] : metas) {
      // JSON has no inf/NaN: a non-finite amax is written as a string.
      nlohmann::json amax = std::isfinite(m->last_amax) ? nlohmann::json(m->last_amax)
                                                        : nlohmann::json(fmt::format("{}", m->last_amax));
      layer[what] = {{"amax", amax}, {"scale", m->scale}, {"saturated", m->last_saturated}};
    }
    if (with_weight_error) {
      // A sharded master's weight is codes: the error of this rank's part of the master (none if it has none).
      const ParamSpec* s = nullptr;
      for (const ParamSpec& p : params_->specs())
        if (p.name == fp8_weight_param(st->name)) s = &p;
      const Tensor& w = params_->var(fp8_weight_param(st->name))->value;
      const int64_t m0 = params_->master_begin(), m1 = m0 + params_->master().numel();
      const int64_t b = std::clamp(s->offset, m0, m1), e = std::clamp(s->offset + s->numel(), m0, m1);
      if (!is_fp8_dtype(w.dtype())) layer["weight_rel_error"] = st->weight_error(w);
      else if (e > b) layer["weight_rel_error"] = st->weight_error(params_->master().slice_flat(b - m0, {e - b}));
    }
    j[st->name] = std::move(layer);
  }
  return j;
}

nlohmann::json GPT::fp8_state() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& st : fp8_) {
    const std::pair<const char*, const Fp8TensorMeta*> metas[] = {
        {"input", &st->input}, {"weight", &st->weight}, {"grad_output", &st->grad_output}};
    for (const auto& [what, m] : metas) j[st->name][what] = m->recipe->state(*m);
  }
  return j;
}

void GPT::load_fp8_state(const nlohmann::json& state) {
  FP8T_CHECK(state.is_object(), "FP8 state is not a JSON object (damaged checkpoint?)");
  FP8T_CHECK(state.size() == fp8_.size(), "FP8 state has {} layers but this model has {} FP8 linears",
             state.size(), fp8_.size());
  for (const auto& st : fp8_) {
    FP8T_CHECK(state.contains(st->name) && state.at(st->name).is_object(), "FP8 state has no entry for layer {}",
               st->name);
    const nlohmann::json& layer = state.at(st->name);
    const std::pair<const char*, Fp8TensorMeta*> metas[] = {
        {"input", &st->input}, {"weight", &st->weight}, {"grad_output", &st->grad_output}};
    for (const auto& [what, m] : metas) {
      FP8T_CHECK(layer.contains(what) && layer.at(what).is_object(), "FP8 state of {} has no '{}' entry", st->name,
                 what);
      m->recipe->load_state(*m, layer.at(what), st->name + " " + what);
    }
  }
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
  params_->set_master(h);
}

// Pre-LN GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(.)). What is fused and stored is the block's plan. The
// residual branches' last linears (proj, fc2) leave their biases to the residual adds (LinearBias::in_reader).
Var GPT::block(int l, const Var& x, RowStats* x_stats, RowStats* out_stats) {
  const BlockPlan& plan = plans_[static_cast<size_t>(l)];
  const ParameterStore& P = *params_;
  const std::string p = "h." + std::to_string(l) + ".";
  // Activation roles (core/allocator.h): what each saved tensor costs, for the planner's report. Layer names
  // (watch_layer): for the checks of a debug re-run (autograd/finite_watch.h); ops reading a weight are named
  // by it.
  constexpr const char* kResidual = "block input / residual";
  std::optional<ActivationRole> role;
  role.emplace("qkv linear + ln_1");
  Var h = layernorm_linear(LinearKind::qkv, l, x, p + "ln_1", p + "attn.c_attn", x_stats);
  watch_layer(p, "attn");
  role.emplace("attention (qkv, log-sum-exp)");
  h = attention(h, cfg_.n_head, plan.attention_fp8);
  role.emplace("attention output / proj input");
  const Var proj_b = P.var(p + "attn.c_proj.bias");
  h = dense(LinearKind::proj, l, h, P.var(p + "attn.c_proj.weight"), proj_b, plan.proj_serves_input,
            LinearBias::in_reader);
  watch_layer(p, "attn_residual");
  role.emplace(kResidual);
  // The residual add does ln_2's work that it can in the same pass (ask_for_layernorm).
  RowStats x1_stats;
  ask_for_layernorm(x1_stats, LinearKind::fc, l, p + "ln_2", "fc linear + ln_2");
  const Var x1 = add(x, h, &x1_stats, proj_b);
  watch_layer(p, "mlp.gelu");
  role.emplace("fc linear + ln_2");
  h = mlp(l, x1, &x1_stats);
  watch_layer(p, "mlp_residual");
  role.emplace(kResidual);
  return add(x1, h, out_stats, P.var(p + "mlp.c_proj.bias"));
}

void GPT::ask_for_layernorm(RowStats& stats, LinearKind kind, int l, const std::string& ln, const char* role) const {
  const ParameterStore& P = *params_;
  const Var lw = P.var(ln + ".weight"), lb = P.var(ln + ".bias");
  // Where the LayerNorm runs inside its linear's FP8 cast: the statistics, and with fp8_all (fp8_ln_cast_ahead)
  // the linear's input codes too. Else the bf16 LayerNorm's output, one read of the sum fewer.
  if (l >= 0 && ln_in_cast(kind, l)) {
    stats.cast_ahead = fp8_ln_cast_ahead(*plans_[static_cast<size_t>(l)].state(kind), lw, lb);
    return;
  }
  stats.norm_w = lw;
  stats.norm_b = lb;
  stats.norm_role = role;
}

bool GPT::ln_in_cast(LinearKind kind, int l) const {
  const BlockPlan& plan = plans_[static_cast<size_t>(l)];
  return kind == LinearKind::qkv ? plan.ln_1_in_qkv_cast : plan.ln_2_in_fc_cast;
}

Var GPT::layernorm_linear(LinearKind kind, int l, const Var& x, const std::string& ln, const std::string& linear,
                          RowStats* x_stats) {
  const ParameterStore& P = *params_;
  const Var lw = P.var(ln + ".weight"), lb = P.var(ln + ".bias");
  const Var w = P.var(linear + ".weight"), b = P.var(linear + ".bias");
  const BlockPlan& plan = plans_[static_cast<size_t>(l)];
  if (ln_in_cast(kind, l)) return fp8_linear_ln(x, lw, lb, w, b, *plan.state(kind), x_stats);
  const Var normed = layernorm(x, lw, lb, x_stats);
  Var y = dense(kind, l, normed, w, b);
  // With train.recompute: layernorm the LayerNorm output is dropped once its linear has run; the linear's
  // backward rebuilds it from the block input, which LayerNorm's backward keeps anyway.
  if (recompute_layernorm_) release_for_recompute(normed, [x, lw, lb] { return layernorm(x, lw, lb)->value; });
  return y;
}

Var GPT::mlp(int l, const Var& x, RowStats* x_stats) {
  const ParameterStore& P = *params_;
  const std::string p = "h." + std::to_string(l) + ".";
  const BlockPlan& plan = plans_[static_cast<size_t>(l)];
  const Var w1 = P.var(p + "mlp.c_fc.weight"), b1 = P.var(p + "mlp.c_fc.bias");
  const Var w2 = P.var(p + "mlp.c_proj.weight"), b2 = P.var(p + "mlp.c_proj.bias");
  if (plan.mlp == BlockPlan::Mlp::fused_bf16) {
    const Var lw = P.var(p + "ln_2.weight"), lb = P.var(p + "ln_2.bias");
    const Var normed = layernorm(x, lw, lb, x_stats);
    Var y = gelu_mlp(normed, w1, b1, w2, b2, LinearBias::in_reader);
    if (recompute_layernorm_) release_for_recompute(normed, [x, lw, lb] { return layernorm(x, lw, lb)->value; });
    return y;
  }
  Var h = layernorm_linear(LinearKind::fc, l, x, p + "ln_2", p + "mlp.c_fc", x_stats);
  const ActivationRole role("GELU input / fc2 input");
  // h moves in: the fused op holds pre's last handle, so it need not write pre's FP8 round trip back.
  if (plan.mlp == BlockPlan::Mlp::gelu_in_fc2_cast)
    return fp8_linear_gelu(std::move(h), w2, b2, *plan.state(LinearKind::fc2), LinearBias::in_reader);
  return dense(LinearKind::fc2, l, gelu(h, plan.gelu_input_fp8), w2, b2, false, LinearBias::in_reader);
}

Var GPT::hidden(const Tensor& tokens, bool recompute) {
  FP8T_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::i32, "tokens must be i32 (B, T), got {}",
             tokens.str());
  FP8T_CHECK(tokens.dim(1) <= cfg_.seq_len, "sequence length {} exceeds model.seq_len {}", tokens.dim(1),
             cfg_.seq_len);
  const ParameterStore& P = *params_;
  watch_layer("", "embedding");
  Var x;
  {
    ActivationRole role("block input / residual");
    x = embedding(tokens, P.var("wte"), P.var("wpe"));
  }
  // Without block checkpoints, each block's last add does what it can of the LayerNorm after it (the next block's
  // ln_1, or ln_f) in its pass (ask_for_layernorm); a checkpointed block recomputes its input's.
  RowStats x_stats;  // x's, where the previous block's last add computed them
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (recompute && grad_enabled()) {
      x = checkpoint([this, l](const Var& in) { return block(l, in); }, x);
      continue;
    }
    RowStats out_stats;
    if (l + 1 < cfg_.n_layer)
      ask_for_layernorm(out_stats, LinearKind::qkv, l + 1, "h." + std::to_string(l + 1) + ".ln_1", "qkv linear + ln_1");
    else
      ask_for_layernorm(out_stats, LinearKind::qkv, -1, "ln_f", "final LayerNorm + head + loss");
    x = block(l, x, &x_stats, &out_stats);
    x_stats = std::move(out_stats);
  }
  ActivationRole role("final LayerNorm + head + loss");
  return layernorm(x, P.var("ln_f.weight"), P.var("ln_f.bias"), &x_stats);
}

Var GPT::logits(const Tensor& tokens, bool recompute) {
  const Var h = hidden(tokens, recompute);
  watch_layer("", "lm_head");
  return dense(LinearKind::lm_head, -1, h, params_->var("wte"), nullptr);
}

Var GPT::loss(const Tensor& tokens, const Tensor& targets, bool recompute, float grad_scale) {
  // The head and the loss a chunk of tokens at a time: the (B, T, Vp) logits (e.g. 3.3 GB at
  // B = 32, T = 1024 in BF16) never exist at once.
  const Var h = hidden(tokens, recompute);
  watch_layer("", "lm_head");
  ActivationRole role("final LayerNorm + head + loss");
  if (fp8_head_)
    return fp8_lm_head_loss(h, params_->var("wte"), *fp8_head_, targets, cfg_.vocab_size, head_chunk_rows(),
                            grad_scale);
  return lm_head_loss(h, params_->var("wte"), targets, cfg_.vocab_size, head_chunk_rows(), grad_scale);
}

int64_t GPT::head_chunk_rows() const {
  // 256 MiB of logits per chunk, at most 4,096 tokens (past that a chunk's GEMMs gain nothing).
  constexpr int64_t kChunkBytes = int64_t{256} << 20, kMaxRows = 4096;
  const Tensor& wte = params_->var("wte")->value;
  const int64_t row_bytes = wte.dim(0) * static_cast<int64_t>(dtype_size(wte.dtype()));
  return std::clamp<int64_t>(kChunkBytes / row_bytes / 64 * 64, 64, kMaxRows);
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
