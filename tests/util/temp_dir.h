// A fresh directory under the system's temporary directory for one test, removed with everything in it when the
// test's TempDir goes out of scope. Named <prefix>_<pid>_<counter>, so concurrent test processes never share one.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

namespace fp8t::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "fp8t_test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace fp8t::test
