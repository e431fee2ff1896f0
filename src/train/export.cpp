// GPT-2 export: HF safetensors + config.json, and llm.c model files.
#include "train/export.h"

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/check.h"
#include "nn/gpt.h"
#include "train/checkpoint.h"
#include "train/gpt2_formats.h"

namespace fp8t {

namespace fs = std::filesystem;

namespace {
// A verified checkpoint's model, on the CPU in f32.
struct Exported {
  ModelCheckpoint ck;
  std::unique_ptr<GPT> model;
};
Exported open_for_export(const fs::path& checkpoint) {
  Exported e{open_model_checkpoint(checkpoint), nullptr};
  e.model = std::make_unique<GPT>(e.ck.config.model, Device::cpu(), DType::f32, 1);
  load_model_weights(e.ck.dir, e.ck.state.world_size, e.model->params());
  return e;
}
}  // namespace

ExportStats export_hf_gpt2(const fs::path& checkpoint, const fs::path& out_dir) {
  const Exported e = open_for_export(checkpoint);
  const CheckpointState& st = e.ck.state;
  const ModelConfig& m = e.ck.config.model;
  const float* src = e.model->params().master().data<float>();

  // Payload in spec order, each tensor F32 little-endian; header lists name, shape and byte range.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"source", "fp8train"}, {"step", std::to_string(st.step)}};
  std::string payload;
  ExportStats stats;
  stats.warning = e.ck.warning;
  for (const ParamSpec& s : e.model->params().specs()) {
    Shape shape = s.shape;
    if (s.name == "wte") shape[0] = m.vocab_size;  // drop the padding rows
    std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
    const float* p = src + s.offset;
    if (is_hf_conv1d(s.name)) {  // HF's Conv1D stores (in, out)
      transpose(p, shape[0], shape[1], values.data());
      shape = {shape[1], shape[0]};
    } else {
      std::memcpy(values.data(), p, values.size() * sizeof(float));
    }
    const size_t begin = payload.size();
    payload.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    header[hf_tensor_name(s.name)] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, payload.size()}}};
    ++stats.tensors;
  }
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');  // keep the payload 8-byte aligned
  const uint64_t n = head.size();
  std::string file(reinterpret_cast<const char*>(&n), sizeof n);  // little-endian on every target we build
  file += head;
  file += payload;
  stats.bytes = static_cast<int64_t>(file.size());

  fs::create_directories(out_dir);
  write_atomically(out_dir / "model.safetensors", file);
  const nlohmann::ordered_json config = {
      {"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"},
      {"vocab_size", m.vocab_size},           {"n_positions", m.seq_len},
      {"n_ctx", m.seq_len},                   {"n_embd", m.d_model},
      {"n_layer", m.n_layer},                 {"n_head", m.n_head},
      {"activation_function", "gelu_new"},    {"layer_norm_epsilon", 1e-5},
      {"tie_word_embeddings", true},          {"bos_token_id", 50256},
      {"eos_token_id", 50256},                {"torch_dtype", "float32"}};
  write_atomically(out_dir / "config.json", config.dump(2) + "\n");
  return stats;
}

ExportStats export_llmc_gpt2(const fs::path& checkpoint, const fs::path& out_file, DType dtype) {
  FP8T_CHECK(dtype == DType::f32 || dtype == DType::bf16, "llm.c model files hold f32 or bf16 weights, not {}",
             dtype_name(dtype));
  std::error_code ec;
  FP8T_CHECK(!fs::is_directory(out_file, ec), "--out {} is a directory: an llm.c export is one file, e.g. {}",
             out_file.string(), (out_file / "gpt2.bin").string());
  const Exported e = open_for_export(checkpoint);
  const ModelConfig& m = e.ck.config.model;
  ParameterStore& P = e.model->params();
  const float* src = P.master().data<float>();

  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = kLlmcMagic;
  header[1] = dtype == DType::f32 ? kLlmcVersionF32 : kLlmcVersionBf16;
  header[2] = m.seq_len;
  header[3] = m.vocab_size;
  header[4] = m.n_layer;
  header[5] = m.n_head;
  header[6] = m.d_model;
  header[7] = m.padded_vocab();
  std::string file(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
  file.reserve(file.size() + static_cast<size_t>(P.numel()) * dtype_size(dtype));
  ExportStats stats;
  stats.warning = e.ck.warning;
  for (const size_t i : llmc_param_order(P.specs(), m.n_layer)) {
    const ParamSpec& s = P.specs()[i];
    const float* p = src + s.offset;
    if (dtype == DType::f32) {
      file.append(reinterpret_cast<const char*>(p), static_cast<size_t>(s.numel()) * sizeof(float));
    } else {
      std::vector<uint16_t> b(static_cast<size_t>(s.numel()));
      for (size_t j = 0; j < b.size(); ++j) b[j] = float_to_bf16(p[j]);
      file.append(reinterpret_cast<const char*>(b.data()), b.size() * sizeof(uint16_t));
    }
    ++stats.tensors;
  }
  stats.bytes = static_cast<int64_t>(file.size());
  if (out_file.has_parent_path()) fs::create_directories(out_file.parent_path());
  write_atomically(out_file, file);
  return stats;
}

}  // namespace fp8t
