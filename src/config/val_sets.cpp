// data.val: reading its YAML forms into ValSets, writing them back, and naming a set after its glob.
#include "config/val_sets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>

namespace fp8t {
namespace {

using yaml_util::describe;
using yaml_util::fail;
using yaml_util::Origin;

// Names go into log lines and JSON keys, and must read back as YAML strings.
bool valid_set_name(std::string_view name) {
  auto is = [](char c, auto pred) { return pred(static_cast<unsigned char>(c)) != 0; };
  if (name.empty() || !(is(name[0], ::isalpha) || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(), [&](char c) {
    return is(c, ::isalnum) || c == '_' || c == '-' || c == '.';
  });
}

// A glob must be a non-empty string; an unquoted number or boolean is a slip, not a path.
std::string glob_of(std::string_view key, const YAML::Node& node, const Origin& at) {
  if (!node.IsScalar() || node.Scalar().empty())
    fail(at, key, fmt::format("expected a glob of token shards, got {}", describe(node)));
  const std::string& text = node.Scalar();
  if (node.Tag() == "?" && (yaml_util::parse_double(text) || yaml_util::parse_bool(text)))
    fail(at, key,
         fmt::format("expected a glob of token shards, got {}; quote it if it is a path", text));
  return text;
}

// Items of a list or keys of a map carry their own line when they come from a file.
Origin origin_of(const Origin& parent, const YAML::Node& node) {
  Origin at = parent;
  if (at.override_text.empty() && yaml_util::line_of(node.Mark()) > 0)
    at.line = yaml_util::line_of(node.Mark());
  return at;
}

}  // namespace

std::string val_set_name(const std::string& glob) {
  const std::filesystem::path path(glob);
  std::string file = path.filename().string();
  if (const size_t wild = file.find_first_of("*?["); wild != std::string::npos)
    file.resize(wild);
  else if (const size_t dot = file.rfind('.'); dot != std::string::npos && dot > 0)
    file.resize(dot);
  while (!file.empty() && (file.back() == '_' || file.back() == '-' || file.back() == '.'))
    file.pop_back();
  return file.empty() ? path.parent_path().filename().string() : file;
}

std::vector<ValSet> read_val_sets(std::string_view key, const YAML::Node& v,
                                  const Origin& origin) {
  std::vector<ValSet> out;
  if (v.IsNull() || (v.IsScalar() && v.Scalar().empty())) return out;
  auto add = [&](std::string name, std::string glob, const Origin& at) {
    for (const ValSet& s : out)
      if (s.name == name)
        fail(at, key,
             fmt::format("two validation sets are named '{}' ('{}' and '{}'); name them with "
                         "the map form, e.g. {{in_dist: 'a/val_*.bin', other: 'b/val_*.bin'}}",
                         name, s.glob, glob));
    out.push_back({std::move(name), std::move(glob)});
  };
  if (v.IsScalar()) {
    add("val", glob_of(key, v, origin), origin);
  } else if (v.IsSequence()) {
    if (v.size() == 0) fail(origin, key, "an empty list; use \"\" for no validation");
    for (const auto& item : v) {
      const Origin at = origin_of(origin, item);
      std::string glob = glob_of(key, item, at);
      std::string name = val_set_name(glob);
      if (!valid_set_name(name))
        fail(at, key,
             fmt::format("cannot name the validation set '{}' after its file name; use the map "
                         "form, {{name: glob, ...}}",
                         glob));
      add(std::move(name), std::move(glob), at);
    }
  } else {
    if (v.size() == 0) fail(origin, key, "an empty map; use \"\" for no validation");
    for (auto it = v.begin(); it != v.end(); ++it) {
      const Origin at = origin_of(origin, it->first);
      const std::string name = it->first.IsScalar() ? it->first.Scalar() : "";
      if (!valid_set_name(name))
        fail(at, key,
             fmt::format("a validation set's name is a letter or '_', then letters, digits, "
                         "'_', '-', '.'; got {}",
                         describe(it->first)));
      add(name, glob_of(fmt::format("{}.{}", key, name), it->second, at), at);
    }
  }
  return out;
}

void write_val_sets(YAML::Emitter& out, const std::vector<ValSet>& sets) {
  if (sets.empty() || (sets.size() == 1 && sets[0].name == "val")) {
    out << YAML::DoubleQuoted << (sets.empty() ? std::string() : sets[0].glob);
    return;
  }
  out << YAML::BeginMap;
  for (const ValSet& s : sets)
    out << YAML::Key << YAML::DoubleQuoted << s.name << YAML::Value << YAML::DoubleQuoted << s.glob;
  out << YAML::EndMap;
}

}  // namespace fp8t
