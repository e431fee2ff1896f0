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

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::filesystem::path& path, bool append);
  void write(const nlohmann::json& record);  // one line, flushed

 private:
  std::ofstream out_;
};

// {"parameters": bytes, ...} current and peak per category.
nlohmann::json memory_json(const MemoryStats& s);

}  // namespace fp8t
