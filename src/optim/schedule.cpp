// Warmup + decay schedules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace fp8t {

double lr_at(const OptimConfig& cfg, int step, int max_steps) {
  if (step < cfg.warmup_steps) return cfg.lr * (step + 1) / cfg.warmup_steps;
  const double min_lr = cfg.lr * cfg.min_lr_ratio;
  const int decay_steps = std::max(1, max_steps - cfg.warmup_steps - 1);
  const double progress = std::clamp(static_cast<double>(step - cfg.warmup_steps) / decay_steps, 0.0, 1.0);
  switch (cfg.schedule) {
    case Schedule::constant: return cfg.lr;
    case Schedule::linear: return cfg.lr - (cfg.lr - min_lr) * progress;
    case Schedule::cosine: return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
  }
  return cfg.lr;
}

}  // namespace fp8t
