// Error checking: one macro family that reports the failing statement and file:line.
// Argument checks stay on in release builds and throw fp8t::Error with an actionable message.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace fp8t {

// Every user-facing failure is an Error; main() prints what() and exits non-zero.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail_at(const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{} ({}:{})", msg, file, line));
}

}  // namespace fp8t

// FP8T_CHECK(cond, "fmt", args...): throws fp8t::Error naming the condition and file:line.
#define FP8T_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::fp8t::fail_at(__FILE__, __LINE__, fmt::format(__VA_ARGS__));        \
  } while (0)

#define FP8T_FAIL(...) ::fp8t::fail_at(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
