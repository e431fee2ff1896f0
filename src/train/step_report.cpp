// The step line, the step's metrics fields, the loss window, evaluations' fields and the end-of-run line.
#include "train/step_report.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "core/allocator.h"
#include "train/trainer.h"

namespace fp8t {

std::optional<double> LossWindow::zscore(double loss) const {
  if (!std::isfinite(loss) || losses_.size() < 2) return std::nullopt;
  double mean = 0;
  for (double x : losses_) mean += x;
  mean /= static_cast<double>(losses_.size());
  double var = 0;  // two passes: losses agree to many digits, sum(x^2) - n mean^2 would cancel
  for (double x : losses_) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / static_cast<double>(losses_.size()));
  if (sd == 0) return std::nullopt;
  return (loss - mean) / sd;
}

std::optional<double> LossWindow::push(double loss) {
  const std::optional<double> z = zscore(loss);
  if (!std::isfinite(loss)) return z;
  losses_.push_back(loss);
  if (losses_.size() > kSize) losses_.pop_front();
  return z;
}

void LossWindow::push_from_metrics(const std::filesystem::path& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss") && j.at("loss").is_number()) push(j.at("loss").get<double>());
  }
}

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02d}m", s / 3600, s / 60 % 60) : fmt::format("{}m{:02d}s", s / 60, s % 60);
}

std::string step_line(const StepReport& r) {
  std::string line = fmt::format("step {:5d}/{} | loss {:.4f}", r.step, r.max_steps, r.loss);
  if (r.loss_z) line += fmt::format(" | z {:+.2f}", *r.loss_z);
  line += fmt::format(" | lr {:.2e} | norm {:.3f} | {:.0f} ms | {:.0f} tok/s", r.lr, r.grad_norm, r.step_ms,
                      r.tokens_per_s);
  if (r.mfu) line += fmt::format(" | MFU {:.1f}%", 100 * *r.mfu);
  line += fmt::format(" | mem {}", format_bytes(r.memory_peak));
  if (r.skipped_steps > 0) line += fmt::format(" | skipped {}", r.skipped_steps);
  return line + fmt::format(" | ETA {}", format_eta(r.eta_s));
}

nlohmann::json step_json(const StepReport& r) {
  nlohmann::json j = {{"step", r.step}, {"tokens", r.tokens}, {"loss", r.loss}};
  if (r.loss_z) j["loss_z"] = *r.loss_z;
  j.update({{"lr", r.lr}, {"grad_norm", r.grad_norm}, {"step_ms", r.step_ms}, {"queue_ms", r.queue_ms},
            {"wait_ms", r.wait_ms}, {"tokens_per_s", r.tokens_per_s}});
  if (r.mfu) j["mfu"] = *r.mfu;
  j["skipped_steps"] = r.skipped_steps;
  if (r.skipped) j["skipped"] = true;
  return j;
}

std::string val_text(const std::vector<ValSet>& sets, const std::vector<double>& val) {
  std::string text = fmt::format("val_loss {:.4f}", val[0]);
  for (size_t i = 1; i < val.size(); ++i) text += fmt::format(" | {} {:.4f}", sets[i].name, val[i]);
  return text;
}

void add_val_json(nlohmann::json& j, const std::vector<ValSet>& sets, const std::vector<double>& val) {
  j["val_loss"] = val[0];
  nlohmann::json& named = j["val"] = nlohmann::json::object();
  for (size_t i = 0; i < val.size(); ++i) named[sets[i].name] = val[i];
}

std::string summary_line(const TrainResult& r, const Config& cfg) {
  std::string line = fmt::format("fp8train: done: {} steps", r.steps);
  if (r.skipped_steps > 0 && r.skipped_steps == r.steps_run)
    line += fmt::format(" (all {} run here skipped for non-finite values: the weights were not updated)",
                        r.skipped_steps);
  else if (r.skipped_steps > 0)
    line += fmt::format(" ({} of {} run here skipped for non-finite values)", r.skipped_steps, r.steps_run);
  if (r.first_val_loss) line += fmt::format(", first val_loss {:.4f}", *r.first_val_loss);
  if (r.last_val_loss) line += fmt::format(", last val_loss {:.4f}", *r.last_val_loss);
  for (size_t i = 1; i < cfg.data.val.size(); ++i)  // the other validation sets, in config order
    if (const auto it = r.last_val_losses.find(cfg.data.val[i].name); it != r.last_val_losses.end())
      line += fmt::format(", {} {:.4f}", it->first, it->second);
  if (!r.first_val_loss && !r.last_val_loss) line += ", no validation run (data.val is empty)";
  line += r.last_train_loss ? fmt::format(", last train loss {:.4f}", *r.last_train_loss)
                            : std::string(", no training step run");
  return line;
}

}  // namespace fp8t
