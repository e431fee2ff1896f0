// Config -> YAML: the resolved config with every key, in visit_fields() order, loadable by load_config.
#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config/config.h"
#include "config/config_schema.h"
#include "config/val_sets.h"
#include "config/yaml_util.h"

namespace fp8t {
namespace {

using namespace config_schema;

// Emits every field; doubles in their shortest round-trip form, strings quoted.
class Writer {
 public:
  explicit Writer(YAML::Emitter& out) : out_(out), nested_(out) {}
  void finish() { nested_.finish(); }

  void operator()(std::string_view key, const std::string& v, Choices = {}) {
    nested_.key(key);
    out_ << YAML::DoubleQuoted << v;
  }
  template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool>)
  void operator()(std::string_view key, const I& v, Range range = {}) {
    nested_.key(key);
    out_ << (range.or_auto && v == 0 ? std::string("auto") : fmt::format("{}", v));
  }
  void operator()(std::string_view key, const double& v, Range = {}) {
    nested_.key(key);
    out_ << yaml_util::format_double(v);
  }
  void operator()(std::string_view key, const bool& v) {
    nested_.key(key);
    out_ << v;
  }
  template <class E>
    requires std::is_enum_v<E>
  void operator()(std::string_view key, const E& v) {
    nested_.key(key);
    out_ << std::string(names_of(E{})[static_cast<size_t>(v)]);
  }
  void operator()(std::string_view key, const Device& v) {
    nested_.key(key);
    out_ << std::string(kDeviceNames[v.is_cpu() ? 0 : 1]);
  }
  void operator()(std::string_view key, const std::vector<std::string>& v, Choices) {
    nested_.key(key);
    out_ << YAML::Flow << v;
  }
  void operator()(std::string_view key, const std::vector<ValSet>& v) {
    nested_.key(key);
    write_val_sets(out_, v);
  }
  void pair(std::string_view key, const double& a, const double& b, Range) {
    nested_.key(key);
    out_ << YAML::Flow << YAML::BeginSeq << yaml_util::format_double(a)
         << yaml_util::format_double(b) << YAML::EndSeq;
  }

 private:
  YAML::Emitter& out_;
  yaml_util::NestedEmitter nested_;
};

}  // namespace

std::string Config::to_yaml() const {
  YAML::Emitter out;
  Writer writer(out);
  visit_fields(*this, writer);
  writer.finish();
  return std::string(out.c_str()) + "\n";
}

}  // namespace fp8t
