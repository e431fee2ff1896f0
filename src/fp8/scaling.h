// FP8 scaling state of one tensor, run by its recipe (fp8/recipe.h: Transformer Engine's delayed scaling,
// or current scaling), and the FP8 format of each tensor role. Host-side; the CUDA path keeps the same
// numbers on device (fp8/device_meta.h).
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/dtype.h"
#include "fp8/recipe.h"

namespace fp8t {

// Format per role: forward tensors (inputs, weights) and backward tensors (output gradients).
struct Fp8RoleFormats {
  Fp8Format forward = Fp8Format::e4m3;
  Fp8Format backward = Fp8Format::e5m2;
  // hybrid: E4M3 forward, E5M2 gradients; e4m3: E4M3 everywhere.
  static Fp8RoleFormats from(Fp8Formats formats);
};

// scale = (fmax / amax) / 2^margin, in f32 as the device computes it. An amax that is zero, negative
// or non-finite (or a scale that would overflow to inf) returns `previous`: a tensor that was all
// zeros, or a step that produced NaN/Inf, never turns the scale into inf or NaN.
float fp8_scale_from_amax(float amax, float fmax, int margin, float previous);

// One tensor's scaling state. Usage per training step:
//   cast: host_cast_scale(x) or scale_for_cast(amax of the tensor) gives the scale (delayed: from the
//         history, fixed for the whole step; current: from this amax); record(amax, saturated) after each cast;
//   end of step: end_step() enters the step's amax into the history and (delayed) computes the
//         scale for the next step. A fresh meta has an all-zero history and scale 1, as in TE.
struct Fp8TensorMeta {
  Fp8Format format = Fp8Format::e4m3;
  const Fp8ScalingRecipe* recipe = &fp8_scaling_recipe(Fp8Scaling::delayed);
  AmaxAlgo algo = AmaxAlgo::max;
  int margin = 0;

  float scale = 1.0f;      // multiplies the high-precision tensor before the cast
  float scale_inv = 1.0f;  // 1 / scale: multiplies the GEMM output (dequantization)
  std::vector<float> amax_history;  // ring buffer of past steps' amax (amax_history_len entries)
  int pos = 0;                      // slot the next step's amax goes to; pos - 1 is the most recent

  float amax_this_step = 0.0f;      // max over this step's casts (NaN sticks)
  int64_t saturated_this_step = 0;  // values with |x * scale| > fmax over this step's casts
  bool recorded_this_step = false;  // at least one cast recorded since the last end_step()

  float last_amax = 0.0f;       // the previous step's amax (metrics; may be non-finite)
  int64_t last_saturated = 0;   // the previous step's saturated count (metrics)

  Fp8TensorMeta() = default;
  Fp8TensorMeta(Fp8Format format, const Fp8Config& cfg);

  float fmax() const { return fp8_max(format); }
  // The scale to cast a tensor whose amax is `amax_now` with. Delayed scaling ignores amax_now
  // (the scale was fixed at the last end_step); current scaling derives it from amax_now and keeps
  // it in `scale` / `scale_inv` (so metrics show what was used).
  float scale_for_cast(float amax_now) { return recipe->scale_for_cast(*this, amax_now); }
  // The scale for a host cast of x (n values): the amax pass runs only where the recipe needs it.
  float host_cast_scale(const float* x, int64_t n);
  void record(float amax, int64_t saturated);
  // Rolls the history and updates the delayed scale. A step without casts changes nothing; a
  // non-finite amax is reported through last_amax but not entered into the history, so one bad
  // step cannot freeze the scale for amax_history_len steps.
  void end_step() { recipe->end_step(*this); }

  float most_recent_amax() const;
  float history_max() const;
  std::vector<float> history_oldest_first() const;
};

}  // namespace fp8t
