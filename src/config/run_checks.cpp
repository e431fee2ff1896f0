// check_run_inputs (config.h): what a training run needs of the machine beyond a valid config, the
// data globs, the run directory and host memory, checked before anything is built.
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>

#include "config/config.h"
#include "core/allocator.h"
#include "core/check.h"
#include "data/shard.h"

namespace fp8t {
namespace {

namespace fs = std::filesystem;

std::set<std::string> canonical_files(const std::vector<std::string>& paths) {
  std::set<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(p, ec);
    out.insert(ec ? p : c.string());
  }
  return out;
}

// The files a data glob names; a glob that matches nothing is refused here, naming its key.
std::vector<std::string> files_of(const Config& cfg, const std::string& key, const std::string& glob) {
  if (glob.empty())
    throw Error(fmt::format("{}: not set; give the glob of the token shards, e.g. "
                            "data: {{train: data/brown/train_*.bin}} (see configs/tiny-cpu.yaml)",
                            cfg.where(key)));
  std::vector<std::string> files = glob_files(glob);
  if (files.empty()) {
    std::error_code ec;
    throw Error(fmt::format("{}: no files match '{}' (relative paths start at {}); fix the path "
                            "or make the shards with scripts/prepare_data.sh",
                            cfg.where(key), glob, fs::current_path(ec).string()));
  }
  return files;
}

// Every data.val set that reads training shards: a validation loss on them measures memorisation.
std::vector<std::string> check_data(const Config& cfg) {
  const std::set<std::string> train = canonical_files(files_of(cfg, "data.train", cfg.data.train));
  std::vector<std::string> warnings;
  for (const ValSet& set : cfg.data.val) {
    const std::string key = cfg.data.val.size() == 1 && set.name == "val" ? "data.val" : "data.val." + set.name;
    const std::set<std::string> val = canonical_files(files_of(cfg, key, set.glob));
    std::vector<std::string> shared;
    std::set_intersection(val.begin(), val.end(), train.begin(), train.end(), std::back_inserter(shared));
    if (shared.empty()) continue;
    warnings.push_back(fmt::format(
        "{} '{}' and data.train '{}' {} ({} of its {} shard(s), e.g. {}); its loss will measure "
        "training data: point {} at held-out shards",
        cfg.where(key), set.glob, cfg.data.train,
        set.glob == cfg.data.train ? "are the same glob" : "match the same files", shared.size(),
        val.size(), shared.front(), key));
  }
  return warnings;
}

// The nearest existing ancestor of `dir` (itself included) that is not a directory, or "".
std::string file_in_the_way(const fs::path& dir) {
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    const auto st = fs::status(p, ec);
    if (fs::exists(st)) return fs::is_directory(st) ? "" : p.string();
    if (p == p.parent_path()) break;
  }
  return "";
}

// Creates run.out_dir and proves it writable by creating and removing a file (root passes every
// permission check, so access(2) would not tell).
void check_out_dir(const Config& cfg) {
  const std::string& dir = cfg.run.out_dir;
  if (dir.empty())
    throw Error(fmt::format("{}: is empty; give the run directory, e.g. runs/{}", cfg.where("run.out_dir"),
                            cfg.run.name));
  auto refuse = [&](const std::string& why) {
    throw Error(fmt::format("{}: cannot use '{}' as the run directory: {}; choose another run.out_dir",
                            cfg.where("run.out_dir"), dir, why));
  };
  if (const std::string file = file_in_the_way(dir); !file.empty())
    refuse(file == dir ? "it is a file, not a directory" : fmt::format("'{}' is a file, not a directory", file));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) refuse(fmt::format("creating it failed: {}", ec.message()));
  if (!fs::is_directory(dir, ec)) refuse("it is not a directory");
  const std::string probe = (fs::path(dir) / fmt::format(".fp8train-write-test-{}", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) refuse(fmt::format("it is not writable: {}", std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

// Physical memory, or the cgroup's limit when that is lower (containers); 0 if unknown.
int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  int64_t bytes = pages > 0 && page > 0 ? int64_t{pages} * page : 0;
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  int64_t cgroup = 0;
  if (limit >> cgroup && cgroup > 0 && (bytes == 0 || cgroup < bytes)) bytes = cgroup;
  return bytes;
}

// A CPU run holds weights and gradients in f32 plus AdamW's two moments; if that alone exceeds the
// machine, the allocations may each succeed (overcommit) and the kernel kill the run mid-init.
void check_host_memory(const Config& cfg) {
  if (!cfg.run.device.is_cpu()) return;
  const int64_t memory = host_memory_bytes();
  if (memory == 0) return;
  const double moments = cfg.optim.state_dtype == StateDtype::fp32   ? 8
                         : cfg.optim.state_dtype == StateDtype::bf16 ? 4
                                                                     : 3;
  const double per_param = 8 + moments;
  const double need = static_cast<double>(cfg.model.parameter_count()) * per_param;
  if (need <= static_cast<double>(memory)) return;
  constexpr double kGiB = 1 << 30;
  throw Error(fmt::format(
      "{}: model: a CPU run of this model (n_layer = {}, d_model = {}, vocab_size = {}) needs at least "
      "{:.1f} GiB of host memory for its {:.3g} parameters ({} bytes each: weights, gradients, AdamW "
      "moments), more than the {:.1f} GiB this machine has; lower model.n_layer, model.d_model or "
      "model.vocab_size",
      cfg.source, cfg.model.n_layer, cfg.model.d_model, cfg.model.vocab_size, need / kGiB,
      static_cast<double>(cfg.model.parameter_count()), per_param, memory / kGiB));
}

}  // namespace

void check_device(const Config& cfg) {
  if (!cfg.run.device.is_cuda()) return;
  // The CUDA kernels take bf16 activations (BF16 and FP8 modes); f32 compute is the CPU's. Said before the
  // device's availability, so the config's own defect is named first.
  if (cfg.precision.compute == ComputeMode::fp32)
    throw Error(fmt::format("{}: fp32, but on {} the kernels compute in bf16; set precision.compute to bf16 (BF16 "
                            "mode: f32 master weights, bf16 activations) or fp8, or run.device to cpu",
                            cfg.where("precision.compute"), cfg.run.device.str()));
  if (const std::string why = cuda_unavailable_reason(); !why.empty())
    throw Error(fmt::format("{}: {}, but {}", cfg.where("run.device"), cfg.run.device.str(), why));
}

std::vector<std::string> check_run_inputs(const Config& cfg) {
  check_device(cfg);
  std::vector<std::string> warnings = check_data(cfg);
  if (std::error_code ec; !cfg.train.init_from.empty() && !fs::is_directory(cfg.train.init_from, ec))
    throw Error(fmt::format("{}: '{}' is not a directory; give a run or checkpoint directory (fp8train import "
                            "writes one from HF or llm.c weights)", cfg.where("train.init_from"), cfg.train.init_from));
  check_host_memory(cfg);
  check_out_dir(cfg);
  return warnings;
}

}  // namespace fp8t
