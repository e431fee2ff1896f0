// Import GPT-2 weights written by other tools (Hugging Face safetensors, llm.c model files) as an
// fp8train run directory holding one checkpoint at step 0 with weights only; and train.init_from, a
// new run that starts from a checkpoint's weights.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "nn/params.h"

namespace fp8t {

struct ImportStats {
  ModelConfig model;                  // the model the weights describe
  int tensors = 0;                    // tensors read
  std::filesystem::path checkpoint;   // the checkpoint directory written
  std::vector<std::string> warnings;  // what the import could not carry over exactly
};

// `hf_dir` holds model.safetensors (F32 or BF16 tensors, names with or without "transformer.", an
// lm_head.weight only when it equals wte) and config.json (n_embd, n_layer, n_head, n_positions or
// n_ctx, vocab_size). Conv1D weights are transposed to (out, in); wte gets zero padding rows.
ImportStats import_hf_gpt2(const std::filesystem::path& hf_dir, const std::filesystem::path& run_dir);

// An llm.c model file (train_gpt2.cu: version 3 = f32 parameters, 5 = bf16), every header field and the
// file size checked; the rows of wte past vocab_size become this model's zero padding rows.
ImportStats import_llmc_gpt2(const std::filesystem::path& file, const std::filesystem::path& run_dir);

// Both write run_dir (created; it must hold no checkpoint yet) as the trainer does: config.yaml (this
// model, every other key at its default) and checkpoints/step_00000000 with model.bin, state.json and
// manifest.json (through the checkpoint writer), and no optimizer files.

// A checkpoint whose manifest lists no optimizer file (as import writes it): a resume of it starts
// with fresh AdamW moments. False for a checkpoint without a manifest (its files cannot be vouched for).
bool weights_only_checkpoint(const std::filesystem::path& dir);

// train.init_from: the checkpoint it names (a run or checkpoint directory), verified, whose model must
// be cfg.model, loaded into P's weights. Errors name train.init_from and what differs. Returns the line
// for the run's log: the checkpoint read, its step, and a warning when it has no manifest.
std::string load_init_weights(const Config& cfg, ParameterStore& P);

}  // namespace fp8t
