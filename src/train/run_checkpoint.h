// A training run's checkpoints, as the trainer writes and resumes them: the FP32 master (gathered where it is
// sharded), the optimizer state, the FP8 scaling state per rank and state.json, written into a temporary
// directory and renamed once complete (train/checkpoint.h); resuming verifies all of it against its manifest and
// this run's config before loading.
#pragma once
#include <spdlog/logger.h>

#include <cstdint>
#include <filesystem>

#include "config/config.h"
#include "dist/comm.h"

namespace fp8t {

class GPT;
class AdamW;

// Where a run stands: the step counter, the steps skipped on the way (train.skip_nonfinite_steps), tokens seen.
struct RunPosition {
  int step = 0;
  int skipped_steps = 0;
  int64_t tokens = 0;
};

// Writes the checkpoint of step at.step under run_dir. Every rank calls it (the master gather and the barriers
// are collectives); rank 0 writes the model and state.json, each rank its optimizer shard and FP8 state.
void save_run_checkpoint(const std::filesystem::path& run_dir, const Config& cfg, Communicator& comm, GPT& model,
                         AdamW& optim, const RunPosition& at, spdlog::logger& log);

// Loads the newest complete checkpoint under `where` (a run or checkpoint directory) into model and optim, after
// checking its files against the manifest and its model against cfg's; returns its position. tokens_per_step is
// this run's (the FP8 gradient amaxes are rescaled where it differs from the checkpoint's).
RunPosition restore_run_checkpoint(const std::filesystem::path& where, const Config& cfg, Communicator& comm,
                                   GPT& model, AdamW& optim, int64_t tokens_per_step, spdlog::logger& log);

}  // namespace fp8t
