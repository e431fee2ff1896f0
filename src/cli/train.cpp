// fp8train train --config F [--set key=value ...] [--resume RUN_DIR]
#include <cmath>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "config/config.h"
#include "dist/bootstrap.h"
#include "train/trainer.h"

namespace fp8t::cli {

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
    auto comm = bootstrap(cfg);
    std::optional<std::filesystem::path> resume;
    if (!opts->resume.empty()) resume = opts->resume;
    const TrainResult r = train(cfg, *comm, resume);
    if (comm->rank() != 0) return;
    if (std::isfinite(r.first_val_loss)) {
      std::string others;  // the other validation sets, in config order
      for (size_t i = 1; i < cfg.data.val.size(); ++i)
        others += fmt::format(", {} {:.4f}", cfg.data.val[i].name, r.last_val_losses.at(cfg.data.val[i].name));
      fmt::print("fp8train: done: {} steps, first val_loss {:.4f}, last val_loss {:.4f}{}\n", r.steps,
                 r.first_val_loss, r.last_val_loss, others);
    } else
      fmt::print("fp8train: done: {} steps, last train loss {:.4f} (no validation data)\n", r.steps,
                 r.last_train_loss);
  });
}

}  // namespace fp8t::cli
