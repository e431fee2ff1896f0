// fp8train command line: train, plan, prepare, sample, export.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/check.h"

int main(int argc, char** argv) {
  CLI::App app{"fp8train: FP8 mixed-precision transformer training"};
  app.require_subcommand(1);
  fp8t::cli::add_train(app);
  fp8t::cli::add_prepare(app);
  fp8t::cli::add_sample(app);
  fp8t::cli::add_export(app);
  fp8t::cli::add_plan(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fp8t::Error& e) {
    fmt::print(stderr, "fp8train: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fp8train: unexpected error: {}\n", e.what());
    return 1;
  }
  return 0;
}
