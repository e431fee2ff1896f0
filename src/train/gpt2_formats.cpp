// HF and llm.c GPT-2 layouts: names, transposes and llm.c's tensor order.
#include "train/gpt2_formats.h"

#include <fstream>

#include "core/check.h"

namespace fp8t {

namespace fs = std::filesystem;

bool is_hf_conv1d(const std::string& name) {
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

std::string hf_tensor_name(const std::string& name) {
  return (name == "wte" || name == "wpe") ? name + ".weight" : name;
}

void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

std::vector<size_t> llmc_param_order(const std::vector<ParamSpec>& specs, int n_layer) {
  const size_t L = static_cast<size_t>(n_layer), per_layer = (specs.size() - 4) / L;
  FP8T_CHECK(specs.size() == 4 + per_layer * L && specs[0].name == "wte" && specs[1].name == "wpe",
             "llmc_param_order: {} parameters are not GPT-2's for {} layers", specs.size(), n_layer);
  std::vector<size_t> order = {0, 1};
  for (size_t k = 0; k < per_layer; ++k)
    for (size_t l = 0; l < L; ++l) order.push_back(2 + l * per_layer + k);
  order.push_back(specs.size() - 2);  // ln_f.weight
  order.push_back(specs.size() - 1);  // ln_f.bias
  return order;
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

}  // namespace fp8t
