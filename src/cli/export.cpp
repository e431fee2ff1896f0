// fp8train export --checkpoint DIR --out PATH [--format hf|llmc] [--dtype f32|bf16]
#include <memory>

#include "cli/commands.h"
#include <fmt/format.h>

#include "core/allocator.h"
#include "core/check.h"
#include "train/export.h"

namespace fp8t::cli {

void add_export(CLI::App& app) {
  struct Opts {
    std::string checkpoint, out, format = "hf", dtype = "f32";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "export", "write a checkpoint as Hugging Face GPT-2 (safetensors + config.json) or an llm.c model file");
  cmd->add_option("--checkpoint", o->checkpoint, "run directory or checkpoint directory")->required();
  cmd->add_option("--out", o->out, "output directory (hf), or the model file to write (llmc)")->required();
  cmd->add_option("--format", o->format, "hf (default): model.safetensors + config.json; llmc: llm.c model file")
      ->check(CLI::IsMember({"hf", "llmc"}));
  CLI::Option* dtype =
      cmd->add_option("--dtype", o->dtype, "llmc weights: f32 (version 3, default) or bf16 (version 5)")
          ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([o, dtype] {
    FP8T_CHECK(o->format == "llmc" || dtype->count() == 0,
               "--dtype {} applies to --format llmc; the Hugging Face export is always F32", o->dtype);
    const ExportStats s = o->format == "hf"
                              ? export_hf_gpt2(o->checkpoint, o->out)
                              : export_llmc_gpt2(o->checkpoint, o->out, o->dtype == "bf16" ? DType::bf16 : DType::f32);
    if (!s.warning.empty()) fmt::print(stderr, "fp8train: warning: {}\n", s.warning);
    fmt::print("fp8train: exported {} tensors ({}) to {}\n", s.tensors, format_bytes(s.bytes), o->out);
  });
}

}  // namespace fp8t::cli
