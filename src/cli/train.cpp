// fp8train train --config F [--set key=value ...] [--resume RUN_DIR]
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/config.h"
#include "core/check.h"
#include "dist/bootstrap.h"
#include "train/trainer.h"

namespace fp8t::cli {

std::string memory_hint(const Config& cfg) {
  const double params = static_cast<double>(cfg.model.parameter_count());
  return fmt::format(
      "{}: the model has {:.3g} parameters ({:.2f} GiB as f32 weights, gradients and AdamW moments) and a "
      "micro-batch holds train.micro_batch x model.seq_len = {} x {} tokens; lower train.micro_batch, "
      "model.n_layer or model.d_model (fp8train plan shows the memory by category)",
      cfg.source, params, params * 16 / (1 << 30), cfg.train.micro_batch, cfg.model.seq_len);
}

void add_train(CLI::App& app) {
  struct Opts {
    std::string config, resume;
    std::vector<std::string> sets;
  };
  auto opts = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("train", "train a model from a YAML config");
  cmd->add_option("--config,-c", opts->config, "YAML run config")->required();
  cmd->add_option("--set", opts->sets, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--resume", opts->resume, "resume from a run directory or checkpoint directory");
  cmd->callback([opts] {
    Config cfg = load_config(opts->config, opts->sets);
    const std::vector<std::string> warnings = check_run_inputs(cfg);
    auto comm = bootstrap(cfg);
    if (comm->rank() == 0)
      for (const std::string& w : warnings) fmt::print(stderr, "fp8train: warning: {}\n", w);
    std::optional<std::filesystem::path> resume;
    if (!opts->resume.empty()) resume = opts->resume;
    TrainResult r;
    try {
      r = train(cfg, *comm, resume);
    } catch (const std::bad_alloc&) {
      throw fp8t::Error(fmt::format("out of host memory while building or training the model: {}", memory_hint(cfg)));
    }
    if (comm->rank() == 0) fmt::print("{}\n", summary_line(r, cfg));
  });
}

}  // namespace fp8t::cli
