// fp8train import (--hf DIR | --llmc FILE) --out RUN_DIR
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "core/check.h"
#include "train/import.h"

namespace fp8t::cli {

void add_import(CLI::App& app) {
  struct Opts {
    std::string hf, llmc, out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "import", "write GPT-2 weights from Hugging Face or llm.c as a run directory (step-0 checkpoint, weights only)");
  CLI::Option* hf = cmd->add_option("--hf", o->hf, "Hugging Face GPT-2 directory: model.safetensors and config.json");
  CLI::Option* llmc = cmd->add_option("--llmc", o->llmc, "llm.c model file (version 3: f32, 5: bf16)");
  hf->excludes(llmc);
  cmd->add_option("--out", o->out, "run directory to write (must hold no checkpoint yet)")->required();
  cmd->callback([o] {
    FP8T_CHECK(!o->hf.empty() || !o->llmc.empty(),
               "import needs the weights to read: --hf DIR (model.safetensors + config.json) or --llmc FILE.bin");
    const ImportStats s = o->hf.empty() ? import_llmc_gpt2(o->llmc, o->out) : import_hf_gpt2(o->hf, o->out);
    for (const std::string& w : s.warnings) fmt::print(stderr, "fp8train: warning: {}\n", w);
    const ModelConfig& m = s.model;
    fmt::print("fp8train: imported {} tensors into {}\n"
               "  model: {{n_layer: {}, n_head: {}, d_model: {}, vocab_size: {}, seq_len: {}}}\n"
               "  train from it with a config of that model and --set train.init_from={} (or --resume {})\n",
               s.tensors, s.checkpoint.string(), m.n_layer, m.n_head, m.d_model, m.vocab_size, m.seq_len, o->out,
               o->out);
  });
}

}  // namespace fp8t::cli
