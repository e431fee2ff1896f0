// Run configuration: YAML text -> Config, with --set overrides and validation (Config -> YAML is in
// config_write.cpp). Every key is listed once, in visit_fields(); reading, writing and the key schema walk it.
#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "config/config_schema.h"
#include "config/cross_checks.h"
#include "config/val_sets.h"
#include "config/yaml_util.h"
#include "core/check.h"

namespace fp8t {
namespace {

using yaml_util::describe;
using yaml_util::fail;
using yaml_util::Origin;
using namespace config_schema;

// Keys older configs may still set, with what to do instead.
constexpr std::pair<std::string_view, std::string_view> kRemovedKeys[] = {
    {"distributed.overlap_comm",
     "removed key: ZeRO stage 2 always overlaps its reductions with the backward and stages 0 and 1 reduce after "
     "it; delete this line"},
};

[[noreturn]] void unknown_key(const Origin& origin, std::string path) {
  for (const auto& [key, what] : kRemovedKeys)
    if (path == key) fail(origin, path, std::string(what));
  // Blame the first component that is not a section: 'nosuch' in --set nosuch.key=1.
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1)) {
    std::string prefix = path.substr(0, dot);
    if (schema().leaf_set.contains(prefix))
      fail(origin, path, fmt::format("unknown key; '{}' is a single value, not a section", prefix));
    if (!schema().sections.contains(prefix)) {
      path = prefix;
      break;
    }
  }
  auto [parent, name] = split_last(path);
  std::vector<std::string> siblings = schema().children(parent);
  std::string near = yaml_util::closest(name, siblings);
  std::string hint;
  if (!near.empty()) {
    hint = fmt::format("; did you mean '{}'?", parent.empty() ? near : parent + "." + near);
  } else {
    for (const auto& k : schema().leaves)  // the right name in the wrong section
      if (split_last(k).second == name) hint = fmt::format("; did you mean '{}'?", k);
    if (hint.empty())
      hint = fmt::format("; known keys{}: {}", parent.empty() ? "" : " in " + parent,
                         fmt::join(siblings, ", "));
  }
  fail(origin, path, "unknown key" + hint);
}

// The config as dotted key -> (YAML value, where it came from); overrides replace entries.
struct Entry {
  YAML::Node value;
  Origin origin;
};
using Entries = std::map<std::string, Entry, std::less<>>;

void flatten(const YAML::Node& map, const std::string& prefix, const Origin& origin, Entries& out);

void place(const std::string& path, const YAML::Node& value, const Origin& origin, Entries& out) {
  if (schema().sections.contains(path)) {
    if (value.IsNull()) return;  // an empty section keeps its defaults
    if (!value.IsMap())
      fail(origin, path,
           fmt::format("expected a map (a section of keys), got {}", describe(value)));
    flatten(value, path, origin, out);
  } else if (schema().leaf_set.contains(path)) {
    auto [it, inserted] = out.try_emplace(path, Entry{value, origin});
    if (inserted) return;
    if (origin.override_text.empty() && it->second.origin.override_text.empty())
      fail(origin, path,
           fmt::format("duplicate key (first set on line {}); keep one of the two lines",
                       it->second.origin.line));
    it->second = Entry{value, origin};
  } else {
    unknown_key(origin, path);
  }
}

// yaml-cpp keeps every pair of a map, duplicates included, and its lookups see only the first; so
// a key given twice in one map (a section twice, or a key twice in a section) is refused here.
void flatten(const YAML::Node& map, const std::string& prefix, const Origin& origin, Entries& out) {
  std::map<std::string, int, std::less<>> seen;  // key -> line of its first occurrence
  for (auto it = map.begin(); it != map.end(); ++it) {
    Origin at = origin;
    if (at.override_text.empty()) at.line = yaml_util::line_of(it->first.Mark());
    if (!it->first.IsScalar())
      fail(at, prefix.empty() ? "config" : prefix,
           fmt::format("keys must be plain names, got {}", describe(it->first)));
    const std::string path = prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
    if (auto [first, inserted] = seen.try_emplace(it->first.Scalar(), at.line); !inserted) {
      const std::string where = first->second > 0 ? fmt::format(" (first set on line {})", first->second) : "";
      if (schema().sections.contains(path))
        fail(at, path, fmt::format("section given twice{}; merge the two into one '{}:' section", where,
                                   it->first.Scalar()));
      fail(at, path, fmt::format("duplicate key{}; keep one of the two lines", where));
    }
    place(path, it->second, at, out);
  }
}

void apply_override(const std::string& text, const std::string& source, Entries& out) {
  Origin origin{source, 0, text};
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(fmt::format("{}: expected KEY=VALUE, e.g. optim.lr=3e-4", origin.where()));
  std::string key = text.substr(0, eq);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  if (key.empty() || key.front() == '.' || key.back() == '.' || key.find("..") != std::string::npos)
    throw Error(fmt::format("{}: '{}' is not a key; expected KEY=VALUE with a dotted key, e.g. optim.lr=3e-4",
                            origin.where(), key));
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail(origin, key, fmt::format("the value is not valid YAML: {}", e.msg));
  }
  place(key, value, origin, out);
}

// Fills fields from entries; a key without an entry keeps its default.
class Reader {
 public:
  explicit Reader(const Entries& entries) : entries_(entries) {}

  void operator()(std::string_view key, std::string& out, Choices choices = {}) {
    const Entry* e = find(key);
    if (!e) return;
    out = e->value.IsNull() ? "" : scalar(key, *e, "a string");
    if (!choices.empty() && std::find(choices.begin(), choices.end(), out) == choices.end())
      fail(e->origin, key, fmt::format("expected {}, got '{}'", one_of(choices), yaml_util::printable(out)));
  }

  template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool>)
  void operator()(std::string_view key, I& out, Range range = {}) {
    const Entry* e = find(key);
    if (!e) return;
    const std::string& text = scalar(key, *e, range.or_auto ? "an integer or auto" : "an integer");
    if (range.or_auto && text == "auto") {
      out = 0;
      return;
    }
    if constexpr (std::is_unsigned_v<I>) {
      auto v = yaml_util::parse_uint(text);
      if (!v) fail(e->origin, key, fmt::format("expected a non-negative integer, got '{}'", yaml_util::printable(text)));
      out = static_cast<I>(*v);
    } else {
      auto v = yaml_util::parse_int(text);
      if (!v) fail(e->origin, key, fmt::format("expected an integer, got '{}'", yaml_util::printable(text)));
      if constexpr (sizeof(I) < sizeof(int64_t)) {
        if (*v < std::numeric_limits<I>::min() || *v > std::numeric_limits<I>::max())
          fail(e->origin, key,
               fmt::format("{} is out of range for a {}-bit integer", *v, 8 * sizeof(I)));
      }
      if (!range.contains(static_cast<double>(*v)))
        fail(e->origin, key,
             fmt::format("expected an integer {}{}, got {}", range.str(), range.or_auto ? " or auto" : "", *v));
      out = static_cast<I>(*v);
    }
  }

  void operator()(std::string_view key, double& out, Range range = {}) {
    const Entry* e = find(key);
    if (e) out = number(key, e->value, e->origin, range);
  }

  void operator()(std::string_view key, bool& out) {
    const Entry* e = find(key);
    if (!e) return;
    const std::string& text = scalar(key, *e, "true or false");
    auto v = yaml_util::parse_bool(text);
    if (!v) fail(e->origin, key, fmt::format("expected true or false, got '{}'", yaml_util::printable(text)));
    out = *v;
  }

  template <class E>
    requires std::is_enum_v<E>
  void operator()(std::string_view key, E& out) {
    if (const Entry* e = find(key)) out = static_cast<E>(choice(key, *e, names_of(E{})));
  }

  void operator()(std::string_view key, Device& out) {
    if (const Entry* e = find(key))
      out = choice(key, *e, kDeviceNames) == 0 ? Device::cpu() : Device::cuda();
  }

  void operator()(std::string_view key, std::vector<std::string>& out, Choices choices) {
    const Entry* e = find(key);
    if (!e) return;
    if (!e->value.IsSequence())
      fail(e->origin, key,
           fmt::format("expected a list of {}, got {}", one_of(choices), describe(e->value)));
    out.clear();
    for (const auto& item : e->value) {
      Origin at = element_origin(*e, item);
      if (!item.IsScalar() ||
          std::find(choices.begin(), choices.end(), item.Scalar()) == choices.end())
        fail(at, key,
             fmt::format("expected each item to be {}, got {}", one_of(choices), describe(item)));
      if (std::find(out.begin(), out.end(), item.Scalar()) != out.end())
        fail(at, key, fmt::format("'{}' is listed twice", item.Scalar()));
      out.push_back(item.Scalar());
    }
  }

  void operator()(std::string_view key, std::vector<ValSet>& out) {
    if (const Entry* e = find(key)) out = read_val_sets(key, e->value, e->origin);
  }

  void pair(std::string_view key, double& a, double& b, Range range) {
    const Entry* e = find(key);
    if (!e) return;
    if (!e->value.IsSequence() || e->value.size() != 2)
      fail(e->origin, key,
           fmt::format("expected a list of two numbers, e.g. [0.9, 0.95], got {}",
                       describe(e->value)));
    a = number(key, e->value[0], element_origin(*e, e->value[0]), range);
    b = number(key, e->value[1], element_origin(*e, e->value[1]), range);
  }

 private:
  const Entry* find(std::string_view key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  static const std::string& scalar(std::string_view key, const Entry& e, std::string_view what) {
    if (!e.value.IsScalar())
      fail(e.origin, key, fmt::format("expected {}, got {}", what, describe(e.value)));
    return e.value.Scalar();
  }
  static size_t choice(std::string_view key, const Entry& e, Choices choices) {
    const std::string& text = scalar(key, e, one_of(choices));
    for (size_t i = 0; i < choices.size(); ++i)
      if (choices[i] == text) return i;
    fail(e.origin, key, fmt::format("expected {}, got '{}'", one_of(choices), yaml_util::printable(text)));
  }
  static double number(std::string_view key, const YAML::Node& node, const Origin& at,
                       Range range) {
    if (!node.IsScalar()) fail(at, key, fmt::format("expected a number, got {}", describe(node)));
    auto v = yaml_util::parse_double(node.Scalar());
    if (!v) fail(at, key, fmt::format("expected a number, got '{}'",
                                      yaml_util::printable(node.Scalar())));
    if (!range.contains(*v))
      fail(at, key, fmt::format("expected a number {}, got {}", range.str(), *v));
    return *v;
  }
  // List items carry their own line when they come from the file.
  static Origin element_origin(const Entry& e, const YAML::Node& item) {
    Origin at = e.origin;
    if (at.override_text.empty() && yaml_util::line_of(item.Mark()) > 0)
      at.line = yaml_util::line_of(item.Mark());
    return at;
  }

  const Entries& entries_;
};

}  // namespace

std::string Config::where(std::string_view key) const {
  // A part of a value (data.val.<set>) came from where its key did.
  for (std::string_view k = key;;) {
    if (auto it = origins.find(k); it != origins.end()) return fmt::format("{}: {}", it->second, key);
    const size_t dot = k.rfind('.');
    if (dot == std::string_view::npos) return fmt::format("{}: {}", source, key);
    k = k.substr(0, dot);
  }
}

namespace {

// from_file: a file must set at least one key (an empty file is a mistake, not "all defaults").
Config parse(const std::string& yaml_text, const std::string& source,
             const std::vector<std::string>& overrides, bool from_file) {
  const YAML::Node root = yaml_util::load_one_document(yaml_text, source);
  Entries entries;
  if (root.IsMap()) {
    flatten(root, "", Origin{source, 0, {}}, entries);
  } else if (root.IsDefined() && !root.IsNull()) {
    fail(Origin{source, yaml_util::line_of(root.Mark()), {}}, "config",
         fmt::format("expected a map of sections ({}), got {}",
                     fmt::join(schema().children(""), ", "), describe(root)));
  }
  if (from_file && entries.empty())
    throw Error(fmt::format(
        "{}: the config file sets no keys (it is empty, or only comments and empty sections); a run "
        "needs at least data.train: start from configs/tiny-cpu.yaml",
        source));
  for (const auto& o : overrides) apply_override(o, source, entries);

  Config cfg;
  cfg.source = source;
  for (const auto& [key, entry] : entries) cfg.origins.emplace(key, entry.origin.where());
  Reader reader(entries);
  visit_fields(cfg, reader);
  check_cross_fields(cfg, [&](std::initializer_list<std::string_view> keys) {
    for (auto k : keys)
      if (auto it = entries.find(k); it != entries.end()) return std::pair{k, it->second.origin};
    return std::pair{*keys.begin(), Origin{source, 0, {}}};
  });
  return cfg;
}

// A config is a short text file; anything else (a token shard, a checkpoint) is a wrong path.
constexpr std::uintmax_t kMaxConfigBytes = 1 << 20;

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  return parse(yaml_text, source, overrides, false);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(fmt::format("{}: config file not found", path));
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(fmt::format("{}: config path is not a regular file", path));
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxConfigBytes)
    throw Error(fmt::format("{}: the config file is {} bytes, more than the {} a YAML run config may "
                            "be; is this the right file?",
                            path, bytes, kMaxConfigBytes));
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot open config file: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("{}: cannot read config file: {}", path, std::strerror(errno)));
  const std::string content = text.str();
  if (const size_t nul = content.find('\0'); nul != std::string::npos)
    throw Error(fmt::format("{}: byte {} is a NUL: this is a binary file, not a YAML run config", path,
                            nul));
  return parse(content, path, overrides, true);
}

}  // namespace fp8t
