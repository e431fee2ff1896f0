// Checks that span several config keys, private to config/: divisibility, the batch arithmetic, and
// bounds on every size the model and the step loop derive from the config (computed in 64 bits).
#pragma once
#include <functional>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "config/config.h"
#include "config/yaml_util.h"

namespace fp8t {

// The first of `keys` that the file or a --set gave, with where; the first key and a default
// origin when none was given. A failed check blames that key.
using OriginOf = std::function<std::pair<std::string_view, yaml_util::Origin>(
    std::initializer_list<std::string_view> keys)>;

void check_cross_fields(const Config& c, const OriginOf& origin_of);

}  // namespace fp8t
