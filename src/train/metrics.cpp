// Logger and metrics file.
#include "train/metrics.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

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

MetricsWriter::MetricsWriter(const std::filesystem::path& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  FP8T_CHECK(out_, "cannot open {} for writing", path.string());
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
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
