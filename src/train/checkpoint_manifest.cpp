// manifest.json: assembled from the files' digests when a checkpoint is finalized, verified against the
// files and the model before a checkpoint is used.
#include "train/checkpoint_manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/check.h"
#include "core/crc32c.h"
#include "nn/gpt.h"
#include "train/checkpoint.h"

namespace fp8t {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifest = "manifest.json";

fs::path digest_path(const fs::path& file) {
  return file.parent_path() / fmt::format(".{}.digest", file.filename().string());
}
bool is_digest(const std::string& name) { return name.starts_with('.') && name.ends_with(".digest"); }

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

uint32_t json_hex32(const json& obj, const char* key, const fs::path& file) {
  const std::string s = json_string(obj, key, file);
  FP8T_CHECK(s.size() == 8 && s.find_first_not_of("0123456789abcdef") == std::string::npos,
             "{}: key '{}' is \"{}\", not a CRC32C (8 lowercase hex digits): the file is damaged", file.string(), key,
             s.substr(0, 40));
  return static_cast<uint32_t>(std::stoul(s, nullptr, 16));
}

// The model a config describes, as the manifest records it.
struct ModelIdentity {
  ModelConfig shape;
  int64_t parameters = 0;      // as GPT-2 counts them (padded vocabulary rows excluded)
  int64_t elements = 0;        // values in one copy of the model (model.bin before its world-size padding)
  uint32_t config_crc32c = 0;  // of the model-defining config fields, written canonically
};

ModelIdentity identity_of(const ModelConfig& m) {
  ModelIdentity id{m};
  for (const ParamSpec& s : gpt2_param_specs(m)) id.elements += s.numel();
  id.parameters = id.elements - static_cast<int64_t>(m.padded_vocab() - m.vocab_size) * m.d_model;
  const std::string canonical = fmt::format("arch={} n_layer={} n_head={} d_model={} vocab_size={} seq_len={}",
                                            m.arch, m.n_layer, m.n_head, m.d_model, m.vocab_size, m.seq_len);
  id.config_crc32c = crc32c(canonical.data(), canonical.size());
  return id;
}

json identity_json(const ModelIdentity& id) {
  const ModelConfig& m = id.shape;
  return {{"arch", m.arch},         {"n_layer", m.n_layer},   {"n_head", m.n_head},
          {"d_model", m.d_model},   {"vocab_size", m.vocab_size}, {"seq_len", m.seq_len},
          {"parameters", id.parameters}, {"elements", id.elements}, {"config_crc32c", hex32(id.config_crc32c)}};
}

ModelIdentity identity_from_json(const json& j, const fs::path& file) {
  FP8T_CHECK(j.contains("model") && j.at("model").is_object(), "{}: key 'model' is missing or not an object",
             file.string());
  const json& m = j.at("model");
  ModelIdentity id;
  id.shape.arch = json_string(m, "arch", file);
  id.shape.n_layer = static_cast<int>(json_int(m, "n_layer", 1, INT_MAX, file));
  id.shape.n_head = static_cast<int>(json_int(m, "n_head", 1, INT_MAX, file));
  id.shape.d_model = static_cast<int>(json_int(m, "d_model", 1, INT_MAX, file));
  id.shape.vocab_size = static_cast<int>(json_int(m, "vocab_size", 1, INT_MAX, file));
  id.shape.seq_len = static_cast<int>(json_int(m, "seq_len", 1, INT_MAX, file));
  id.parameters = json_int(m, "parameters", 1, INT64_MAX, file);
  id.elements = json_int(m, "elements", 1, INT64_MAX, file);
  id.config_crc32c = json_hex32(m, "config_crc32c", file);
  return id;
}

// CRC32C of a whole file, read in 1 MiB chunks (checksummed while in cache).
uint32_t file_crc32c(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  FP8T_CHECK(fd >= 0, "cannot open {}: {}", path.string(), std::strerror(errno));
  std::vector<char> buf(size_t{1} << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : 0;
      ::close(fd);
      FP8T_CHECK(n == 0, "reading {} failed: {}", path.string(), std::strerror(e));
      return crc;
    }
    crc = crc32c_extend(crc, buf.data(), static_cast<size_t>(n));
  }
}

// A file name a manifest may list: a plain name inside the checkpoint directory.
bool plain_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && !name.starts_with('.') && name != kManifest;
}

std::vector<fs::path> directory_entries(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) out.push_back(it->path());
  FP8T_CHECK(!ec, "cannot list checkpoint directory {}: {}", dir.string(), ec.message());
  return out;
}

}  // namespace

std::string model_difference(const ModelConfig& found, const ModelConfig& expected, const std::string& found_in,
                             const std::string& expected_in) {
  std::string diff;
  auto field = [&](const char* key, const auto& a, const auto& b) {
    if (a == b) return;
    diff += fmt::format("{}model.{} is {} in {} but {} in {}", diff.empty() ? "" : "; ", key, a, found_in, b,
                        expected_in);
  };
  field("arch", found.arch, expected.arch);
  field("n_layer", found.n_layer, expected.n_layer);
  field("n_head", found.n_head, expected.n_head);
  field("d_model", found.d_model, expected.d_model);
  field("vocab_size", found.vocab_size, expected.vocab_size);
  field("seq_len", found.seq_len, expected.seq_len);
  return diff;
}

void record_file_digest(const fs::path& file, uint64_t bytes, uint32_t crc32c) {
  const std::string text = json{{"bytes", bytes}, {"crc32c", hex32(crc32c)}}.dump();
  write_file_synced(digest_path(file), text.data(), text.size());
}

void write_manifest(const fs::path& dir) {
  const CheckpointState s = read_checkpoint_state(dir);
  const Config cfg = parse_config(s.config_yaml, (dir / "state.json").string());
  json files = json::object();
  std::vector<fs::path> digests;
  for (const fs::path& p : directory_entries(dir)) {
    const std::string name = p.filename().string();
    if (is_digest(name)) digests.push_back(p);
    if (!plain_name(name)) continue;
    const fs::path dp = digest_path(p);
    FP8T_CHECK(fs::exists(dp), "checkpoint file {} was written without a digest (not through write_checkpoint_file)",
               p.string());
    const json d = read_json_object(dp);
    const int64_t bytes = json_int(d, "bytes", 0, INT64_MAX, dp);
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    FP8T_CHECK(!ec && static_cast<int64_t>(size) == bytes, "checkpoint file {} changed while it was written: {} bytes, "
               "{} when written (two runs writing one directory?)", p.string(), ec ? -1 : static_cast<int64_t>(size),
               bytes);
    files[name] = {{"bytes", bytes}, {"crc32c", hex32(json_hex32(d, "crc32c", dp))}};
  }
  const json manifest = {{"format_version", kCheckpointFormatVersion},
                         {"model", identity_json(identity_of(cfg.model))},
                         {"files", files}};
  const std::string text = manifest.dump(2) + "\n";
  write_file_synced(dir / kManifest, text.data(), text.size());
  for (const fs::path& d : digests) fs::remove(d);
}

std::string verify_checkpoint(const fs::path& dir, CheckpointUse use) {
  const fs::path mf = dir / kManifest;
  if (!fs::exists(mf))
    return fmt::format("checkpoint {} has no manifest.json (format version 1, written before fp8train checksummed "
                       "its checkpoints): its files cannot be verified; the next checkpoint a run resumed from it "
                       "saves adds one",
                       dir.string());
  const json j = read_json_object(mf);
  const int64_t version = json_int(j, "format_version", 2, INT_MAX, mf);
  FP8T_CHECK(version <= kCheckpointFormatVersion,
             "{}: format_version {} is newer than this fp8train reads ({}): use the fp8train that wrote it",
             mf.string(), version, kCheckpointFormatVersion);

  FP8T_CHECK(j.contains("files") && j.at("files").is_object() && !j.at("files").empty(),
             "{}: key 'files' is missing, empty or not an object: the manifest is damaged", mf.string());
  const json& files = j.at("files");
  for (const auto& [name, d] : files.items()) {
    FP8T_CHECK(plain_name(name), "{}: lists \"{}\", not a file name inside the checkpoint: the manifest is damaged",
               mf.string(), name.substr(0, 80));
    FP8T_CHECK(d.is_object(), "{}: the entry of {} is not an object: the manifest is damaged", mf.string(), name);
    const int64_t bytes = json_int(d, "bytes", 0, INT64_MAX, mf);
    const uint32_t crc = json_hex32(d, "crc32c", mf);
    const fs::path f = dir / name;
    std::error_code ec;
    const auto size = static_cast<int64_t>(fs::file_size(f, ec));
    FP8T_CHECK(!ec, "checkpoint file {} is listed in manifest.json but cannot be read ({}): the checkpoint is "
               "incomplete; use an earlier one", f.string(), ec.message());
    FP8T_CHECK(size == bytes, "checkpoint file {} holds {} bytes but manifest.json records {}: it was {} after the "
               "checkpoint was written; use an earlier checkpoint", f.string(), size, bytes,
               size < bytes ? "truncated" : "extended or replaced");
    if (use == CheckpointUse::inference && name != "model.bin" && name != "state.json") continue;
    const uint32_t got = file_crc32c(f);
    FP8T_CHECK(got == crc, "checkpoint file {}: checksum mismatch, CRC32C {} but manifest.json records {}: its bytes "
               "changed after it was written (a damaged disk or copy?); use an earlier checkpoint", f.string(),
               hex32(got), hex32(crc));
  }
  for (const fs::path& p : directory_entries(dir)) {
    const std::string name = p.filename().string();
    FP8T_CHECK(!plain_name(name) || files.contains(name),
               "checkpoint file {} is not listed in manifest.json: it was added after the checkpoint was written; "
               "remove it", p.string());
  }

  // The files are sound, state.json among them: the model it describes must be the one recorded.
  const CheckpointState s = read_checkpoint_state(dir);
  const fs::path state_file = dir / "state.json";
  const ModelIdentity found = identity_from_json(j, mf);
  const ModelIdentity want = identity_of(parse_config(s.config_yaml, state_file.string()).model);
  const std::string diff = model_difference(found.shape, want.shape, "manifest.json", "state.json's config");
  FP8T_CHECK(diff.empty(), "checkpoint {}: state.json describes another model than its manifest records: {}",
             dir.string(), diff);
  FP8T_CHECK(found.parameters == want.parameters && found.elements == want.elements,
             "{}: the model has {} parameters ({} stored values) but state.json's config gives {} ({}): written by "
             "an fp8train with another GPT-2 parameter layout",
             mf.string(), found.parameters, found.elements, want.parameters, want.elements);
  FP8T_CHECK(found.config_crc32c == want.config_crc32c,
             "{}: model config hash {} but state.json's config hashes to {}: written by an fp8train with other "
             "model settings",
             mf.string(), hex32(found.config_crc32c), hex32(want.config_crc32c));
  return "";
}

}  // namespace fp8t
