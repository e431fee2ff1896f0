// FP8 scaling recipes as types. A recipe decides how the scale of one tensor is chosen (from the amax
// history of past steps, or from the tensor being cast), what the end of an optimizer step does to the
// state (with the amax reduction over ranks), what a checkpoint keeps of it, and the scale layout of the
// codes it produces. Fp8TensorMeta (fp8/scaling.h) holds one tensor's state and its recipe; callers ask
// the recipe's properties (scale_from_tensor, layout), never its name, so a new recipe (block scaling:
// 1x128 activation and 128x128 weight tiles with current scales, as in DeepSeek-V3) is one more class
// here and its kernels, not a branch at every call site.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"
#include "fp8/quantized_tensor.h"

namespace fp8t {

struct Fp8TensorMeta;

class Fp8ScalingRecipe {
 public:
  virtual ~Fp8ScalingRecipe() = default;
  virtual const char* name() const = 0;
  // The scale layout of the codes a cast under this recipe writes.
  virtual ScaleLayout layout() const = 0;
  // Whether a cast must see the tensor before it knows its scale. False (delayed): the scale was fixed at
  // the last end_step, so one pass casts any form of the input (FP8 codes included) and a re-cast in
  // backward finds the same scale in the state. True (current): an amax pass over the tensor comes first,
  // and whoever re-casts later must keep the scale that was used.
  virtual bool scale_from_tensor() const = 0;
  // The scale for casting a tensor whose amax is `amax_now` (unused unless scale_from_tensor()); keeps it in
  // m.scale / m.scale_inv so metrics show what was used.
  virtual float scale_for_cast(Fp8TensorMeta& m, float amax_now) const = 0;
  // The step's device statistics reached the host: a recipe that scales on the device takes its scale.
  virtual void take_device_scale(Fp8TensorMeta& m, float scale, float scale_inv) const = 0;
  // End of an optimizer step (after reduce_step_amax): the step's amax enters the history and the
  // scale for the next step is computed where the recipe needs it.
  virtual void end_step(Fp8TensorMeta& m) const = 0;
  // The checkpoint state of m, and loading it back with every field checked (`where` names the tensor in
  // messages). Both recipes keep the scale, the amax history and its position.
  virtual nlohmann::json state(const Fp8TensorMeta& m) const;
  virtual void load_state(Fp8TensorMeta& m, const nlohmann::json& state, const std::string& where) const;
};

// The recipe of precision.fp8.scaling (objects without state: shared by every tensor).
const Fp8ScalingRecipe& fp8_scaling_recipe(Fp8Scaling scaling);

// The step's amax of every meta, max-reduced over ranks by `all_reduce_max` (which replaces each value by
// its maximum over ranks), so that every rank computes the same scales. NaN travels as +inf (a max
// reduction may drop NaN but never inf). Returns the tensors whose amax is not finite, as "name amax"
// (named by `name_of`), "" when all are finite.
using AmaxAllReduce = std::function<void(std::vector<float>& values)>;
// metas[i]'s name is made by name_of(i), only for the non-finite ones (the host runs this once per step before the
// optimizer is queued: a 1.5B model has 576 metas).
std::string reduce_step_amax(const std::vector<Fp8TensorMeta*>& metas,
                             const std::function<std::string(size_t)>& name_of, const AmaxAllReduce& all_reduce_max);

}  // namespace fp8t
