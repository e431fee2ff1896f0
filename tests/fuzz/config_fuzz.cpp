// libFuzzer harness: YAML run config text plus --set overrides -> parse_config, then the resolved
// config must read back to itself (to_yaml is documented as loadable by load_config).
// Input: YAML text; after a line "#%set" (a YAML comment), each further line is one override "a.b=value".
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "fuzz_util.h"

namespace {

struct Input {
  std::string yaml;
  std::vector<std::string> overrides;
};

Input split(std::string_view data) {
  constexpr std::string_view kMarker = "#%set\n";
  Input in;
  size_t at = data.starts_with(kMarker) ? 0 : data.find("\n" + std::string(kMarker));
  if (at == std::string_view::npos) {
    in.yaml = std::string(data);
    return in;
  }
  const size_t rest = at + (at == 0 ? kMarker.size() : kMarker.size() + 1);
  in.yaml = std::string(data.substr(0, at));
  std::string_view tail = data.substr(rest);
  while (!tail.empty()) {
    const size_t nl = tail.find('\n');
    in.overrides.emplace_back(tail.substr(0, nl));
    tail = nl == std::string_view::npos ? std::string_view() : tail.substr(nl + 1);
  }
  return in;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Input in = split(std::string_view(reinterpret_cast<const char*>(data), size));
  fp8t::fuzz::expect_clean_refusal([&] {
    const fp8t::Config cfg = fp8t::parse_config(in.yaml, "fuzz.yaml", in.overrides);
    const std::string resolved = cfg.to_yaml();
    fp8t::Config again;
    try {
      again = fp8t::parse_config(resolved, "resolved.yaml");
    } catch (const fp8t::Error& e) {
      FP8T_FUZZ_REQUIRE(false, "the resolved config does not load: %s\n--- resolved:\n%s", e.what(), resolved.c_str());
    }
    const std::string twice = again.to_yaml();
    FP8T_FUZZ_REQUIRE(twice == resolved, "the resolved config changes on a reload:\n--- first:\n%s\n--- reloaded:\n%s",
                      resolved.c_str(), twice.c_str());
  });
  return 0;
}
