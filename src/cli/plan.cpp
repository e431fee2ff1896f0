// fp8train plan --config F [--set ...] [--world N]: memory per category and the largest micro-batch.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "config/config.h"
#include "train/planner.h"

namespace fp8t::cli {

void add_plan(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> sets;
    int world = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("plan", "measure memory per category and the largest micro-batch that fits");
  cmd->add_option("--config,-c", o->config, "YAML run config")->required();
  cmd->add_option("--set", o->sets, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--world", o->world, "data-parallel ranks to plan for (ZeRO shards the optimizer state over them, at stage 2 the gradients too)");
  cmd->callback([o] {
    const Config cfg = load_config(o->config, o->sets);
    const MemoryPlan p = plan_memory(cfg, o->world);
    fmt::print("fp8train plan: {} on {}, {} rank(s), zero_stage {}, compute {}\n{}", o->config, cfg.run.device.str(),
               o->world, cfg.distributed.zero_stage,
               cfg.precision.compute == ComputeMode::fp8    ? "fp8"
               : cfg.precision.compute == ComputeMode::bf16 ? "bf16"
                                                             : "fp32",
               p.table());
  });
}

}  // namespace fp8t::cli
