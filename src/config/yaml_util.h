// YAML helpers for config.cpp: where a value came from, strict scalar parsing, key suggestions,
// and an emitter that opens and closes nested maps from dotted keys.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp8t::yaml_util {

// Where a config value came from: a line of a file, a --set override, or the default.
struct Origin {
  std::string source;         // file name, or "<string>" for text
  int line = 0;               // 1-based; 0 when there is no line (override or default)
  std::string override_text;  // "a.b=value" when the value came from --set
  std::string where() const;  // "f.yaml, line 12" | "f.yaml: --set a.b=v" | "f.yaml (default)"
};

int line_of(const YAML::Mark& mark);  // 1-based; 0 for a null mark

// The one YAML document of `text` (a null node when it holds none, or only empty documents, as a trailing
// '---' makes). A second non-empty document is refused rather than silently dropped (YAML::Load reads only
// the first), and so is a stream the parser stops advancing through: yaml-cpp up to 0.8 returns an empty
// document without consuming the token for a stray ',' at the top level ("," or ", a: 1"), so
// YAML::LoadAll would loop allocating without end (yaml-cpp issue 1040). Syntax errors throw
// fp8t::Error "<source>, line N: YAML syntax error: ...".
YAML::Node load_one_document(const std::string& text, const std::string& source);

// Throws fp8t::Error "<where>: <key>: <what>".
[[noreturn]] void fail(const Origin& origin, std::string_view key, std::string_view what);

// Strict conversions of a whole scalar; std::nullopt when the text is not of that type.
std::optional<int64_t> parse_int(std::string_view text);
std::optional<uint64_t> parse_uint(std::string_view text);
std::optional<double> parse_double(std::string_view text);  // finite values only
std::optional<bool> parse_bool(std::string_view text);      // true/false, yes/no, on/off

std::string describe(const YAML::Node& node);  // "'abc'", "a list", "a map" or "nothing"
std::string printable(std::string_view text);  // control bytes escaped, cut after 80 characters
std::string format_double(double value);       // shortest text that reads back to `value`
size_t edit_distance(std::string_view a, std::string_view b);

// The closest of `candidates` to `name` within edit distance 2 (and shorter than `name`), or "".
std::string closest(std::string_view name, std::span<const std::string> candidates);

// Emits a block map from dotted keys given in section order: "a.b.c" opens maps a and b as needed.
class NestedEmitter {
 public:
  explicit NestedEmitter(YAML::Emitter& out);
  // Opens the enclosing maps of `dotted_key` and emits its key; the caller then emits the value.
  void key(std::string_view dotted_key);
  void finish();  // closes every open map

 private:
  YAML::Emitter& out_;
  std::vector<std::string> open_;
};

}  // namespace fp8t::yaml_util
