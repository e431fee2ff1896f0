// One tensor's FP8 scaling state: scale from amax, the amax history ring buffer, statistics.
#include "fp8/scaling.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "fp8/quantize.h"

namespace fp8t {

Fp8RoleFormats Fp8RoleFormats::from(Fp8Formats formats) {
  return formats == Fp8Formats::hybrid ? Fp8RoleFormats{Fp8Format::e4m3, Fp8Format::e5m2}
                                     : Fp8RoleFormats{Fp8Format::e4m3, Fp8Format::e4m3};
}

float fp8_scale_from_amax(float amax, float fmax, int margin, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  const float s = (fmax / amax) / std::ldexp(1.0f, margin);  // dividing by 2^margin is exact
  return std::isfinite(s) && s > 0.0f ? s : previous;
}

Fp8TensorMeta::Fp8TensorMeta(Fp8Format f, const Fp8Config& cfg)
    : format(f), recipe(&fp8_scaling_recipe(cfg.scaling)), algo(cfg.amax_compute_algo), margin(cfg.margin),
      amax_history(static_cast<size_t>(cfg.amax_history_len), 0.0f) {
  FP8T_CHECK(cfg.amax_history_len >= 1, "precision.fp8.amax_history_len must be >= 1, got {}",
             cfg.amax_history_len);
  FP8T_CHECK(cfg.margin >= 0, "precision.fp8.margin must be >= 0, got {}", cfg.margin);
}

float Fp8TensorMeta::host_cast_scale(const float* x, int64_t n) {
  return recipe->scale_from_tensor() ? scale_for_cast(fp8_amax(x, n)) : scale;
}

void Fp8TensorMeta::record(float amax, int64_t saturated) {
  // NaN must stick: std::max would drop it depending on argument order.
  if (std::isnan(amax) || std::isnan(amax_this_step)) amax_this_step = NAN;
  else amax_this_step = std::max(amax_this_step, amax);
  saturated_this_step += saturated;
  recorded_this_step = true;
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
