// Learning-rate schedule: linear warmup, then cosine or linear decay to lr * min_lr_ratio.
#pragma once
#include "config/config.h"

namespace fp8t {

// Learning rate for optimizer step `step` (0-based) of `max_steps`.
double lr_at(const OptimConfig& cfg, int step, int max_steps);

}  // namespace fp8t
