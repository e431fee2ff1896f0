// fp8train plan --config F [--set ...] [--world N] [--memory-gib G] [--compare]: memory per category and
// the largest micro-batch that fits, for this card or one of G GiB, and optionally every alternative.
#include <fmt/format.h>

#include <memory>
#include <new>

#include "cli/commands.h"
#include "config/config.h"
#include "core/check.h"
#include "train/planner.h"

namespace fp8t::cli {

void add_plan(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> sets;
    int world = 1;
    double memory_gib = 0;
    bool compare = false;
    int time_steps = 3;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("plan", "measure memory per category and the largest micro-batch that fits");
  cmd->add_option("--config,-c", o->config, "YAML run config")->required();
  cmd->add_option("--set", o->sets, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--world", o->world, "data-parallel ranks to plan for (ZeRO shards the optimizer state over them, at stage 2 the gradients too)");
  cmd->add_option("--memory-gib", o->memory_gib,
                  "plan for a card of this many GiB: the memory pool is capped there, as run.memory_limit_gib caps a "
                  "run (default: the whole device)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--compare", o->compare,
                "also plan each activation storage, optimizer-state dtype, recompute mode and ZeRO stage (and BF16 "
                "mode for an FP8 config), and time a training micro-step of each");
  cmd->add_option("--time-steps", o->time_steps, "micro-steps timed per option with --compare (default 3)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o] {
    Config cfg = load_config(o->config, o->sets);
    check_device(cfg);
    if (o->memory_gib > 0) cfg.run.memory_limit_gib = o->memory_gib;
    MemoryPlan p;
    try {
      p = plan_memory(cfg, o->world);
    } catch (const std::bad_alloc&) {
      throw fp8t::Error(fmt::format("out of host memory while measuring the memory plan: {}", memory_hint(cfg)));
    }
    fmt::print("fp8train plan: {} on {}, {} rank(s), zero_stage {}, compute {}{}\n{}", o->config, cfg.run.device.str(),
               o->world, cfg.distributed.zero_stage,
               cfg.precision.compute == ComputeMode::fp8    ? "fp8"
               : cfg.precision.compute == ComputeMode::bf16 ? "bf16"
                                                             : "fp32",
               cfg.run.memory_limit_gib > 0 ? fmt::format(", memory capped at {:g} GiB", cfg.run.memory_limit_gib) : "",
               p.table());
    if (!o->compare) return;
    const std::vector<PlanOption> options = plan_options(cfg, o->world);
    std::vector<MemoryPlan> plans;
    for (const PlanOption& opt : options) {
      fmt::print("planning: {}\n", opt.name);
      std::fflush(stdout);
      plans.push_back(plan_memory(opt.cfg, o->world, o->time_steps));
    }
    fmt::print("\n{}", compare_table(options, plans));
  });
}

}  // namespace fp8t::cli
