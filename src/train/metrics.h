// Run-directory outputs: log.txt and console through spdlog, metrics.jsonl one JSON object a line.
#pragma once
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "core/allocator.h"

namespace fp8t {

// Console + log.txt logger for rank 0; console-only (warnings and errors) on other ranks.
std::shared_ptr<spdlog::logger> make_run_logger(const std::filesystem::path& run_dir, int rank);

// metrics.jsonl, one JSON object a line. Appending (a resumed run) skips records whose step the file
// already holds, so the resumed run's evaluation at its first step does not repeat the row of that step.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::filesystem::path& path, bool append);
  void write(const nlohmann::json& record);  // one line, flushed

 private:
  std::ofstream out_;
  int64_t skip_through_ = -1;  // records with a step <= this are already in the file
};

// On resume at `step`: rewrites `path` atomically (temporary file, then rename) keeping the rows of steps
// <= step and the rows without a step, and dropping the rows of later steps (written after the checkpoint,
// before the run stopped) and lines that are not JSON (a write cut off by a kill). Returns the number of
// lines dropped; a missing file is left missing.
int drop_metrics_after(const std::filesystem::path& path, int step);

// {"parameters": bytes, ...} current and peak per category.
nlohmann::json memory_json(const MemoryStats& s);

}  // namespace fp8t
