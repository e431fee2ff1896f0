// HF GPT-2 export: safetensors header, Conv1D transposes, unpadded vocabulary, config.json.
#include <catch2/catch_test_macros.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "config/config.h"
#include "nn/gpt.h"
#include "train/checkpoint.h"
#include "train/export.h"

using namespace fp8t;
namespace fs = std::filesystem;

TEST_CASE("export: a checkpoint becomes HF GPT-2 safetensors and config.json", "[export]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_export_{}", ::getpid());
  fs::remove_all(root);
  Config cfg = parse_config("model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 100, seq_len: 8}\n", "e.yaml");
  GPT model(cfg.model, Device::cpu(), DType::f32, 3);  // padded as if written by 3 ranks
  model.init(9);
  const fs::path tmp = checkpoint_tmp_dir(root, 5);
  write_tensor_file(tmp / "model.bin", model.params().master());
  write_checkpoint_state(tmp, {5, 3, 0, 0, cfg.to_yaml()});
  finalize_checkpoint(root, 5);

  const ExportStats s = export_hf_gpt2(root, root / "hf");
  CHECK(s.tensors == 2 + 12 * 2 + 2);
  std::ifstream in(root / "hf" / "model.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string head(n, '\0');
  in.read(head.data(), static_cast<std::streamsize>(n));
  const std::string payload{std::istreambuf_iterator<char>(in), {}};
  const auto h = nlohmann::json::parse(head);
  auto values = [&](const std::string& name) {
    const auto off = h.at(name).at("data_offsets");
    std::vector<float> v((off[1].get<size_t>() - off[0].get<size_t>()) / 4);
    std::memcpy(v.data(), payload.data() + off[0].get<size_t>(), v.size() * 4);
    return v;
  };
  CHECK(h.at("wte.weight").at("shape") == nlohmann::json({100, 16}));
  CHECK(h.at("h.1.attn.c_attn.weight").at("shape") == nlohmann::json({16, 48}));
  CHECK(h.at("h.0.mlp.c_proj.weight").at("shape") == nlohmann::json({64, 16}));
  CHECK(h.at("ln_f.bias").at("dtype") == "F32");
  // Conv1D layout: exported[i][o] == ours[o][i].
  const Tensor& w = model.params().var("h.1.attn.c_attn.weight")->value;  // (48, 16)
  const auto e = values("h.1.attn.c_attn.weight");                          // (16, 48)
  for (int o = 0; o < 48; ++o)
    for (int i = 0; i < 16; ++i) REQUIRE(e[i * 48 + o] == w.data<float>()[o * 16 + i]);
  const auto wte = values("wte.weight");
  CHECK(wte.size() == 100 * 16);
  CHECK(wte[99 * 16 + 3] == model.params().var("wte")->value.data<float>()[99 * 16 + 3]);
  const auto config = nlohmann::json::parse(std::ifstream(root / "hf" / "config.json"));
  CHECK(config.at("model_type") == "gpt2");
  CHECK(config.at("n_embd") == 16);
  CHECK(config.at("vocab_size") == 100);
  CHECK(config.at("activation_function") == "gelu_new");
  fs::remove_all(root);
}
