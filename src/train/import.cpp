// GPT-2 import: a safetensors reader and an llm.c reader, each checked field by field, writing a
// weights-only checkpoint at step 0 through the checkpoint writer; and the weights of train.init_from.
#include "train/import.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/check.h"
#include "nn/gpt.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/gpt2_formats.h"
#include "train/nonfinite.h"

namespace fp8t {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxSafetensorsHeader = uint64_t{100} << 20;  // the format's own limit
constexpr int64_t kMaxDim = int64_t{1} << 40;                    // no GPT-2 dimension comes near

std::string shape_text(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The model these sizes describe, through the config parser's own range and cross-field checks.
Config model_config(int n_layer, int n_head, int d_model, int vocab_size, int seq_len, const std::string& source) {
  return parse_config(fmt::format("model: {{n_layer: {}, n_head: {}, d_model: {}, vocab_size: {}, seq_len: {}}}\n",
                                  n_layer, n_head, d_model, vocab_size, seq_len),
                      source);
}

void read_bytes(std::ifstream& in, const fs::path& path, uint64_t offset, void* dst, size_t n,
                const std::string& what) {
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  FP8T_CHECK(in.good(), "{}: reading {} ({} bytes at byte {}) failed: the file is truncated or unreadable",
             path.string(), what, n, offset);
}

// A safetensors file: the JSON header checked entry by entry, tensors read on demand.
class Safetensors {
 public:
  struct Entry {
    std::string stored;  // the name in the file (with its "transformer." prefix, if any)
    std::string dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range in the payload
  };

  explicit Safetensors(const fs::path& path) : path_(path), in_(path, std::ios::binary) {
    FP8T_CHECK(in_, "cannot open {}: --hf takes a directory holding a GPT-2's model.safetensors and config.json "
               "(transformers writes them with save_pretrained(DIR))", path.string());
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    FP8T_CHECK(!ec && size >= 8, "{} holds {} bytes: too short for a safetensors file (it starts with an 8-byte "
               "header length)", path.string(), ec ? 0 : size);
    uint64_t n = 0;
    read_bytes(in_, path, 0, &n, sizeof n, "the header length");
    FP8T_CHECK(n <= kMaxSafetensorsHeader && n <= size - 8, "{}: the header length is {} bytes but the file holds {} "
               "after it (and the format allows at most {}): not a safetensors file, or a truncated one",
               path.string(), n, size - 8, kMaxSafetensorsHeader);
    std::string head(n, '\0');
    read_bytes(in_, path, 8, head.data(), n, "the header");
    const json h = json::parse(head, nullptr, /*allow_exceptions=*/false);
    FP8T_CHECK(!h.is_discarded() && h.is_object(), "{}: the header is not a JSON object: not a safetensors file, or "
               "a damaged one", path.string());
    payload_at_ = 8 + n;
    const uint64_t payload = size - payload_at_;
    for (const auto& [stored, t] : h.items()) {
      if (stored == "__metadata__") continue;
      const std::string where = fmt::format("{}: tensor '{}'", path.string(), stored);
      FP8T_CHECK(t.is_object() && t.contains("dtype") && t["dtype"].is_string() && t.contains("shape") &&
                     t["shape"].is_array() && t.contains("data_offsets") && t["data_offsets"].is_array() &&
                     t["data_offsets"].size() == 2,
                 "{}: its header entry lacks dtype, shape or data_offsets [begin, end]: the file is damaged", where);
      Entry e{stored, t["dtype"].get<std::string>(), {}, 0, 0};
      for (const json& d : t["shape"]) {
        FP8T_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(kMaxDim),
                   "{}: shape {} holds {}, not a dimension: the file is damaged", where, t["shape"].dump(), d.dump());
        e.shape.push_back(d.get<int64_t>());
      }
      const json& off = t["data_offsets"];
      FP8T_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                 "{}: data_offsets {} are not two byte offsets: the file is damaged", where, off.dump());
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      FP8T_CHECK(e.begin <= e.end && e.end <= payload, "{}: data_offsets [{}, {}] lie outside the {}-byte payload: "
                 "the file is truncated or damaged", where, e.begin, e.end, payload);
      std::string name = stored.starts_with("transformer.") ? stored.substr(12) : stored;
      if (const auto it = entries_.find(name); it != entries_.end())
        FP8T_FAIL("{}: holds both '{}' and '{}': one tensor twice (with and without the 'transformer.' prefix)",
                  path.string(), it->second.stored, stored);
      entries_.emplace(std::move(name), std::move(e));
    }
  }

  const std::map<std::string, Entry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.contains(name); }

  // Tensor `name` (without prefix) as f32 values, after checking that it has shape `want` (`why` says
  // what requires that shape).
  std::vector<float> read(const std::string& name, const Shape& want, const std::string& why) {
    const auto it = entries_.find(name);
    FP8T_CHECK(it != entries_.end(), "{}: tensor '{}' is missing (looked for '{}' and 'transformer.{}'): not a GPT-2 "
               "model, or an incomplete file", path_.string(), name, name, name);
    const Entry& e = it->second;
    FP8T_CHECK(e.shape == want, "{}: tensor '{}' has shape {} but {} needs {}", path_.string(), e.stored,
               shape_text(e.shape), why, shape_text(want));
    const size_t width = e.dtype == "F32" ? 4 : e.dtype == "BF16" ? 2 : 0;
    FP8T_CHECK(width != 0, "{}: tensor '{}' has dtype {}: fp8train imports F32 or BF16 tensors; save the model in one "
               "of them (e.g. model.float().save_pretrained(DIR))", path_.string(), e.stored, e.dtype);
    const auto n = static_cast<size_t>(shape_numel(want));
    FP8T_CHECK(e.end - e.begin == n * width, "{}: tensor '{}' ({} {}) spans {} bytes of the payload, not the {} its "
               "shape takes: the file is damaged", path_.string(), e.stored, e.dtype, shape_text(e.shape),
               e.end - e.begin, n * width);
    std::vector<float> v(n);
    if (width == 4) {
      read_bytes(in_, path_, payload_at_ + e.begin, v.data(), n * 4, "tensor " + e.stored);
    } else {
      std::vector<uint16_t> b(n);
      read_bytes(in_, path_, payload_at_ + e.begin, b.data(), n * 2, "tensor " + e.stored);
      for (size_t i = 0; i < n; ++i) v[i] = bf16_to_float(b[i]);
    }
    return v;
  }

 private:
  fs::path path_;
  std::ifstream in_;
  uint64_t payload_at_ = 0;
  std::map<std::string, Entry> entries_;
};

// A key of an HF config.json: present, an integer in [1, INT_MAX].
int hf_config_int(const json& j, const char* key, const fs::path& file) {
  FP8T_CHECK(j.contains(key), "{}: key '{}' is missing: a GPT-2 config.json gives n_embd, n_layer, n_head, "
             "n_positions (or n_ctx) and vocab_size", file.string(), key);
  return static_cast<int>(json_int(j, key, 1, INT_MAX, file));
}

// Writes run_dir as the trainer would after step 0 without an optimizer: the checkpoint (model.bin,
// state.json, manifest.json through finalize_checkpoint) and config.yaml.
void write_weights_run(Config cfg, ParameterStore& P, const fs::path& source, const fs::path& run_dir,
                       ImportStats& stats) {
  if (const std::string bad = nonfinite_weights(P); !bad.empty())
    FP8T_FAIL("{}: the weights hold non-finite values: {}; the file is damaged or its model diverged", source.string(),
              bad);
  std::error_code ec;
  FP8T_CHECK(!latest_checkpoint(run_dir) && !fs::exists(run_dir / "checkpoints", ec),
             "--out {} already holds checkpoints: import writes a new run directory; choose another --out (or remove "
             "{})", run_dir.string(), (run_dir / "checkpoints").string());
  fs::path named = run_dir.lexically_normal();
  if (!named.has_filename()) named = named.parent_path();
  cfg.run.name = named.filename().empty() ? std::string("imported") : named.filename().string();
  cfg.run.out_dir = run_dir.string();
  const std::string yaml = cfg.to_yaml();
  fs::create_directories(run_dir);
  const fs::path tmp = checkpoint_tmp_dir(run_dir, 0);
  write_tensor_file(tmp / "model.bin", P.master());
  write_checkpoint_state(tmp, {0, 1, 0, 0, yaml});
  stats.checkpoint = finalize_checkpoint(run_dir, 0);
  write_atomically(run_dir / "config.yaml", yaml);
  stats.model = cfg.model;
}

}  // namespace

ImportStats import_hf_gpt2(const fs::path& hf_dir, const fs::path& run_dir) {
  const fs::path cfg_file = hf_dir / "config.json";
  FP8T_CHECK(fs::exists(cfg_file), "{} has no config.json: --hf takes a Hugging Face GPT-2 model directory "
             "(config.json and model.safetensors)", hf_dir.string());
  const json hc = read_json_object(cfg_file);
  if (hc.contains("model_type"))
    FP8T_CHECK(hc["model_type"] == "gpt2", "{}: model_type is {}: fp8train imports GPT-2 models only",
               cfg_file.string(), hc["model_type"].dump());
  const char* positions = hc.contains("n_positions") ? "n_positions" : "n_ctx";
  const Config cfg = model_config(hf_config_int(hc, "n_layer", cfg_file), hf_config_int(hc, "n_head", cfg_file),
                                  hf_config_int(hc, "n_embd", cfg_file), hf_config_int(hc, "vocab_size", cfg_file),
                                  hf_config_int(hc, positions, cfg_file), cfg_file.string());
  const ModelConfig& m = cfg.model;
  ImportStats stats;
  if (hc.contains("activation_function") && hc["activation_function"] != "gelu_new")
    stats.warnings.push_back(fmt::format("{}: activation_function is {}, but fp8train's GPT-2 computes gelu_new (the "
                                         "tanh approximation): its outputs will differ slightly",
                                         cfg_file.string(), hc["activation_function"].dump()));
  if (hc.contains("layer_norm_epsilon") && hc["layer_norm_epsilon"] != 1e-5)
    stats.warnings.push_back(fmt::format("{}: layer_norm_epsilon is {}, but fp8train's LayerNorm uses 1e-5",
                                         cfg_file.string(), hc["layer_norm_epsilon"].dump()));

  const fs::path file = hf_dir / "model.safetensors";
  Safetensors st(file);
  const std::string why = fmt::format("the model of config.json (n_layer {}, n_head {}, n_embd {}, vocab_size {}, {} "
                                      "{})", m.n_layer, m.n_head, m.d_model, m.vocab_size, positions, m.seq_len);
  ParameterStore P(gpt2_param_specs(m), Device::cpu(), DType::f32, 1);  // zeros: wte's padding rows stay 0
  float* master = P.master().data<float>();
  std::set<std::string> used;
  for (const ParamSpec& s : P.specs()) {
    const std::string name = hf_tensor_name(s.name);
    const bool conv1d = is_hf_conv1d(s.name);
    Shape want = s.shape;
    if (s.name == "wte") want[0] = m.vocab_size;
    if (conv1d) want = {s.shape[1], s.shape[0]};
    const std::vector<float> v = st.read(name, want, conv1d ? why + " in Conv1D layout (in, out)" : why);
    if (conv1d) transpose(v.data(), want[0], want[1], master + s.offset);
    else std::memcpy(master + s.offset, v.data(), v.size() * sizeof(float));
    used.insert(name);
  }
  if (st.contains("lm_head.weight")) {  // saved by GPT2LMHeadModel: tied to wte, or a head we cannot hold
    const std::vector<float> head = st.read("lm_head.weight", {m.vocab_size, m.d_model}, why);
    FP8T_CHECK(std::memcmp(head.data(), master, head.size() * sizeof(float)) == 0,
               "{}: lm_head.weight differs from wte.weight: the model has an untied output layer, and fp8train's "
               "GPT-2 computes its logits with wte (tied embeddings); such a model cannot be imported",
               file.string());
    used.insert("lm_head.weight");
  }
  std::vector<std::string> unknown;  // HF's causal-mask buffers (h.N.attn.bias, .masked_bias) are not weights
  for (const auto& [name, e] : st.entries())
    if (!used.contains(name) && !name.ends_with(".attn.bias") && !name.ends_with(".attn.masked_bias"))
      unknown.push_back(e.stored);
  FP8T_CHECK(unknown.empty(), "{}: holds {} tensor(s) that are not GPT-2's ({}{}): a model with other layers cannot "
             "be imported", file.string(), unknown.size(),
             fmt::join(unknown.begin(), unknown.begin() + std::min<size_t>(unknown.size(), 4), ", "),
             unknown.size() > 4 ? ", ..." : "");
  stats.tensors = static_cast<int>(used.size());
  write_weights_run(cfg, P, file, run_dir, stats);
  return stats;
}

ImportStats import_llmc_gpt2(const fs::path& file, const fs::path& run_dir) {
  static constexpr const char* kFields[] = {"magic",      "version",   "max_seq_len", "vocab_size",
                                            "num_layers", "num_heads", "channels",    "padded_vocab_size"};
  constexpr int64_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
  std::ifstream in(file, std::ios::binary);
  FP8T_CHECK(in, "cannot open llm.c model file {}", file.string());
  std::error_code ec;
  const auto size = static_cast<int64_t>(fs::file_size(file, ec));
  FP8T_CHECK(!ec, "cannot read the size of {}: {}", file.string(), ec.message());
  FP8T_CHECK(size >= kHeaderBytes, "{} holds {} bytes, less than llm.c's {}-byte header: not an llm.c model file, or "
             "a truncated one", file.string(), size, kHeaderBytes);
  std::vector<int32_t> h(kLlmcHeaderInts);
  read_bytes(in, file, 0, h.data(), kHeaderBytes, "the header");
  FP8T_CHECK(h[0] == kLlmcMagic, "{}: header field [0] (magic) is {}, not llm.c's model magic {}: not an llm.c model "
             "file{}", file.string(), h[0], kLlmcMagic, h[0] == 20240520 ? " (20240520 is a token shard's)" : "");
  FP8T_CHECK(h[1] == kLlmcVersionF32 || h[1] == kLlmcVersionBf16, "{}: header field [1] (version) is {}: fp8train "
             "reads llm.c model files of version {} (float32 parameters) and {} (bfloat16 parameters)",
             file.string(), h[1], kLlmcVersionF32, kLlmcVersionBf16);
  for (int i = 2; i < 8; ++i)
    FP8T_CHECK(h[i] >= 1, "{}: header field [{}] ({}) is {}, not a positive count: the file is damaged",
               file.string(), i, kFields[i], h[i]);
  FP8T_CHECK(h[7] >= h[3], "{}: header field [7] (padded_vocab_size) is {}, less than field [3] (vocab_size) {}: "
             "the file is damaged", file.string(), h[7], h[3]);
  FP8T_CHECK(h[6] % h[5] == 0, "{}: header field [6] (channels) is {}, which field [5] (num_heads) {} does not "
             "divide: the file is damaged", file.string(), h[6], h[5]);
  const Config cfg = model_config(h[4], h[5], h[6], h[3], h[2], fmt::format("{} (llm.c header)", file.string()));
  const int64_t C = h[6], V = h[3], file_vocab = h[7];
  const int64_t width = h[1] == kLlmcVersionBf16 ? 2 : 4;

  ParameterStore P(gpt2_param_specs(cfg.model), Device::cpu(), DType::f32, 1);  // zeros: padding rows stay 0
  int64_t elements = 0;
  for (const ParamSpec& s : P.specs()) elements += s.name == "wte" ? file_vocab * C : s.numel();
  const int64_t want = kHeaderBytes + elements * width;
  FP8T_CHECK(size == want, "{} holds {} bytes, but its header (version {}, max_seq_len {}, vocab_size {}, num_layers "
             "{}, num_heads {}, channels {}, padded_vocab_size {}) describes {} parameters, {} bytes with the header: "
             "the file is {}", file.string(), size, h[1], h[2], h[3], h[4], h[5], h[6], h[7], elements, want,
             size < want ? "truncated" : "longer than that model (a damaged header?)");
  float* master = P.master().data<float>();
  int64_t at = kHeaderBytes;
  ImportStats stats;
  for (const size_t i : llmc_param_order(P.specs(), cfg.model.n_layer)) {
    const ParamSpec& s = P.specs()[i];
    const int64_t n = s.name == "wte" ? file_vocab * C : s.numel();
    const int64_t keep = s.name == "wte" ? V * C : n;  // the file's own padding rows are dropped
    const std::string what = "parameter " + s.name;
    if (width == 4) {
      std::vector<float> v(static_cast<size_t>(n));
      read_bytes(in, file, static_cast<uint64_t>(at), v.data(), static_cast<size_t>(n * 4), what);
      std::memcpy(master + s.offset, v.data(), static_cast<size_t>(keep) * sizeof(float));
    } else {
      std::vector<uint16_t> b(static_cast<size_t>(n));
      read_bytes(in, file, static_cast<uint64_t>(at), b.data(), static_cast<size_t>(n * 2), what);
      for (int64_t j = 0; j < keep; ++j) master[s.offset + j] = bf16_to_float(b[static_cast<size_t>(j)]);
    }
    at += n * width;
    ++stats.tensors;
  }
  write_weights_run(cfg, P, file, run_dir, stats);
  return stats;
}

bool weights_only_checkpoint(const fs::path& dir) {
  if (!fs::exists(dir / "manifest.json")) return false;  // unverifiable: a missing optimizer file may be damage
  const json m = read_json_object(dir / "manifest.json");
  if (!m.contains("files") || !m["files"].is_object()) return false;
  for (const auto& [name, entry] : m["files"].items())
    if (name.starts_with("optim_")) return false;
  return true;
}

std::string load_init_weights(const Config& cfg, ParameterStore& P) {
  const std::string& from = cfg.train.init_from;
  const auto dir = latest_checkpoint(from);
  FP8T_CHECK(dir, "{}: '{}' holds no complete checkpoint (a run directory with checkpoints/latest, or a checkpoint "
             "directory with state.json; `fp8train import` makes one from HF or llm.c weights)",
             cfg.where("train.init_from"), from);
  const std::string unverified = verify_checkpoint(*dir, CheckpointUse::inference);
  const CheckpointState s = read_checkpoint_state(*dir);
  const fs::path state_file = *dir / "state.json";
  const std::string differs = model_difference(parse_config(s.config_yaml, state_file.string()).model, cfg.model,
                                               "the checkpoint's state.json", "this run's config");
  FP8T_CHECK(differs.empty(), "{}: {} holds another model than this run: {}. Set model.* to the checkpoint's (its "
             "run directory's config.yaml has them)", cfg.where("train.init_from"), dir->string(), differs);
  load_model_weights(*dir, s.world_size, P);
  return fmt::format("train.init_from: weights of {} (written at step {}); this run starts at step 0 with fresh "
                     "optimizer and FP8 state{}", dir->string(), s.step,
                     unverified.empty() ? "" : "; warning: " + unverified);
}

}  // namespace fp8t
