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

struct TrainResult {
  double first_val_loss = 0;  // the first data.val set's; NaN when there is no validation data
  double last_val_loss = 0;   // the first set's at the last evaluation; NaN without validation data
  std::map<std::string, double> last_val_losses;  // every data.val set's last loss, by name
  double last_train_loss = 0;
  int steps = 0;
};

// Runs cfg to completion on this rank. `resume` is a run directory or checkpoint directory.
TrainResult train(const Config& cfg, Communicator& comm, const std::optional<std::filesystem::path>& resume = {});

}  // namespace fp8t
