// Resuming a checkpoint on another number of ranks or ZeRO stage: what changes besides the optimizer
// shards (load_optimizer_state, train/optimizer_checkpoint.h) — the FP8 scaling state each new rank starts from, and the
// log line that says so. Model weights, the data order and the RNG need nothing: model.bin is read up to
// the model's size whatever its padding, the loader's position is replayed for this run's ranks, and
// stochastic rounding hashes the flat element index, the same under any shard layout.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "train/checkpoint.h"

namespace fp8t {

// "checkpoint DIR: resharded from 2 ranks at ZeRO stage 1 to 3 ranks at ZeRO stage 2", or "" when the
// ranks and the stage are the checkpoint's.
std::string reshard_line(const std::filesystem::path& dir, const CheckpointState& s, int world, int zero_stage);

// The FP8 state (GPT::load_fp8_state's JSON) rank `rank` of `world` starts from, and the file(s) it came from.
// On the checkpoint's world size: the rank's own fp8_rankR.json, as written. On another: every rank's
// file merged, each amax history entry the maximum over the files and the scale the minimum — exactly
// the state every rank held with precision.fp8.reduce_amax (which makes the files identical), and
// without it the state an amax all-reduce would give, so no rank starts with a scale that saturates
// another's tensors. Then the grad_output histories are multiplied (and scales divided) by
// fp8_grad_amax_factor(). `state` is null when the checkpoint holds no FP8 state.
struct ResumedFp8State {
  nlohmann::json state;
  std::string source;  // for error messages
};
ResumedFp8State resumed_fp8_state(const std::filesystem::path& dir, int ckpt_world, int rank, int world,
                                  double grad_amax_factor);

// Gradients reach FP8 casts scaled by 1 / (micro-batch tokens x accumulation steps) = ranks / tokens per
// step, so a resume with another ranks / tokens ratio sees gradient amaxes this factor times the
// checkpoint's: (world / tokens_per_step) / (the checkpoint's ranks / its tokens per step). 1 for a
// checkpoint at step 0 (no history yet).
double fp8_grad_amax_factor(const CheckpointState& s, int world, int64_t tokens_per_step);

}  // namespace fp8t
