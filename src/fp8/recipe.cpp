// The delayed and current scaling recipes, their checkpoint state and the step's amax reduction.
#include "fp8/recipe.h"

#include <cfloat>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "fp8/scaling.h"

namespace fp8t {

namespace {

// What both recipes share: per-tensor scales and the amax history, rolled once per optimizer step.
class PerTensorRecipe : public Fp8ScalingRecipe {
 public:
  ScaleLayout layout() const override { return ScaleLayout::per_tensor; }

  void end_step(Fp8TensorMeta& m) const override {
    if (!m.recorded_this_step) return;
    m.last_amax = m.amax_this_step;
    m.last_saturated = m.saturated_this_step;
    if (std::isfinite(m.amax_this_step)) {
      const int len = static_cast<int>(m.amax_history.size());
      m.amax_history[static_cast<size_t>(m.pos)] = m.amax_this_step;
      m.pos = (m.pos + 1) % len;
      next_scale(m);
    }
    m.amax_this_step = 0.0f;
    m.saturated_this_step = 0;
    m.recorded_this_step = false;
  }

 protected:
  // After a finite amax entered the history.
  virtual void next_scale(Fp8TensorMeta& m) const = 0;
};

// Transformer Engine's delayed scaling: the scale of a step comes from the amax history of the steps
// before it (their max, or the most recent), so it is known before any cast of the step.
class DelayedScaling final : public PerTensorRecipe {
 public:
  const char* name() const override { return "delayed"; }
  bool scale_from_tensor() const override { return false; }
  float scale_for_cast(Fp8TensorMeta& m, float) const override { return m.scale; }
  void take_device_scale(Fp8TensorMeta&, float, float) const override {}

 protected:
  void next_scale(Fp8TensorMeta& m) const override {
    const float amax = m.algo == AmaxAlgo::max ? m.history_max() : m.most_recent_amax();
    m.scale = fp8_scale_from_amax(amax, m.fmax(), m.margin, m.scale);
    m.scale_inv = 1.0f / m.scale;
  }
};

// Current scaling: each cast derives its scale from the amax of the tensor it casts. The history is kept
// for metrics and for a switch to delayed scaling on resume.
class CurrentScaling final : public PerTensorRecipe {
 public:
  const char* name() const override { return "current"; }
  bool scale_from_tensor() const override { return true; }
  float scale_for_cast(Fp8TensorMeta& m, float amax_now) const override {
    m.scale = fp8_scale_from_amax(amax_now, m.fmax(), m.margin, m.scale);
    m.scale_inv = 1.0f / m.scale;
    return m.scale;
  }
  void take_device_scale(Fp8TensorMeta& m, float scale, float scale_inv) const override {
    m.scale = scale;
    m.scale_inv = scale_inv;
  }

 protected:
  void next_scale(Fp8TensorMeta&) const override {}
};

}  // namespace

nlohmann::json Fp8ScalingRecipe::state(const Fp8TensorMeta& m) const {
  return {{"scale", m.scale}, {"amax_history", m.amax_history}, {"pos", m.pos}};  // scale_inv is 1/scale
}

void Fp8ScalingRecipe::load_state(Fp8TensorMeta& m, const nlohmann::json& s, const std::string& where) const {
  // Every field is checked before use: a damaged file must not index past the history (pos) or read a
  // missing key.
  FP8T_CHECK(s.is_object(), "FP8 state of {} is not a JSON object", where);
  auto field = [&](const char* key) -> const nlohmann::json& {
    FP8T_CHECK(s.contains(key), "FP8 state of {} has no '{}'", where, key);
    return s.at(key);
  };
  const nlohmann::json& h = field("amax_history");
  FP8T_CHECK(h.is_array() && h.size() == m.amax_history.size(),
             "FP8 state of {} has an amax history of {} entries, the config asks for {}", where,
             h.is_array() ? h.size() : 0, m.amax_history.size());
  std::vector<float> hist;
  for (const auto& a : h) {
    FP8T_CHECK(a.is_number() && std::isfinite(a.get<double>()) && a.get<double>() >= 0 && a.get<double>() <= FLT_MAX,
               "FP8 state of {}: amax history entry {} is not a finite amax >= 0 (in f32 range)", where, a.dump());
    hist.push_back(a.get<float>());
  }
  const nlohmann::json& pos = field("pos");
  FP8T_CHECK(pos.is_number_integer() && pos.get<int64_t>() >= 0 &&
                 pos.get<int64_t>() < static_cast<int64_t>(hist.size()),
             "FP8 state of {}: amax history position {} is outside [0, {})", where, pos.dump(), hist.size());
  const nlohmann::json& scale = field("scale");
  FP8T_CHECK(scale.is_number() && std::isfinite(scale.get<double>()) && scale.get<double>() > 0 &&
                 scale.get<double>() <= FLT_MAX && std::isfinite(1.0 / scale.get<float>()),
             "FP8 state of {}: scale {} is not a finite positive number", where, scale.dump());
  m.amax_history = std::move(hist);
  m.pos = pos.get<int>();
  m.scale = scale.get<float>();
  m.scale_inv = 1.0f / m.scale;
}

const Fp8ScalingRecipe& fp8_scaling_recipe(Fp8Scaling scaling) {
  static const DelayedScaling delayed;
  static const CurrentScaling current;
  switch (scaling) {
    case Fp8Scaling::delayed: return delayed;
    case Fp8Scaling::current: return current;
  }
  FP8T_FAIL("unknown FP8 scaling {}", static_cast<int>(scaling));
}

std::string reduce_step_amax(const std::vector<Fp8TensorMeta*>& metas,
                             const std::function<std::string(size_t)>& name_of, const AmaxAllReduce& all_reduce_max) {
  if (all_reduce_max) {
    std::vector<float> v(metas.size());
    for (size_t i = 0; i < metas.size(); ++i) {
      const float a = metas[i]->amax_this_step;
      v[i] = std::isnan(a) ? INFINITY : a;
    }
    all_reduce_max(v);
    for (size_t i = 0; i < metas.size(); ++i) metas[i]->amax_this_step = v[i];
  }
  std::string bad;
  for (size_t i = 0; i < metas.size(); ++i)
    if (metas[i]->recorded_this_step && !std::isfinite(metas[i]->amax_this_step))
      bad += fmt::format("{}{} amax is {}", bad.empty() ? "" : ", ", name_of(i), metas[i]->amax_this_step);
  return bad;
}

}  // namespace fp8t
