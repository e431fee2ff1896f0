// One function per subcommand: registers its options and its callback on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

namespace fp8t {
struct Config;
}

namespace fp8t::cli {

// What to change when a run of `cfg` runs out of host memory: its size and the keys to lower.
std::string memory_hint(const Config& cfg);

void add_train(CLI::App& app);
void add_prepare(CLI::App& app);
void add_sample(CLI::App& app);
void add_export(CLI::App& app);
void add_import(CLI::App& app);
void add_plan(CLI::App& app);

}  // namespace fp8t::cli
