// Shared by the libFuzzer harnesses: a scratch directory per process, file writing, and the rule
// that a reader refuses bad input only with fp8t::Error (anything else reaches a user as a crash).
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "core/check.h"

namespace fp8t::fuzz {

// A directory that lives as long as the fuzzing process (removed at exit).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/fp8t_fuzz_XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(templ);
  }();
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// fp8t::Error is a refusal with a message (main() prints it and exits 1): the wanted outcome for
// bad input. Any other exception would print "unexpected error", so the harness aborts on it and
// libFuzzer keeps the input.
template <class Body>
void expect_clean_refusal(Body&& body) {
  try {
    body();
  } catch (const fp8t::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: %s escaped instead of fp8t::Error: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: a non-std exception escaped\n");
    std::abort();
  }
}

// A check of the harness's own property (a round trip); aborts so libFuzzer keeps the input.
#define FP8T_FUZZ_REQUIRE(cond, ...)                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "fuzz: property failed: %s: ", #cond);      \
      std::fprintf(stderr, __VA_ARGS__);                               \
      std::fprintf(stderr, "\n");                                      \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

}  // namespace fp8t::fuzz
