// fp8train export --checkpoint DIR --out DIR
#include <memory>

#include "cli/commands.h"
#include <fmt/format.h>

#include "core/allocator.h"
#include "train/export.h"

namespace fp8t::cli {

void add_export(CLI::App& app) {
  struct Opts {
    std::string checkpoint, out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("export", "write a checkpoint as Hugging Face GPT-2 (safetensors + config.json)");
  cmd->add_option("--checkpoint", o->checkpoint, "run directory or checkpoint directory")->required();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->callback([o] {
    const ExportStats s = export_hf_gpt2(o->checkpoint, o->out);
    if (!s.warning.empty()) fmt::print(stderr, "fp8train: warning: {}\n", s.warning);
    fmt::print("fp8train: exported {} tensors ({}) to {}\n", s.tensors, format_bytes(s.bytes), o->out);
  });
}

}  // namespace fp8t::cli
