// Token shard I/O in llm.c's format and the rank-strided ShardLoader (see shard.h).
#include "data/shard.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>

#include "core/check.h"

namespace fp8t {

// The format is little-endian on disk; we write and read it as native ints.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes a little-endian host");

namespace {

constexpr const char* kRegenerate = "re-run scripts/prepare_data.sh (or regenerate the shard)";

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Validates the header and the file size against it; returns the token count.
int64_t read_header(std::FILE* f, const std::string& path) {
  std::array<int32_t, kShardHeaderInts> header{};
  const size_t got = std::fread(header.data(), sizeof(int32_t), header.size(), f);
  FP8T_CHECK(got == header.size(),
             "token shard {}: file is shorter than the {}-byte header; it is truncated or not a "
             "shard: {}",
             path, kShardHeaderInts * sizeof(int32_t), kRegenerate);
  FP8T_CHECK(header[0] != static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(kShardMagic))),
             "token shard {}: the magic {} is byte-swapped: the shard was written in big-endian "
             "order, and this format is little-endian: {}",
             path, kShardMagic, kRegenerate);
  FP8T_CHECK(header[0] == kShardMagic,
             "token shard {}: bad magic {} (expected {}); this is not an llm.c token shard: {}",
             path, header[0], kShardMagic, kRegenerate);
  FP8T_CHECK(header[1] == kShardVersion,
             "token shard {}: unsupported version {} (expected {}, uint16 tokens): {}", path,
             header[1], kShardVersion, kRegenerate);
  FP8T_CHECK(header[2] >= 0, "token shard {}: negative token count {} in the header: {}", path,
             header[2], kRegenerate);
  const int64_t count = header[2];
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  FP8T_CHECK(!ec, "token shard {}: cannot stat: {}", path, ec.message());
  const uint64_t header_bytes = kShardHeaderInts * sizeof(int32_t);
  FP8T_CHECK(size < header_bytes || (size - header_bytes) % sizeof(uint16_t) == 0,
             "token shard {}: {} bytes follow the header, an odd number, but tokens are 2-byte "
             "uint16 (the header counts {} tokens); the file is truncated or not a token shard: {}",
             path, size - header_bytes, count, kRegenerate);
  const uint64_t expected = header_bytes + count * sizeof(uint16_t);
  FP8T_CHECK(size == expected,
             "token shard {}: size is {} bytes but the header's count of {} tokens implies {} "
             "bytes; the file is truncated or corrupt: {}",
             path, size, count, expected, kRegenerate);
  return count;
}

File open_shard(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  FP8T_CHECK(std::filesystem::exists(status),
             "token shard {}: no such file; run scripts/prepare_data.sh or fix the data path",
             path);
  FP8T_CHECK(std::filesystem::is_regular_file(status),
             "token shard {}: not a regular file (a directory?); a data glob must match only token "
             "shard files",
             path);
  File f(std::fopen(path.c_str(), "rb"));
  FP8T_CHECK(f != nullptr, "token shard {}: cannot open for reading: {}", path, std::strerror(errno));
  return f;
}

// The largest id: a max-reduce that compiles to packed unsigned 16-bit maxima (omp simd, so that it
// is vectorized at -O2 too).
uint16_t max_token(std::span<const uint16_t> tokens) {
  const uint16_t* p = tokens.data();
  const size_t n = tokens.size();
  uint16_t m = 0;
#pragma omp simd reduction(max : m)
  for (size_t i = 0; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

int64_t shard_token_count(const std::string& path) {
  return read_header(open_shard(path).get(), path);
}

// splitmix64: a fixed generator, so shuffles are identical on every platform and library
// (std::shuffle's algorithm is implementation-defined).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <typename T>
void shuffle_in_place(std::vector<T>& v, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = splitmix64(state) % i;  // modulo bias is irrelevant at these sizes
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  FP8T_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "token shard {}: {} tokens do not fit the int32 count of llm.c's header; write "
             "smaller shards",
             path, tokens.size());
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp";
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    FP8T_CHECK(f != nullptr, "token shard {}: cannot open {} for writing", path, tmp);
    bool ok =
        std::fwrite(header.data(), sizeof(int32_t), header.size(), f.get()) == header.size();
    // An empty span may have a null data(), which fwrite must not get (UBSan).
    ok = ok && (tokens.empty() ||
                std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f.get()) == tokens.size());
    // fsync before rename: otherwise a crash can leave the new name pointing at missing data.
    ok = ok && std::fflush(f.get()) == 0 && ::fsync(::fileno(f.get())) == 0;
    if (!ok) {
      f.reset();
      std::remove(tmp.c_str());
      FP8T_FAIL("token shard {}: write to {} failed (disk full?)", path, tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    FP8T_FAIL("token shard {}: cannot rename {} into place: {}", path, tmp, ec.message());
  }
}

std::vector<uint16_t> read_shard(const std::string& path) {
  File f = open_shard(path);
  const int64_t count = read_header(f.get(), path);
  std::vector<uint16_t> tokens;
  try {
    tokens.resize(count);
  } catch (const std::bad_alloc&) {
    FP8T_FAIL("token shard {}: out of host memory for its {} tokens ({:.1f} MiB); the loader holds one "
              "shard at a time per loader: write smaller shards",
              path, count, count * 2.0 / (1 << 20));
  }
  const size_t got = std::fread(tokens.data(), sizeof(uint16_t), tokens.size(), f.get());
  FP8T_CHECK(got == tokens.size(), "token shard {}: read {} of {} tokens: {}", path, got, count,
             kRegenerate);
  return tokens;
}

namespace {

// check_token_ids of tokens that start at token `first` of the shard.
void check_token_ids_from(std::span<const uint16_t> tokens, int vocab_size, const std::string& path,
                          int64_t first) {
  FP8T_CHECK(vocab_size >= 1, "token shard {}: vocabulary size {} must be >= 1", path, vocab_size);
  if (vocab_size >= kAnyTokenId || tokens.empty() || max_token(tokens) < vocab_size) return;
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [&](uint16_t id) { return id >= vocab_size; });
  const int64_t position = first + (bad - tokens.begin());
  const int padded = (vocab_size + 127) / 128 * 128;
  const std::string padding =
      *bad < padded ? fmt::format("; ids {}..{} are the embedding's padding rows, never a token",
                                  vocab_size, padded - 1)
                    : "";
  FP8T_FAIL("token shard {}: token {} (byte offset {}) is id {}, outside the model's vocabulary of {} "
            "ids (model.vocab_size){}; the shard was made with another tokenizer, or "
            "model.vocab_size is too small: re-tokenize the data or raise model.vocab_size above {}",
            path, position, kShardHeaderInts * sizeof(int32_t) + position * sizeof(uint16_t), *bad,
            vocab_size, padding, *bad);
}

// Every id of the shard file against vocab_size, read in chunks of 4 MiB (the file is never held whole).
void check_shard_file_ids(const std::string& path, int vocab_size) {
  if (vocab_size >= kAnyTokenId) return;
  File f = open_shard(path);
  const int64_t count = read_header(f.get(), path);
  if (count <= 0) return;
  std::vector<uint16_t> chunk(static_cast<size_t>(std::min<int64_t>(count, int64_t{1} << 21)));
  for (int64_t done = 0; done < count;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(chunk.size()), count - done));
    const size_t got = std::fread(chunk.data(), sizeof(uint16_t), n, f.get());
    FP8T_CHECK(got == n, "token shard {}: read {} of {} tokens: {}", path, done + static_cast<int64_t>(got),
               count, kRegenerate);
    check_token_ids_from(std::span<const uint16_t>(chunk.data(), n), vocab_size, path, done);
    done += static_cast<int64_t>(n);
  }
}

}  // namespace

void check_token_ids(std::span<const uint16_t> tokens, int vocab_size, const std::string& path) {
  check_token_ids_from(tokens, vocab_size, path, 0);
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  FP8T_CHECK(rc == 0 || rc == GLOB_NOMATCH,
             "cannot expand '{}': glob() failed with code {} (unreadable directory?)", pattern, rc);
  // glob(3) sorts by the locale's collation; plain byte order is the same everywhere.
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  FP8T_CHECK(!pattern.empty(),
             "no token shard glob given (an empty data.train or data.val); set the data paths in "
             "the config");
  std::vector<std::string> paths = glob_files(pattern);
  FP8T_CHECK(!paths.empty(),
             "no files match '{}'; check the data paths in the config or run "
             "scripts/prepare_data.sh",
             pattern);
  return paths;
}

ShardLoader::ShardLoader(const std::string& pattern, int B, int T, int rank, int world,
                         uint64_t seed_or_0, int vocab_size)
    : files_(expand_glob(pattern)), B_(B), T_(T), rank_(rank), world_(world), seed_(seed_or_0),
      vocab_size_(vocab_size) {
  FP8T_CHECK(vocab_size >= 1, "data loader: vocabulary size {} must be >= 1", vocab_size);
  FP8T_CHECK(B > 0 && T > 0, "data loader: batch size B={} and sequence length T={} must be > 0",
             B, T);
  FP8T_CHECK(world > 0 && rank >= 0 && rank < world,
             "data loader: rank {} is outside a world of size {}", rank, world);
  // Check every shard's header now, so a bad file fails at startup rather than hours in.
  const int64_t group = int64_t{world} * B * T;
  for (const std::string& path : files_) {
    const int64_t n = shard_token_count(path);
    FP8T_CHECK(n > 0,
               "token shard {}: holds no tokens (its header counts 0); remove it from the glob or "
               "regenerate it",
               path);
    FP8T_CHECK(n >= group + 1,
               "token shard {}: holds {} tokens, but one step over {} ranks with B={} T={} needs "
               "world*B*T+1 = {}; use a smaller train.micro_batch or model.seq_len, fewer ranks, or "
               "larger shards",
               path, n, world, B, T, group + 1);
    batches_per_epoch_ += (n - 1) / group;
  }
  // And every shard's ids (one streamed pass over the files), so that a bad id in a shard the run reaches
  // only later fails now, naming it, not hours in; the shard in memory is checked again when it loads.
  for (const std::string& path : files_) check_shard_file_ids(path, vocab_size_);
  reset();
}

void ShardLoader::reset() { start_epoch(0); }

void ShardLoader::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  shard_order_.resize(files_.size());
  for (size_t i = 0; i < files_.size(); ++i) shard_order_[i] = i;
  if (seed_ != 0) shuffle_in_place(shard_order_, seed_ ^ (0xA5A5A5A5ull + epoch * 0x10001ull));
  load_shard(0);
}

void ShardLoader::load_shard(size_t order_index) {
  order_pos_ = order_index;
  const size_t file = shard_order_[order_index];
  if (file != loaded_file_) {  // a single-shard glob never reloads
    std::vector<uint16_t> tokens = read_shard(files_[file]);
    check_token_ids(tokens, vocab_size_, files_[file]);
    tokens_ = std::move(tokens);
    loaded_file_ = file;
  }
  const int64_t groups = (static_cast<int64_t>(tokens_.size()) - 1) / (int64_t{world_} * B_ * T_);
  group_order_.resize(groups);
  for (int64_t g = 0; g < groups; ++g) group_order_[g] = g;
  if (seed_ != 0) {
    shuffle_in_place(group_order_, seed_ + 0x9E37ull * (epoch_ + 1) + 0x51ull * file);
  }
  group_pos_ = 0;
}

void ShardLoader::next_batch(int32_t* inputs, int32_t* targets) {
  if (group_pos_ == group_order_.size()) {
    if (order_pos_ + 1 < shard_order_.size()) {
      load_shard(order_pos_ + 1);
    } else {
      start_epoch(epoch_ + 1);  // wrap around to the first shard
    }
  }
  const int64_t BT = int64_t{B_} * T_;
  const int64_t start = group_order_[group_pos_++] * world_ * BT + rank_ * BT;
  const uint16_t* window = tokens_.data() + start;  // BT + 1 tokens, checked in the ctor
  for (int64_t i = 0; i < BT; ++i) {
    inputs[i] = window[i];
    targets[i] = window[i + 1];
  }
}

}  // namespace fp8t
