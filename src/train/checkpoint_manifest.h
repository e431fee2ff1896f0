// manifest.json, written last into each checkpoint: the format version, the model it holds (shape,
// parameter count, a hash of the model config) and every file's size and CRC32C. Readers verify it
// before they use a file; a checkpoint without one (format version 1) loads with a warning.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "config/config.h"

namespace fp8t {

inline constexpr int kCheckpointFormatVersion = 2;  // 1: checkpoints written before manifest.json

// "model.n_layer is 4 in <found_in> but 2 in <expected_in>; ...": every model field that differs, or ""
// when the two describe the same model.
std::string model_difference(const ModelConfig& found, const ModelConfig& expected, const std::string& found_in,
                             const std::string& expected_in);

// The digest of a checkpoint file, its size and CRC32C, in a hidden file beside it (written by the rank
// that wrote the file, so rank 0 needs no second read of the other ranks' files).
void record_file_digest(const std::filesystem::path& file, uint64_t bytes, uint32_t crc32c);

// Writes dir/manifest.json for the files in dir, from their digests (which it removes) and the model of
// the config in dir/state.json.
void write_manifest(const std::filesystem::path& dir);

// What the reader will read, and so which files' checksums are computed (the others are checked by
// size): resume reads every file; inference (sample, export) reads model.bin and state.json.
enum class CheckpointUse { resume, inference };

// Verifies dir against its manifest.json: the format version; each file's size and CRC32C (a file the
// manifest does not list is refused too); then the model it records against the config in state.json.
// Throws an Error naming the file and what differs; returns a warning when dir has no manifest (format
// version 1), "" otherwise. Costs one read of the files it checksums.
std::string verify_checkpoint(const std::filesystem::path& dir, CheckpointUse use);

}  // namespace fp8t
