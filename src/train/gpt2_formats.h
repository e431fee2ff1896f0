// GPT-2 weights as other trainers lay them out, shared by export and import: Hugging Face names and
// Conv1D (in, out) weights, and llm.c's model file (a 256 x int32 header, then every tensor in its order).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "nn/params.h"

namespace fp8t {

// HF GPT-2 stores these linears as Conv1D, (in, out); ours are (out, in).
bool is_hf_conv1d(const std::string& name);
// The HF tensor name of one of our parameters (without the optional "transformer." prefix).
std::string hf_tensor_name(const std::string& name);
// dst (cols, rows) = src (rows, cols) transposed.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst);

// llm.c's model file (train_gpt2.cu): header ints [0] magic, [1] version, [2] max_seq_len, [3] vocab_size,
// [4] num_layers, [5] num_heads, [6] channels, [7] padded_vocab_size; the rest are zero.
inline constexpr int32_t kLlmcMagic = 20240326;
inline constexpr int32_t kLlmcVersionF32 = 3;   // parameters as float32
inline constexpr int32_t kLlmcVersionBf16 = 5;  // parameters as bfloat16
inline constexpr int kLlmcHeaderInts = 256;
// Indices into `specs` (gpt2_param_specs order) in llm.c's file order: wte, wpe, then each per-layer
// tensor kind for all layers (ln1w of every layer, then ln1b, ...), then lnfw, lnfb. Weights are already
// (out, in) there; wte has padded_vocab_size rows.
std::vector<size_t> llmc_param_order(const std::vector<ParamSpec>& specs, int n_layer);

// Writes `bytes` to path + ".tmp" and renames that onto `path`: a reader never sees a partial file.
void write_atomically(const std::filesystem::path& path, const std::string& bytes);

}  // namespace fp8t
