// Checkpoints: written to a temporary directory and renamed into place, so a crash mid-write
// never damages an earlier checkpoint. Layout: checkpoints/step_NNNNNNNN/{model.bin, optim_*rankR.bin,
// state.json, manifest.json, ...}; checkpoints/latest names the newest complete one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "core/tensor.h"
#include "nn/params.h"

namespace fp8t {

struct CheckpointState {
  int step = 0;              // optimizer steps completed
  int world_size = 1;
  int zero_stage = 0;
  int64_t tokens = 0;        // tokens seen
  std::string config_yaml;   // the resolved config of the run that wrote it
  int skipped_steps = 0;     // of the steps, skipped for non-finite values (absent before: 0)
};

// ---- writing: every rank writes its files into checkpoint_tmp_dir; rank 0 finalizes after a barrier.
std::filesystem::path checkpoint_tmp_dir(const std::filesystem::path& run_dir, int step);
// Writes a file, fsync'd, and returns its CRC32C, computed chunk by chunk as the bytes go out.
uint32_t write_file_synced(const std::filesystem::path& path, const void* data, size_t n);
// Writes one checkpoint file, fsync'd, computing its CRC32C while writing; its size and checksum go to a
// hidden digest file beside it, which finalize_checkpoint collects into manifest.json.
void write_checkpoint_file(const std::filesystem::path& path, const void* data, size_t n);
void write_checkpoint_text(const std::filesystem::path& path, std::string_view text);
void write_tensor_file(const std::filesystem::path& path, const Tensor& t);  // raw bytes
void write_checkpoint_state(const std::filesystem::path& dir, const CheckpointState& s);
// Rank 0, once every rank's files are written: manifest.json last (see checkpoint_manifest.h), then the
// rename into place and `latest`.
std::filesystem::path finalize_checkpoint(const std::filesystem::path& run_dir, int step);

// ---- reading
// The newest complete checkpoint of a run directory (or a checkpoint directory itself). When there is none,
// *why (if given) says what is missing, naming the file or directory: checkpoints/latest, the step directory
// it names, or that directory's state.json.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_or_ckpt_dir,
                                                       std::string* why = nullptr);
// state.json with every key type- and range-checked; the config it records must parse, describe the
// same ZeRO stage and reach the step. Errors name state.json, the key and the value.
CheckpointState read_checkpoint_state(const std::filesystem::path& dir);
void read_tensor_file(const std::filesystem::path& path, Tensor& t);  // size must match
// model.bin into P's master weights (and compute copy). The file holds P.numel() values padded to a
// multiple of `world_size`, the ranks of the run that wrote it; another size is refused, as is a NaN or
// Inf, named by parameter and element (one pass over the weights on the host).
void load_model_weights(const std::filesystem::path& dir, int world_size, ParameterStore& P);

// Refuses a NaN or Inf among the optimizer moments a rank loads, elements [begin, end) of the logical vector
// that the rank files optim_rank<R>.bin / optim_v_rank<R>.bin (R < files: 1 at ZeRO stage 0, else the writing
// world size) hold in order, each in optim_state.json's dtype, and among fp8 m's block scales; the message
// names the file, the element and its parameter (specs: the master layout). One pass over the rank's range.
void check_finite_optimizer_state(const std::filesystem::path& dir, int files, int64_t begin, int64_t end,
                                  const std::vector<ParamSpec>& specs);

// A checkpoint opened to read its model (sample, export): state.json checked, the config it records,
// the manifest verified against that config; `warning` is set for a checkpoint without a manifest.
struct ModelCheckpoint {
  std::filesystem::path dir;
  CheckpointState state;
  Config config;
  std::string warning;
};
ModelCheckpoint open_model_checkpoint(const std::filesystem::path& run_or_ckpt_dir);

// ---- checkpoint JSON files: errors name the file, the key and the value found.
nlohmann::json read_json_object(const std::filesystem::path& path);  // a JSON object, or an Error
int64_t json_int(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi,
                 const std::filesystem::path& file);
std::string json_string(const nlohmann::json& obj, const char* key, const std::filesystem::path& file);

}  // namespace fp8t
