// fp8train prepare --vocab DIR --out DIR TEXT_FILES...
#include <memory>

#include "cli/commands.h"
#include "data/prepare.h"

namespace fp8t::cli {

void add_prepare(CLI::App& app) {
  auto opts = std::make_shared<PrepareOptions>();
  CLI::App* cmd = app.add_subcommand("prepare", "tokenize text files with GPT-2 BPE into llm.c token shards");
  cmd->add_option("--vocab", opts->vocab_dir, "directory with encoder.json and vocab.bpe")->required();
  cmd->add_option("--out", opts->out_dir, "output directory for train_*.bin / val_*.bin")->required();
  cmd->add_option("--val-fraction", opts->val_fraction, "fraction of tokens held out for validation");
  cmd->add_option("--prefix", opts->prefix, "file name prefix for the shards");
  cmd->add_option("inputs", opts->inputs, "text files")->required()->check(CLI::ExistingFile);
  cmd->callback([opts] {
    const auto stats = prepare_shards(*opts);
    (void)stats;
  });
}

}  // namespace fp8t::cli
