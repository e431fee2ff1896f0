// What a run reports: each training step's log line and metrics.jsonl fields (with the window of recent
// losses its z-score is measured against), evaluations, and the end-of-run line.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace fp8t {

// The last kSize finite training losses. z-score of a step's loss: (loss - mean) / std over the losses
// of the steps before it (the step's own loss is not in the window it is measured against, so a spike
// is not diluted by itself), std the population standard deviation.
class LossWindow {
 public:
  static constexpr size_t kSize = 100;
  // None for a non-finite loss, with fewer than 2 losses in the window, or when they are all equal.
  std::optional<double> zscore(double loss) const;
  // Keeps `loss` (not when non-finite) and returns its z-score against the window before it.
  std::optional<double> push(double loss);
  // Refills the window from a run's metrics.jsonl (its rows' "loss", in file order), after a resume.
  void push_from_metrics(const std::filesystem::path& metrics_jsonl);
  size_t size() const { return losses_.size(); }

 private:
  std::deque<double> losses_;
};

struct StepReport {
  int step = 0, max_steps = 0;
  int64_t tokens = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0;
  std::optional<double> loss_z;  // LossWindow::zscore of this step's loss
  std::optional<double> mfu;     // model FLOPs utilisation, 0..1; none without a known peak
  bool skipped = false;          // this step's update was skipped (non-finite values)
  int skipped_steps = 0;         // steps skipped so far in the run, this one included (resumes count on)
  int64_t memory_peak = 0;       // bytes
  double eta_s = 0;
  // Where the step's time went on the host: queue_ms from the step's start until every micro-step's forward and
  // backward was queued (on CUDA the host runs ahead of the device; a data copy that waits for it counts here),
  // wait_ms then waiting for the device to finish them (at the loss read). wait_ms near 0 on CUDA: the device
  // waited for the host (launch-bound); wait_ms near step_ms - queue_ms: the host was far ahead.
  double queue_ms = 0, wait_ms = 0;
};

// "step    12/100 | loss 3.1234 | z +0.52 | lr 6.00e-04 | norm 0.812 | 95 ms | 10780 tok/s | MFU 41.2% |
// mem 145.7 MiB | skipped 2 | ETA 1m05s": z only when defined, MFU only when known, skipped only once
// a step was.
std::string step_line(const StepReport& r);
// The step's metrics.jsonl fields: step, tokens, loss, loss_z (when defined), lr, grad_norm, step_ms, queue_ms,
// wait_ms, tokens_per_s, mfu (when known), skipped_steps, and skipped: true on a skipped step.
nlohmann::json step_json(const StepReport& r);

// "1h02m" or "3m05s"; "?" when not finite.
std::string format_eta(double seconds);

// An evaluation's losses `val`, one per data.val set in `sets`' order. The log's "val_loss 5.1234 |
// sotu 5.4321": the first set keeps the name val_loss, the others go by theirs.
std::string val_text(const std::vector<ValSet>& sets, const std::vector<double>& val);
// metrics.jsonl: val_loss is the first set, "val" holds every set by name.
void add_val_json(nlohmann::json& j, const std::vector<ValSet>& sets, const std::vector<double>& val);

// summary_line (train/trainer.h), the end-of-run line, is defined in step_report.cpp too.

}  // namespace fp8t
