// Trainer: the training loop of one rank — data, forward/backward with gradient accumulation,
// gradient reduction (ZeRO stages 0-2), clipping, AdamW, evaluation, metrics and checkpoints.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "config/config.h"
#include "dist/comm.h"

namespace fp8t {

// What a run measured; a value that was not measured is absent, never a default.
struct TrainResult {
  std::optional<double> first_val_loss;  // the first data.val set's, before the first step; none without data.val
  std::optional<double> last_val_loss;   // the first set's at the last evaluation; none without data.val
  std::map<std::string, double> last_val_losses;  // every data.val set's last loss, by name
  std::optional<double> last_train_loss;  // the last step's mean loss; none when this run ran no step
  int steps = 0;           // the step counter at the end (a resumed run counts from its checkpoint)
  int steps_run = 0;       // steps this run ran
  int skipped_steps = 0;   // of those, skipped for a non-finite loss or gradient (train.skip_nonfinite_steps)
};

// Runs cfg to completion on this rank. `resume` is a run directory or checkpoint directory.
TrainResult train(const Config& cfg, Communicator& comm, const std::optional<std::filesystem::path>& resume = {});

// The end-of-run line: "fp8train: done: 60 steps, first val_loss 4.1589, last val_loss 1.2345, held 5.4321".
std::string summary_line(const TrainResult& result, const Config& cfg);

}  // namespace fp8t
