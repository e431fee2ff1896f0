// Atomic checkpoint files.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace fp8t {

namespace fs = std::filesystem;

namespace {
std::string step_name(int step) { return fmt::format("step_{:08d}", step); }

void write_file_synced(const fs::path& path, const void* data, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  FP8T_CHECK(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      FP8T_FAIL("writing {} failed: {} (is the disk full?)", path.string(), std::strerror(e));
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
}

void replace_atomically(const fs::path& tmp, const fs::path& dst) {
  std::error_code ec;
  fs::rename(tmp, dst, ec);
  FP8T_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), dst.string(), ec.message());
}
}  // namespace

fs::path checkpoint_tmp_dir(const fs::path& run_dir, int step) {
  fs::path dir = run_dir / "checkpoints" / fmt::format(".{}.tmp", step_name(step));
  fs::create_directories(dir);
  return dir;
}

void write_tensor_file(const fs::path& path, const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu(), MemCategory::workspace);
  write_file_synced(path, host.raw(), host.nbytes());
}

void read_tensor_file(const fs::path& path, Tensor& t) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  FP8T_CHECK(in, "cannot open checkpoint file {}", path.string());
  const auto size = static_cast<size_t>(in.tellg());
  FP8T_CHECK(size == t.nbytes(),
             "checkpoint file {} holds {} bytes but the model expects {}: was it written with another "
             "model config or world size?",
             path.string(), size, t.nbytes());
  in.seekg(0);
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu(), MemCategory::workspace);
  in.read(static_cast<char*>(host.raw()), static_cast<std::streamsize>(size));
  FP8T_CHECK(in, "reading {} failed", path.string());
  t.copy_from(host);
}

void read_tensor_prefix(const fs::path& path, Tensor& t) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  FP8T_CHECK(!ec, "cannot open checkpoint file {}: {}", path.string(), ec.message());
  FP8T_CHECK(size >= t.nbytes(), "{} holds {} bytes, fewer than the {} its model config needs", path.string(), size,
             t.nbytes());
  Tensor full = Tensor::empty({static_cast<int64_t>(size / dtype_size(t.dtype()))}, t.dtype(), Device::cpu(),
                              MemCategory::workspace);
  read_tensor_file(path, full);
  t.copy_from(full.slice_flat(0, t.shape()));
}

void write_checkpoint_state(const fs::path& dir, const CheckpointState& s) {
  nlohmann::json j = {{"step", s.step},         {"world_size", s.world_size}, {"zero_stage", s.zero_stage},
                      {"tokens", s.tokens},     {"config", s.config_yaml},    {"format", "fp8train-checkpoint-1"}};
  const std::string text = j.dump(2);
  write_file_synced(dir / "state.json", text.data(), text.size());
}

CheckpointState read_checkpoint_state(const fs::path& dir) {
  std::ifstream in(dir / "state.json");
  FP8T_CHECK(in, "{} has no state.json: not a checkpoint directory", dir.string());
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    FP8T_FAIL("{}: {}", (dir / "state.json").string(), e.what());
  }
  CheckpointState s;
  s.step = j.at("step");
  s.world_size = j.at("world_size");
  s.zero_stage = j.at("zero_stage");
  s.tokens = j.at("tokens");
  s.config_yaml = j.at("config");
  return s;
}

fs::path finalize_checkpoint(const fs::path& run_dir, int step) {
  const fs::path ck = run_dir / "checkpoints";
  const fs::path dst = ck / step_name(step);
  std::error_code ec;
  fs::remove_all(dst, ec);  // a re-run of the same step replaces only its own directory
  replace_atomically(ck / fmt::format(".{}.tmp", step_name(step)), dst);
  const std::string name = step_name(step);
  write_file_synced(ck / "latest.tmp", name.data(), name.size());
  replace_atomically(ck / "latest.tmp", ck / "latest");
  return dst;
}

std::optional<fs::path> latest_checkpoint(const fs::path& p) {
  if (fs::exists(p / "state.json")) return p;
  const fs::path ck = p / "checkpoints";
  std::ifstream in(ck / "latest");
  if (!in) return std::nullopt;
  std::string name;
  in >> name;
  if (name.empty() || !fs::exists(ck / name / "state.json")) return std::nullopt;
  return ck / name;
}

}  // namespace fp8t
