// Hugging Face GPT-2 export: safetensors writer and config.json.
#include "train/export.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/check.h"
#include "nn/gpt.h"
#include "train/checkpoint.h"

namespace fp8t {

namespace fs = std::filesystem;

namespace {
// HF's Conv1D stores (in, out): our (out, in) linear weights are transposed on the way out.
bool is_conv1d(const std::string& name) {
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

void write_atomically(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FP8T_CHECK(out, "cannot write {}", tmp.string());
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    FP8T_CHECK(out, "writing {} failed (is the disk full?)", tmp.string());
  }
  fs::rename(tmp, path);
}
}  // namespace

ExportStats export_hf_gpt2(const fs::path& checkpoint, const fs::path& out_dir) {
  const ModelCheckpoint ck = open_model_checkpoint(checkpoint);
  const CheckpointState& st = ck.state;
  const ModelConfig& m = ck.config.model;
  GPT model(m, Device::cpu(), DType::f32, 1);
  load_model_weights(ck.dir, st.world_size, model.params());
  const float* src = model.params().master().data<float>();

  // Payload in spec order, each tensor F32 little-endian; header lists name, shape and byte range.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"source", "fp8train"}, {"step", std::to_string(st.step)}};
  std::string payload;
  ExportStats stats;
  stats.warning = ck.warning;
  for (const ParamSpec& s : model.params().specs()) {
    Shape shape = s.shape;
    if (s.name == "wte") shape[0] = m.vocab_size;  // drop the padding rows
    std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
    const float* p = src + s.offset;
    if (is_conv1d(s.name)) {
      const int64_t out = shape[0], in = shape[1];
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) values[static_cast<size_t>(i * out + o)] = p[o * in + i];
      shape = {in, out};
    } else {
      std::memcpy(values.data(), p, values.size() * sizeof(float));
    }
    const std::string name = (s.name == "wte" || s.name == "wpe") ? s.name + ".weight" : s.name;
    const size_t begin = payload.size();
    payload.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, payload.size()}}};
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

}  // namespace fp8t
