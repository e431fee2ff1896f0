// One function per subcommand: registers its options and its callback on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

namespace fp8t::cli {

void add_train(CLI::App& app);
void add_prepare(CLI::App& app);
void add_sample(CLI::App& app);
void add_export(CLI::App& app);
void add_plan(CLI::App& app);

}  // namespace fp8t::cli
