// Atomic checkpoint files, state.json and model.bin, each checked as it is read.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/crc32c.h"
#include "core/dtype.h"
#include "train/checkpoint_manifest.h"

namespace fp8t {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kStateFormat = "fp8train-checkpoint-2";
constexpr int kMaxWorldSize = 1 << 20;

std::string step_name(int step) { return fmt::format("step_{:08d}", step); }

// "step_" and at least eight digits: what `latest` may name (never a path out of checkpoints/).
bool is_step_name(const std::string& name) {
  return name.size() >= 13 && name.starts_with("step_") &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

void replace_atomically(const fs::path& tmp, const fs::path& dst) {
  std::error_code ec;
  fs::rename(tmp, dst, ec);
  FP8T_CHECK(!ec, "cannot rename {} to {}: {}", tmp.string(), dst.string(), ec.message());
}

// A JSON value as an error message shows it: compact, cut at 60 characters.
std::string shown(const json& v) {
  const std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

// Refuses a NaN or Inf among the weights w (P's layout), naming the first one's parameter and element.
void check_finite_weights(const float* w, const std::vector<ParamSpec>& specs, const fs::path& file) {
  for (const ParamSpec& s : specs) {
    const float* p = w + s.offset;
    const int64_t n = s.numel();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {  // exponent all ones: Inf or NaN (branch-free, so it vectorizes)
      uint32_t u;
      std::memcpy(&u, p + i, sizeof u);
      bad += (u & 0x7F800000u) == 0x7F800000u;
    }
    if (bad == 0) continue;
    int64_t first = 0;
    while (std::isfinite(p[first])) ++first;
    const std::string where = s.shape.size() == 2 ? fmt::format(" (row {}, column {})", first / s.shape[1],
                                                                first % s.shape[1])
                                                  : "";
    FP8T_FAIL("{}: parameter {} holds {} non-finite value(s); the first is element {}{} = {}. The run that wrote "
              "this checkpoint diverged or the file is damaged: use an earlier checkpoint",
              file.string(), s.name, bad, first, where, p[first]);
  }
}

}  // namespace

// ---- writing

fs::path checkpoint_tmp_dir(const fs::path& run_dir, int step) {
  fs::path dir = run_dir / "checkpoints" / fmt::format(".{}.tmp", step_name(step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  FP8T_CHECK(!ec, "cannot create checkpoint directory {}: {}", dir.string(), ec.message());
  return dir;
}

uint32_t write_file_synced(const fs::path& path, const void* data, size_t n) {
  constexpr size_t kChunk = size_t{4} << 20;  // checksummed while still in cache, then written
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  FP8T_CHECK(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  uint32_t crc = 0;
  for (size_t done = 0; done < n;) {
    const size_t chunk = std::min(kChunk, n - done);
    crc = crc32c_extend(crc, p + done, chunk);
    for (size_t off = 0; off < chunk;) {
      const ssize_t w = ::write(fd, p + done + off, chunk - off);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const int e = errno;
        ::close(fd);
        FP8T_FAIL("writing {} failed: {} (is the disk full?)", path.string(), std::strerror(e));
      }
      off += static_cast<size_t>(w);
    }
    done += chunk;
  }
  const bool synced = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  FP8T_CHECK(synced, "writing {} failed at fsync: {} (is the disk full?)", path.string(), std::strerror(e));
  return crc;
}

void write_checkpoint_file(const fs::path& path, const void* data, size_t n) {
  record_file_digest(path, n, write_file_synced(path, data, n));
}

void write_checkpoint_text(const fs::path& path, std::string_view text) {
  write_checkpoint_file(path, text.data(), text.size());
}

void write_tensor_file(const fs::path& path, const Tensor& t) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu(), MemCategory::workspace);
  write_checkpoint_file(path, host.raw(), host.nbytes());
}

void write_checkpoint_state(const fs::path& dir, const CheckpointState& s) {
  const json j = {{"step", s.step},     {"world_size", s.world_size}, {"zero_stage", s.zero_stage},
                  {"tokens", s.tokens}, {"config", s.config_yaml},    {"format", kStateFormat},
                  {"skipped_steps", s.skipped_steps}};
  write_checkpoint_text(dir / "state.json", j.dump(2));
}

fs::path finalize_checkpoint(const fs::path& run_dir, int step) {
  const fs::path ck = run_dir / "checkpoints";
  const fs::path tmp = ck / fmt::format(".{}.tmp", step_name(step)), dst = ck / step_name(step);
  write_manifest(tmp);
  std::error_code ec;
  fs::remove_all(dst, ec);  // a re-run of the same step replaces only its own directory
  replace_atomically(tmp, dst);
  const std::string name = step_name(step);
  write_file_synced(ck / "latest.tmp", name.data(), name.size());
  replace_atomically(ck / "latest.tmp", ck / "latest");
  return dst;
}

// ---- reading

namespace {

// The newest step directory of ck with a state.json other than `skip`, for the message; "" when none.
std::string other_complete_checkpoint(const fs::path& ck, const std::string& skip) {
  std::string best;
  std::error_code ec;
  for (fs::directory_iterator it(ck, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name != skip && is_step_name(name) && name > best && fs::exists(it->path() / "state.json", ec)) best = name;
  }
  return best.empty() ? "" : fmt::format("; {} is complete: pass that directory instead", (ck / best).string());
}

}  // namespace

std::optional<fs::path> latest_checkpoint(const fs::path& p, std::string* why) {
  std::error_code ec;
  if (fs::exists(p / "state.json", ec)) return p;
  const fs::path ck = p / "checkpoints", latest = ck / "latest";
  auto none = [&](std::string reason) -> std::optional<fs::path> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (!fs::exists(p, ec)) return none(fmt::format("{} does not exist", p.string()));
  if (!fs::exists(latest, ec))
    return none(fmt::format("{} has no state.json (it is no checkpoint directory) and there is no {} (it is no run "
                            "directory with a checkpoint){}",
                            p.string(), latest.string(), other_complete_checkpoint(ck, "")));
  std::ifstream in(latest);
  if (!in) return none(fmt::format("cannot read {}: {}", latest.string(), std::strerror(errno)));
  std::string name;
  in >> name;
  if (name.empty())
    return none(fmt::format("{} is empty, where it names the newest checkpoint (step_NNNNNNNN){}", latest.string(),
                            other_complete_checkpoint(ck, "")));
  if (!is_step_name(name))
    return none(fmt::format("{} names {}, which is not a checkpoint directory name (step_NNNNNNNN){}",
                            latest.string(), shown(json(name)), other_complete_checkpoint(ck, "")));
  if (!fs::is_directory(ck / name, ec))
    return none(fmt::format("{} names {}, but {} does not exist{}", latest.string(), name, (ck / name).string(),
                            other_complete_checkpoint(ck, name)));
  if (!fs::exists(ck / name / "state.json", ec))
    return none(fmt::format("{} (named by {}) has no state.json: the checkpoint is incomplete or damaged{}",
                            (ck / name).string(), latest.string(), other_complete_checkpoint(ck, name)));
  return ck / name;
}

json read_json_object(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FP8T_CHECK(in, "cannot open {}", path.string());
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  FP8T_CHECK(!j.is_discarded(), "{} is not valid JSON: the file is damaged (truncated or overwritten?)",
             path.string());
  FP8T_CHECK(j.is_object(), "{} holds {} where a JSON object was expected: the file is damaged", path.string(),
             shown(j));
  return j;
}

int64_t json_int(const json& obj, const char* key, int64_t lo, int64_t hi, const fs::path& file) {
  FP8T_CHECK(obj.contains(key), "{}: key '{}' is missing: the file is damaged or was not written by fp8train",
             file.string(), key);
  const json& v = obj.at(key);
  // An unsigned value past INT64_MAX does not fit; a float (3.5, 4e50, even 2.0) is not a count.
  const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX);
  FP8T_CHECK(fits && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
             "{}: key '{}' is {}, not an integer in [{}, {}]: the file is damaged", file.string(), key, shown(v), lo,
             hi);
  return v.get<int64_t>();
}

std::string json_string(const json& obj, const char* key, const fs::path& file) {
  FP8T_CHECK(obj.contains(key), "{}: key '{}' is missing: the file is damaged or was not written by fp8train",
             file.string(), key);
  const json& v = obj.at(key);
  FP8T_CHECK(v.is_string(), "{}: key '{}' is {}, not a string: the file is damaged", file.string(), key, shown(v));
  return v.get<std::string>();
}

CheckpointState read_checkpoint_state(const fs::path& dir) {
  const fs::path file = dir / "state.json";
  FP8T_CHECK(fs::exists(file), "{} has no state.json: not a checkpoint directory", dir.string());
  const json j = read_json_object(file);
  if (j.contains("format")) {
    const std::string format = json_string(j, "format", file);
    FP8T_CHECK(format == "fp8train-checkpoint-1" || format == kStateFormat,
               "{}: key 'format' is \"{}\", not a checkpoint format this fp8train reads (fp8train-checkpoint-1 or "
               "-2)", file.string(), format.substr(0, 60));
  }
  CheckpointState s;
  s.step = static_cast<int>(json_int(j, "step", 0, INT_MAX, file));
  s.world_size = static_cast<int>(json_int(j, "world_size", 1, kMaxWorldSize, file));
  s.zero_stage = static_cast<int>(json_int(j, "zero_stage", 0, 2, file));
  s.tokens = json_int(j, "tokens", 0, INT64_MAX, file);
  s.config_yaml = json_string(j, "config", file);
  if (j.contains("skipped_steps")) s.skipped_steps = static_cast<int>(json_int(j, "skipped_steps", 0, s.step, file));
  Config cfg;
  try {
    cfg = parse_config(s.config_yaml, fmt::format("{} (key 'config')", file.string()));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    FP8T_FAIL("{}: key 'config' does not hold a readable config ({}): the file is damaged", file.string(), e.what());
  }
  FP8T_CHECK(s.step <= cfg.train.max_steps,
             "{}: key 'step' is {}, past the train.max_steps {} of the config it records: the file is damaged",
             file.string(), s.step, cfg.train.max_steps);
  FP8T_CHECK(s.zero_stage == cfg.distributed.zero_stage,
             "{}: key 'zero_stage' is {} but the config it records has distributed.zero_stage {}: the file is damaged",
             file.string(), s.zero_stage, cfg.distributed.zero_stage);
  return s;
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

void load_model_weights(const fs::path& dir, int world_size, ParameterStore& P) {
  FP8T_CHECK(world_size >= 1, "load_model_weights: world size {} must be >= 1", world_size);
  const fs::path file = dir / "model.bin";
  const int64_t numel = P.numel(), padded = (numel + world_size - 1) / world_size * world_size;
  std::error_code ec;
  const auto bytes = static_cast<int64_t>(fs::file_size(file, ec));
  FP8T_CHECK(!ec, "cannot open checkpoint file {}: {}", file.string(), ec.message());
  FP8T_CHECK(bytes == padded * 4,
             "checkpoint file {} holds {} bytes, but the model its state.json describes ({} values, padded to a "
             "multiple of the {} rank(s) that wrote it) takes exactly {}: the file is {}",
             file.string(), bytes, numel, world_size, padded * 4,
             bytes < padded * 4 ? "truncated" : "longer than that model (another model's, or state.json is damaged)");
  Tensor host = Tensor::empty({padded}, DType::f32, Device::cpu(), MemCategory::workspace);
  read_tensor_file(file, host);
  check_finite_weights(host.data<float>(), P.specs(), file);
  P.set_master(host.data<float>());  // the part this rank keeps, and its compute copies
}

namespace {

// "parameter h.0.attn.qkv.weight, element 17" for element x of the flat master layout; "" in the padding.
std::string parameter_of(int64_t x, const std::vector<ParamSpec>& specs) {
  for (const ParamSpec& s : specs)
    if (x >= s.offset && x < s.offset + s.numel())
      return fmt::format(" (parameter {}, element {})", s.name, x - s.offset);
  return "";
}

// The first non-finite value of elements [b, e) of `file`, an array of `dtype`: its index, or -1.
int64_t first_nonfinite(const fs::path& file, DType dtype, int64_t b, int64_t e, float* value) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  const auto size = static_cast<int64_t>(dtype_size(dtype));
  std::ifstream in(file, std::ios::binary);
  FP8T_CHECK(in, "cannot open checkpoint file {}", file.string());
  in.seekg(static_cast<std::streamoff>(b * size));
  std::vector<char> buf(static_cast<size_t>(std::min(kChunk, std::max<int64_t>(e - b, 0)) * size));
  for (int64_t at = b; at < e;) {
    const int64_t n = std::min(kChunk, e - at);
    in.read(buf.data(), static_cast<std::streamsize>(n * size));
    FP8T_CHECK(in, "reading {} failed at element {}", file.string(), at);
    for (int64_t i = 0; i < n; ++i) {
      const char* p = buf.data() + i * size;
      bool bad = false;
      if (dtype == DType::f32) {
        uint32_t u;
        std::memcpy(&u, p, 4);
        bad = (u & 0x7F800000u) == 0x7F800000u;
        if (bad) std::memcpy(value, p, 4);
      } else if (dtype == DType::bf16) {
        uint16_t u;
        std::memcpy(&u, p, 2);
        bad = (u & 0x7F80u) == 0x7F80u;
        if (bad) *value = bf16_to_float(u);
      } else if (dtype == DType::e4m3) {
        const auto c = static_cast<uint8_t>(*p);
        bad = (c & 0x7Fu) == 0x7Fu;  // E4M3's only non-finite codes: NaN
        if (bad) *value = fp8_to_float(c, Fp8Format::e4m3);
      }
      if (bad) return at + i;
    }
    at += n;
  }
  return -1;
}

}  // namespace

void check_finite_optimizer_state(const fs::path& dir, int files, int64_t begin, int64_t end,
                                  const std::vector<ParamSpec>& specs) {
  DType m_dtype = DType::f32, v_dtype = DType::f32;  // checkpoints from before optim_state.json: f32
  if (const fs::path state = dir / "optim_state.json"; fs::exists(state)) {
    const json j = read_json_object(state);
    m_dtype = dtype_from_name(json_string(j, "m", state));
    v_dtype = dtype_from_name(json_string(j, "v", state));
  }
  struct Moment {
    const char* prefix;
    const char* what;
    DType dtype;
  };
  const Moment moments[] = {{"optim_rank", "first moment (m)", m_dtype}, {"optim_v_rank", "second moment (v)", v_dtype}};
  for (const Moment& mo : moments) {
    int64_t start = 0;  // the logical index of this file's first element
    for (int r = 0; r < files; ++r) {
      const fs::path file = dir / fmt::format("{}{}.bin", mo.prefix, r);
      std::error_code ec;
      const auto n = static_cast<int64_t>(fs::file_size(file, ec) / dtype_size(mo.dtype));
      FP8T_CHECK(!ec, "checkpoint is missing {} ({})", file.string(), ec.message());
      const int64_t b = std::max(begin, start), e = std::min(end, start + n);
      float value = 0.0f;
      if (b < e) {
        if (const int64_t bad = first_nonfinite(file, mo.dtype, b - start, e - start, &value); bad >= 0)
          FP8T_FAIL("{}: element {} of the optimizer's {} is {}{}, where AdamW's moments are always finite: the "
                    "file is damaged (or the run that wrote it diverged): resume from an earlier checkpoint",
                    file.string(), bad, mo.what, value, parameter_of(start + bad, specs));
      }
      if (mo.dtype == DType::e4m3) {  // m's per-block scales (small: every rank checks them all)
        const fs::path sf = dir / fmt::format("optim_mscale_rank{}.bin", r);
        const auto blocks = static_cast<int64_t>(fs::file_size(sf, ec) / 4);
        FP8T_CHECK(!ec, "checkpoint is missing {} ({})", sf.string(), ec.message());
        if (const int64_t bad = first_nonfinite(sf, DType::f32, 0, blocks, &value); bad >= 0)
          FP8T_FAIL("{}: block scale {} of the optimizer's fp8 first moment is {}, where every scale is finite: the "
                    "file is damaged: resume from an earlier checkpoint",
                    sf.string(), bad, value);
      }
      start += n;
    }
  }
}

ModelCheckpoint open_model_checkpoint(const fs::path& run_or_ckpt_dir) {
  std::string why;
  const auto dir = latest_checkpoint(run_or_ckpt_dir, &why);
  FP8T_CHECK(dir, "no complete checkpoint under {} (expected checkpoints/latest naming one, or a checkpoint "
             "directory with a state.json): {}", run_or_ckpt_dir.string(), why);
  ModelCheckpoint ck;
  ck.dir = *dir;
  ck.warning = verify_checkpoint(*dir, CheckpointUse::inference);
  ck.state = read_checkpoint_state(*dir);
  ck.config = parse_config(ck.state.config_yaml, (*dir / "state.json").string());
  return ck;
}

}  // namespace fp8t
