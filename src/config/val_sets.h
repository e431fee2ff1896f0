// data.val, private to config/: its YAML forms ("" | glob | [glob, ...] | {name: glob, ...}) read
// into ValSets with errors naming file, line and key, and written back in a form that reads the same.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/yaml_util.h"

namespace fp8t {

std::vector<ValSet> read_val_sets(std::string_view key, const YAML::Node& value,
                                  const yaml_util::Origin& origin);

// "" for none, the glob for one set named "val", otherwise a map name -> glob.
void write_val_sets(YAML::Emitter& out, const std::vector<ValSet>& sets);

}  // namespace fp8t
