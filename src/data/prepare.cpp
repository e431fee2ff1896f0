// prepare_shards(): tokenize text files with GPT-2 BPE and write train/val shards (see prepare.h).
#include "data/prepare.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/check.h"
#include "data/bpe.h"
#include "data/shard.h"

namespace fp8t {

namespace {

// Buffers one split's tokens and flushes a shard file every shard_tokens tokens.
class ShardWriter {
 public:
  ShardWriter(std::string out_dir, std::string name, int64_t shard_tokens)
      : out_dir_(std::move(out_dir)), name_(std::move(name)), shard_tokens_(shard_tokens) {}

  void append(const std::vector<int>& ids, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      // GPT-2 ids stop at 50256, so uint16 (llm.c's token type) always holds them.
      FP8T_CHECK(ids[i] >= 0 && ids[i] <= 0xFFFF, "prepare: token id {} does not fit uint16",
                 ids[i]);
      buffer_.push_back(static_cast<uint16_t>(ids[i]));
      ++total_;
      if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) flush();
    }
  }

  // Writes the partial last shard (and an empty one if the split got no tokens, so the glob
  // in a config still matches and the loader reports the size problem by name).
  void finish() {
    if (!buffer_.empty() || files_.empty()) flush();
    remove_stale();
  }

  int64_t total() const { return total_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void flush() {
    const std::string path =
        (std::filesystem::path(out_dir_) / fmt::format("{}_{:06d}.bin", name_, files_.size()))
            .string();
    write_shard(path, buffer_);
    files_.push_back(path);
    buffer_.clear();
  }

  // A previous run with more data may have left higher-numbered shards that a glob would pick up.
  void remove_stale() const {
    const std::string head = name_ + "_";
    for (const auto& entry : std::filesystem::directory_iterator(out_dir_)) {
      const std::string file = entry.path().filename().string();
      const bool ours = file.size() == head.size() + 10 && file.starts_with(head) &&
                        file.ends_with(".bin") &&
                        file.find_first_not_of("0123456789", head.size()) == head.size() + 6;
      if (!ours) continue;
      const size_t index = std::stoul(file.substr(head.size(), 6));
      if (index >= files_.size()) std::filesystem::remove(entry.path());
    }
  }

  std::string out_dir_, name_;
  int64_t shard_tokens_;
  std::vector<uint16_t> buffer_;
  std::vector<std::string> files_;
  int64_t total_ = 0;
};

[[maybe_unused]] std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FP8T_CHECK(in.good(), "prepare: cannot read input text file {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

PrepareStats prepare_shards(const PrepareOptions& opts) {
  FP8T_CHECK(!opts.inputs.empty(), "prepare: no input text files given");
  FP8T_CHECK(!opts.out_dir.empty(), "prepare: no output directory given (--out)");
  FP8T_CHECK(opts.val_fraction >= 0.0 && opts.val_fraction < 1.0,
             "prepare: val_fraction {} must be in [0, 1)", opts.val_fraction);
  FP8T_CHECK(opts.shard_tokens > 0 && opts.shard_tokens <= 0x7FFFFFFF,
             "prepare: shard_tokens {} must be in [1, 2^31-1] (llm.c's int32 header count)",
             opts.shard_tokens);
#ifndef FP8T_HAVE_PCRE2
  FP8T_FAIL(
      "prepare: this build has no GPT-2 tokenizer because PCRE2 was not found; install "
      "libpcre2-dev (Debian/Ubuntu) or pcre2-devel and rebuild");
#else
  for (const std::string& input : opts.inputs) {  // fail before any work on a typo
    FP8T_CHECK(std::filesystem::is_regular_file(input), "prepare: input {} is not a file",
               input);
  }
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(opts.vocab_dir);
  std::error_code ec;
  std::filesystem::create_directories(opts.out_dir, ec);
  FP8T_CHECK(!ec, "prepare: cannot create output directory {}: {}", opts.out_dir, ec.message());

  ShardWriter train(opts.out_dir, opts.prefix + "train", opts.shard_tokens);
  ShardWriter val(opts.out_dir, opts.prefix + "val", opts.shard_tokens);
  PrepareStats stats;
  for (const std::string& input : opts.inputs) {
    std::vector<int> ids{tok.eot()};
    const std::vector<int> text_ids = tok.encode(read_text(input));
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    const auto n_val = static_cast<size_t>(std::llround(opts.val_fraction * ids.size()));
    val.append(ids, 0, n_val);
    // The train part starts with an EOT of its own, so that documents stay separated in train too
    // (the document's leading EOT went to val).
    if (n_val > 0 && n_val < ids.size()) {
      ids[n_val - 1] = tok.eot();
      train.append(ids, n_val - 1, ids.size());
    } else {
      train.append(ids, n_val, ids.size());
    }
    ++stats.documents;
  }
  train.finish();
  val.finish();
  stats.train_tokens = train.total();
  stats.val_tokens = val.total();
  stats.train_files = train.files();
  stats.val_files = val.files();
  return stats;
#endif
}

}  // namespace fp8t
