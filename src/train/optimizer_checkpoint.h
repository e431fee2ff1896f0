// The optimizer's part of checkpoints: every rank's shard of the AdamW moments in its stored dtype, and
// loading them into another world size, ZeRO stage or state dtype (src/train/optimizer_checkpoint.cpp).
#pragma once
#include <filesystem>
#include <string>

#include "dist/comm.h"
#include "optim/adamw.h"

namespace fp8t {

// Optimizer state in checkpoints, each moment in its stored dtype (fp8 state: m's codes and its block
// scales, v bf16). At stage 0 every rank holds the same moments and rank 0 writes them; sharded, every
// rank writes its shard (optim_rankR.bin = m, optim_v_rankR.bin = v, optim_mscale_rankR.bin = scales);
// rank 0 also writes optim_state.json with the dtypes.
void save_optimizer_state(const std::filesystem::path& dir, const Communicator& comm, int zero_stage, AdamW& opt);
// Loads the moments for opt's range from a checkpoint written with (world, zero_stage), whatever this
// run's stage: the files are read as one logical vector and the range is cut out of it. Exact for the
// same state dtype, except fp8 blocks that straddle the checkpoint's blocks (another shard layout),
// which are re-quantized from the checkpoint's values; another state dtype is converted through f32
// (bf16 rounded to nearest even). Returns "" when the state was restored exactly, else what changed.
std::string load_optimizer_state(const std::filesystem::path& dir, int ckpt_world, int ckpt_zero_stage, AdamW& opt);

}  // namespace fp8t
