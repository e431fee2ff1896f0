// fp8train command line: train, plan, prepare, sample, export, import.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "core/check.h"

namespace {

// The subcommand being run, for messages about failures it did not catch itself.
std::string subcommand(CLI::App& app) {
  const auto subs = app.get_subcommands();
  return subs.empty() ? std::string("?") : subs.front()->get_name();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp8train: FP8 mixed-precision transformer training"};
  app.require_subcommand(1);
  fp8t::cli::add_train(app);
  fp8t::cli::add_prepare(app);
  fp8t::cli::add_sample(app);
  fp8t::cli::add_export(app);
  fp8t::cli::add_import(app);
  fp8t::cli::add_plan(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fp8t::Error& e) {
    fmt::print(stderr, "fp8train: error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {  // the subcommands say what they were doing where they can
    fmt::print(stderr, "fp8train: error: out of host memory while running 'fp8train {}'\n", subcommand(app));
    return 1;
  } catch (const std::length_error& e) {
    fmt::print(stderr, "fp8train: error: a size too large for host memory while running 'fp8train {}' ({})\n",
               subcommand(app), e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    fmt::print(stderr,
               "fp8train: error: while running 'fp8train {}': cannot use '{}': {} ({}); check the paths "
               "given (run.out_dir, data.*, train.init_from, --checkpoint, --resume, --hf, --llmc, --out)\n",
               subcommand(app), e.path1().string(), e.code().message(), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "fp8train: unexpected error: {}\n", e.what());
    return 1;
  }
  return 0;
}
