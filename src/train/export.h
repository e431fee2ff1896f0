// Export a checkpoint as Hugging Face GPT-2 weights: model.safetensors (HF names, Conv1D layout,
// unpadded vocabulary) and config.json, loadable with transformers' GPT2LMHeadModel.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace fp8t {

struct ExportStats {
  int tensors = 0;
  int64_t bytes = 0;
  std::string warning;  // set when the checkpoint could not be verified (it has no manifest)
};

// `checkpoint` is a run directory or a checkpoint directory, verified before it is read (see
// open_model_checkpoint); writes into `out_dir` (created).
ExportStats export_hf_gpt2(const std::filesystem::path& checkpoint, const std::filesystem::path& out_dir);

}  // namespace fp8t
