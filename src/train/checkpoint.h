// Checkpoints: written to a temporary directory and renamed into place, so a crash mid-write
// never damages an earlier checkpoint. Layout: checkpoints/step_NNNNNNNN/{model.bin, optim_rankR.bin,
// state.json}; checkpoints/latest names the newest complete one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/tensor.h"

namespace fp8t {

struct CheckpointState {
  int step = 0;              // optimizer steps completed
  int world_size = 1;
  int zero_stage = 0;
  int64_t tokens = 0;        // tokens seen
  std::string config_yaml;   // the resolved config of the run that wrote it
};

// Rank-0 writes model.bin/state.json; every rank writes its optimizer shard (m then v).
// All ranks must call it; `finalize` (rank 0, after a barrier) renames the directory into place.
std::filesystem::path checkpoint_tmp_dir(const std::filesystem::path& run_dir, int step);
void write_tensor_file(const std::filesystem::path& path, const Tensor& t);  // raw bytes, fsync'd
void read_tensor_file(const std::filesystem::path& path, Tensor& t);         // size must match
// Reads the first t.nbytes() of a file at least that large: model.bin is padded to the world size
// of the run that wrote it, so a single-process reader takes the prefix.
void read_tensor_prefix(const std::filesystem::path& path, Tensor& t);
void write_checkpoint_state(const std::filesystem::path& dir, const CheckpointState& s);
CheckpointState read_checkpoint_state(const std::filesystem::path& dir);
std::filesystem::path finalize_checkpoint(const std::filesystem::path& run_dir, int step);

// The newest complete checkpoint of a run directory (or a checkpoint directory itself).
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_or_ckpt_dir);

}  // namespace fp8t
