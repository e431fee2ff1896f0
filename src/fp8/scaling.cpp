// Delayed and current FP8 scaling: scale from amax, history ring buffer, per-step update.
#include "fp8/scaling.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace fp8t {

Fp8FormatRecipe Fp8FormatRecipe::from(Fp8Recipe recipe) {
  return recipe == Fp8Recipe::hybrid ? Fp8FormatRecipe{Fp8Format::e4m3, Fp8Format::e5m2}
                                     : Fp8FormatRecipe{Fp8Format::e4m3, Fp8Format::e4m3};
}

float fp8_scale_from_amax(float amax, float fmax, int margin, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  const float s = (fmax / amax) / std::ldexp(1.0f, margin);  // dividing by 2^margin is exact
  return std::isfinite(s) && s > 0.0f ? s : previous;
}

Fp8TensorMeta::Fp8TensorMeta(Fp8Format f, const Fp8Config& cfg)
    : format(f), scaling(cfg.scaling), algo(cfg.amax_compute_algo), margin(cfg.margin),
      amax_history(static_cast<size_t>(cfg.amax_history_len), 0.0f) {
  FP8T_CHECK(cfg.amax_history_len >= 1, "precision.fp8.amax_history_len must be >= 1, got {}",
             cfg.amax_history_len);
  FP8T_CHECK(cfg.margin >= 0, "precision.fp8.margin must be >= 0, got {}", cfg.margin);
}

float Fp8TensorMeta::scale_for_cast(float amax_now) {
  if (scaling == Fp8Scaling::current) {
    scale = fp8_scale_from_amax(amax_now, fmax(), margin, scale);
    scale_inv = 1.0f / scale;
  }
  return scale;
}

void Fp8TensorMeta::record(float amax, int64_t saturated) {
  // NaN must stick: std::max would drop it depending on argument order.
  if (std::isnan(amax) || std::isnan(amax_this_step)) amax_this_step = NAN;
  else amax_this_step = std::max(amax_this_step, amax);
  saturated_this_step += saturated;
  recorded_this_step = true;
}

void Fp8TensorMeta::end_step() {
  if (!recorded_this_step) return;
  last_amax = amax_this_step;
  last_saturated = saturated_this_step;
  if (std::isfinite(amax_this_step)) {
    const int len = static_cast<int>(amax_history.size());
    amax_history[static_cast<size_t>(pos)] = amax_this_step;
    pos = (pos + 1) % len;
    if (scaling == Fp8Scaling::delayed) {
      const float amax = algo == AmaxAlgo::max ? history_max() : most_recent_amax();
      scale = fp8_scale_from_amax(amax, fmax(), margin, scale);
      scale_inv = 1.0f / scale;
    }
  }
  amax_this_step = 0.0f;
  saturated_this_step = 0;
  recorded_this_step = false;
}

float Fp8TensorMeta::most_recent_amax() const {
  const int len = static_cast<int>(amax_history.size());
  return amax_history[static_cast<size_t>((pos - 1 + len) % len)];
}

float Fp8TensorMeta::history_max() const {
  return *std::max_element(amax_history.begin(), amax_history.end());  // entries are finite
}

std::vector<float> Fp8TensorMeta::history_oldest_first() const {
  std::vector<float> out(amax_history.begin() + pos, amax_history.end());
  out.insert(out.end(), amax_history.begin(), amax_history.begin() + pos);
  return out;
}

}  // namespace fp8t
