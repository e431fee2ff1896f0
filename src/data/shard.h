// Token shards in llm.c's format (256 x int32 header, then uint16 tokens): writer, reader,
// glob expansion, and ShardLoader, which serves (B, T) training batches strided over ranks.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace fp8t {

// llm.c's header constants: shards written by llm.c / nanoGPT-style scripts read unchanged.
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int kShardHeaderInts = 256;

// Writes path+".tmp" and renames it over path, so a crash never leaves a half-written shard
// that a later run would accept.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);

// Reads a whole shard; throws Error naming the file on a missing file, bad magic or version,
// or a size that disagrees with the header's token count.
std::vector<uint16_t> read_shard(const std::string& path);

// A vocabulary limit that admits every uint16 id (no check).
inline constexpr int kAnyTokenId = 65536;

// Throws Error naming `path`, the first position (counted from the shard's first token) and its id
// when a token is >= vocab_size; ids of the embedding's padding rows (vocab_size .. padded) are
// outside the vocabulary too. One vectorized max-reduce pass; the position is searched only then.
void check_token_ids(std::span<const uint16_t> tokens, int vocab_size, const std::string& path);

// POSIX glob(3), sorted byte-wise; empty when nothing matches; throws Error when glob() fails.
std::vector<std::string> glob_files(const std::string& pattern);
// The same, but nothing matching is an Error naming the pattern.
std::vector<std::string> expand_glob(const std::string& pattern);

// Serves next-token batches from the shards of a glob, one shard in memory at a time.
// As in llm.c's DataLoader, each step consumes a group of world*B*T tokens of the current shard
// and rank r takes the window starting at r*B*T inside it, so ranks read disjoint data and
// together cover the stream. A shard contributes floor((n-1) / (world*B*T)) groups (the +1 is
// the last target); then the next shard starts, and after the last one the first comes again.
// With seed != 0 the shard order and the group order inside each shard are shuffled per epoch
// from the seed alone, so every rank (same seed) still agrees on the order.
// Every shard's token ids are checked against vocab_size by the constructor (one streamed pass over each
// file, so a bad id anywhere fails at start-up) and again when the shard is loaded (check_token_ids).
class ShardLoader {
 public:
  ShardLoader(const std::string& pattern, int B, int T, int rank, int world, uint64_t seed_or_0,
              int vocab_size = kAnyTokenId);

  // inputs and targets each hold B*T tokens; targets[i] is the token after inputs[i].
  void next_batch(int32_t* inputs, int32_t* targets);  // (B, T) each
  // Back to the first batch of epoch 0: evaluation calls this so every eval sees the same data.
  void reset();

  const std::vector<std::string>& files() const { return files_; }
  int64_t epoch() const { return epoch_; }
  // Batches this rank gets from one pass over all shards.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

 private:
  void start_epoch(int64_t epoch);
  void load_shard(size_t order_index);

  std::vector<std::string> files_;
  int B_, T_, rank_, world_;
  uint64_t seed_;
  int vocab_size_;
  int64_t batches_per_epoch_ = 0;

  int64_t epoch_ = 0;
  std::vector<size_t> shard_order_;  // permutation of files_ for this epoch
  size_t order_pos_ = 0;             // index into shard_order_
  size_t loaded_file_ = SIZE_MAX;    // index into files_ of tokens_
  std::vector<uint16_t> tokens_;
  std::vector<int64_t> group_order_;  // permutation of this shard's groups
  size_t group_pos_ = 0;
};

}  // namespace fp8t
