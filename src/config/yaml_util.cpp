// YAML helpers for config.cpp: origins and error messages, strict scalar parsing, suggestions,
// nested-map emission.
#include "config/yaml_util.h"

#include <fmt/format.h>
#include <yaml-cpp/anchor.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <sstream>

#include "core/check.h"

namespace fp8t::yaml_util {

std::string Origin::where() const {
  if (!override_text.empty()) return fmt::format("{}: --set {}", source, override_text);
  if (line > 0) return fmt::format("{}, line {}", source, line);
  return fmt::format("{} (default)", source);
}

int line_of(const YAML::Mark& mark) { return mark.is_null() ? 0 : mark.line + 1; }

void fail(const Origin& origin, std::string_view key, std::string_view what) {
  throw Error(fmt::format("{}: {}: {}", origin.where(), key, what));
}

namespace {

// The style parameter of EventHandler's OnMapStart / OnSequenceStart: EmitterStyle::value in yaml-cpp 0.7,
// enum class EmitterStyle in later releases; taken from the base class so this compiles with either.
template <class F>
struct StyleParam;
template <class R, class C, class A, class B, class D, class S>
struct StyleParam<R (C::*)(A, B, D, S)> {
  using type = S;
};
using Style = StyleParam<decltype(&YAML::EventHandler::OnMapStart)>::type;

// The parser's events of one document, reduced to where it starts (its first token) and what its root is;
// no node is built.
class DocumentScan final : public YAML::EventHandler {
 public:
  YAML::Mark start, root = YAML::Mark::null_mark();
  bool null = true;

  void OnDocumentStart(const YAML::Mark& mark) override {
    start = mark;
    root = YAML::Mark::null_mark();
    null = true;
    seen_root_ = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, true); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark, false); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    node(mark, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, Style) override {
    node(mark, false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, Style) override {
    node(mark, false);
  }
  void OnMapEnd() override {}

 private:
  bool seen_root_ = false;
  void node(const YAML::Mark& mark, bool is_null) {
    if (seen_root_) return;
    seen_root_ = true;
    root = mark;
    null = is_null;
  }
};

// The offset of the first byte that does not belong to well-formed UTF-8 (NUL bytes, overlong forms, surrogates
// and code points past U+10FFFF included), or npos.
size_t first_non_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c == 0) return i;
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

[[noreturn]] void syntax_error(const std::string& source, const YAML::Mark& mark, const std::string& what) {
  throw Error(fmt::format("{}: YAML syntax error: {}", Origin{source, line_of(mark), {}}.where(), what));
}

}  // namespace

YAML::Node load_one_document(const std::string& text, const std::string& source) {
  // yaml-cpp re-encodes what is not UTF-8 (a NUL byte switches it to UTF-16 or UTF-32, an invalid byte becomes a
  // 3-byte U+FFFD), so its marks would no longer be offsets into `text`: such input is refused first.
  if (const size_t bad = first_non_utf8(text); bad != std::string::npos) {
    const auto line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad),
                                                      '\n'));
    throw Error(fmt::format("{}: not UTF-8 text: byte 0x{:02X} at offset {}; a config is a UTF-8 YAML file (was "
                            "a binary or UTF-16 file given?)",
                            Origin{source, line, {}}.where(),
                            static_cast<unsigned>(static_cast<unsigned char>(text[bad])), bad));
  }
  // Pass 1: the documents' extents and roots, from the parser's events. Every document must start past
  // the previous one's start: one that does not consumed nothing, and the parser would return it forever.
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentScan scan;
  int documents = 0;
  int prev_pos = -1;
  bool found = false;
  YAML::Mark config;     // the non-empty document's root
  int config_start = 0;  // and its first token's offset
  try {
    while (parser.HandleNextDocument(scan)) {
      ++documents;
      if (scan.start.pos <= prev_pos || static_cast<size_t>(documents) > text.size() + 1) {
        const size_t at = static_cast<size_t>(std::max(scan.start.pos, 0));
        const char c = at < text.size() ? text[at] : '\0';
        syntax_error(source, scan.start,
                     c == ',' ? "a ',' where a key or value should start; a ',' separates items only inside "
                                "[ ] or { } (delete it, or open the list or map it belongs to)"
                              : fmt::format("the parser stops advancing at {}; check the brackets and "
                                            "separators there",
                                            c == '\0' ? std::string("the end")
                                                        : fmt::format("'{}'", printable(std::string_view(&c, 1)))));
      }
      prev_pos = scan.start.pos;
      if (scan.null) continue;
      if (found)
        fail(Origin{source, line_of(scan.root), {}}, "config",
             fmt::format("a second YAML document (after a '---' line) starts here, and the one on line {} "
                         "is the config; a config is one document: delete the '---' and merge the two",
                         line_of(config)));
      found = true;
      config = scan.root;
      config_start = scan.start.pos;
    }
  } catch (const YAML::Exception& e) {
    // yaml-cpp says only "bad file" when nesting exceeds its depth limit.
    syntax_error(source, e.mark,
                 e.msg == "bad file" ? "the document nests too deeply or leaves a bracket open" : e.msg);
  }
  if (!found) return YAML::Node();
  // Pass 2: that document's nodes. YAML::Load reads the first document of a stream: the empty documents
  // before it are blanked out (spaces, newlines kept), so every mark keeps its line and column.
  std::string rest = text;
  for (size_t i = 0; i < std::min(static_cast<size_t>(std::max(config_start, 0)), rest.size()); ++i)
    if (rest[i] != '\n' && rest[i] != '\r') rest[i] = ' ';
  try {
    return YAML::Load(rest);
  } catch (const YAML::Exception& e) {  // not expected: pass 1 read the same tokens
    syntax_error(source, e.mark, e.msg);
  }
}

namespace {

// from_chars rejects a leading '+', which YAML allows.
std::string_view strip_plus(std::string_view t) {
  return t.size() > 1 && t[0] == '+' ? t.substr(1) : t;
}

template <class T>
std::optional<T> parse_whole(std::string_view text) {
  text = strip_plus(text);
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

std::string printable(std::string_view text) {
  constexpr size_t kMaxShown = 80;
  size_t shown = std::min(text.size(), kMaxShown);
  while (shown > 0 && shown < text.size() && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80)
    --shown;  // never cut a UTF-8 sequence
  std::string out;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += text[i];
  }
  if (shown < text.size()) out += fmt::format("... ({} characters)", text.size());
  return out;
}

std::optional<int64_t> parse_int(std::string_view text) { return parse_whole<int64_t>(text); }
std::optional<uint64_t> parse_uint(std::string_view text) { return parse_whole<uint64_t>(text); }

std::optional<double> parse_double(std::string_view text) {
  auto v = parse_whole<double>(text);
  if (!v || !std::isfinite(*v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "no" || t == "off") return false;
  return std::nullopt;
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return fmt::format("'{}'", printable(node.Scalar()));
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

std::string format_double(double value) { return fmt::format("{}", value); }

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest(std::string_view name, std::span<const std::string> candidates) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_d && d < name.size()) best_d = d, best = c;
  }
  return best;
}

NestedEmitter::NestedEmitter(YAML::Emitter& out) : out_(out) { out_ << YAML::BeginMap; }

void NestedEmitter::key(std::string_view dotted_key) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = dotted_key.find('.', start);
    parts.emplace_back(dotted_key.substr(start, dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  size_t common = 0;
  while (common < open_.size() && common + 1 < parts.size() && open_[common] == parts[common])
    ++common;
  while (open_.size() > common) {
    out_ << YAML::EndMap;
    open_.pop_back();
  }
  for (size_t i = common; i + 1 < parts.size(); ++i) {
    out_ << YAML::Key << parts[i] << YAML::Value << YAML::BeginMap;
    open_.push_back(parts[i]);
  }
  out_ << YAML::Key << parts.back() << YAML::Value;
}

void NestedEmitter::finish() {
  for (; !open_.empty(); open_.pop_back()) out_ << YAML::EndMap;
  out_ << YAML::EndMap;
}

}  // namespace fp8t::yaml_util
