// Logger and metrics file.
#include "train/metrics.h"

#include <optional>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sstream>

#include "core/check.h"

namespace fp8t {

std::shared_ptr<spdlog::logger> make_run_logger(const std::filesystem::path& run_dir, int rank) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::vector<spdlog::sink_ptr> sinks{console};
  if (rank == 0) {
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>((run_dir / "log.txt").string(), false));
  } else {
    console->set_level(spdlog::level::warn);
  }
  auto logger = std::make_shared<spdlog::logger>(fmt::format("rank{}", rank), sinks.begin(), sinks.end());
  logger->set_pattern(rank == 0 ? "[%H:%M:%S] %v" : "[%H:%M:%S rank " + std::to_string(rank) + "] %v");
  logger->flush_on(spdlog::level::info);
  return logger;
}

namespace {
// A metrics row's step; none for a row without one (or a line that is not a JSON object).
std::optional<int64_t> row_step(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("step") || !j.at("step").is_number_integer()) return std::nullopt;
  return j.at("step").get<int64_t>();
}
}  // namespace

MetricsWriter::MetricsWriter(const std::filesystem::path& path, bool append) {
  if (append) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      if (const auto step = row_step(nlohmann::json::parse(line, nullptr, false)))
        skip_through_ = std::max(skip_through_, *step);
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  FP8T_CHECK(out_, "cannot open {} for writing", path.string());
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (const auto step = row_step(record); step && *step <= skip_through_) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

int drop_metrics_after(const std::filesystem::path& path, int step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  in.close();
  std::string kept;
  int dropped = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    const auto s = row_step(j);
    if (j.is_discarded() || (s && *s > step)) {
      ++dropped;
      continue;
    }
    kept += line;
    kept += '\n';
  }
  if (kept == text) return 0;
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    out.flush();
    FP8T_CHECK(out, "cannot rewrite {} (writing {} failed: is the disk full?)", path.string(), tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  FP8T_CHECK(!ec, "cannot replace {} by {}: {}", path.string(), tmp.string(), ec.message());
  return dropped;
}

nlohmann::json memory_json(const MemoryStats& s) {
  nlohmann::json cur = nlohmann::json::object(), peak = nlohmann::json::object();
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    const std::string name(category_name(static_cast<MemCategory>(i)));
    cur[name] = s.current[i];
    peak[name] = s.peak[i];
  }
  return {{"current", cur}, {"peak", peak}, {"total", s.total_current}, {"total_peak", s.total_peak}};
}

}  // namespace fp8t
