// Export a checkpoint as GPT-2 weights for other tools: Hugging Face (model.safetensors with HF names,
// Conv1D layout and the unpadded vocabulary, plus config.json, loadable with transformers'
// GPT2LMHeadModel) or an llm.c model file (train_gpt2.cu's header and tensor order, f32 or bf16).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/dtype.h"

namespace fp8t {

struct ExportStats {
  int tensors = 0;
  int64_t bytes = 0;
  std::string warning;  // set when the checkpoint could not be verified (it has no manifest)
};

// `checkpoint` is a run directory or a checkpoint directory, verified before it is read (see
// open_model_checkpoint); writes into `out_dir` (created).
ExportStats export_hf_gpt2(const std::filesystem::path& checkpoint, const std::filesystem::path& out_dir);

// Writes the llm.c model file `out_file` (its directory is created): version 3 for dtype f32, 5 for bf16
// (each weight rounded to nearest even). wte keeps this model's padded vocabulary rows.
ExportStats export_llmc_gpt2(const std::filesystem::path& checkpoint, const std::filesystem::path& out_file,
                             DType dtype);

}  // namespace fp8t
