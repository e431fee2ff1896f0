// `fp8train prepare`: text files -> GPT-2 BPE token shards (train/val) in llm.c's format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8t {

struct PrepareOptions {
  std::string vocab_dir;            // holds encoder.json and vocab.bpe
  std::string out_dir;              // created if missing; shards are written here
  std::vector<std::string> inputs;  // UTF-8 text files, each one document
  double val_fraction = 0.1;        // share of each document's tokens that goes to val, [0, 1)
  int64_t shard_tokens = 100'000'000;  // tokens per shard file (llm.c's fineweb uses 1e8)
  std::string prefix;               // shard names: <prefix>{train,val}_NNNNNN.bin
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> train_files;
  std::vector<std::string> val_files;
};

// Each input is one document, tokenized as [EOT] + encode(text) like llm.c's prepare scripts.
// Split: the first round(val_fraction * n) tokens of every document (n counts its leading EOT)
// go to val and the rest, after an EOT of its own, to train, so val samples every input (e.g. every Brown genre) rather
// than only the first file; with one input this is llm.c's "first tokens are val". Inputs are
// processed in the order given, so the output is deterministic. Existing shards with the same
// names are replaced atomically. Throws Error if the build lacks PCRE2.
PrepareStats prepare_shards(const PrepareOptions& opts);

}  // namespace fp8t
