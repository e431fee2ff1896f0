// Malformed token shards, table-driven: read_shard and ShardLoader refuse each with a message naming
// the file and what is wrong; token ids outside the vocabulary are refused when a shard is loaded.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/check.h"
#include "data/shard.h"
#include "tests/util/temp_dir.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

// Tokens 0, 1, 2, ... wrapping below `vocab`.
std::vector<uint16_t> tokens_below(size_t n, int vocab) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i % vocab);
  return v;
}

void patch_int(const std::string& path, int slot, int32_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(slot * 4);
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
}

void append_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::app) << bytes;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

constexpr int kVocab = 1000;
constexpr size_t kTokens = 100;

}  // namespace

TEST_CASE("shard malformed: every damaged file is refused by name, by the reader and the loader",
          "[data][malformed]") {
  struct Case {
    const char* name;
    // Damages a valid shard of kTokens tokens at `path` (or replaces it).
    std::function<void(const std::string& path)> damage;
    std::vector<std::string> words;
    bool reader_refuses = true;  // false: the file is well-formed, only the loader refuses it
  };
  const Case cases[] = {
      {"empty file", [](const std::string& p) { fs::resize_file(p, 0); }, {"shorter than the 1024-byte header"}},
      {"truncated header", [](const std::string& p) { fs::resize_file(p, 100); }, {"header", "truncated"}},
      {"header one byte short", [](const std::string& p) { fs::resize_file(p, 1023); }, {"header"}},
      {"bad magic", [](const std::string& p) { patch_int(p, 0, 12345); }, {"bad magic 12345", "20240520"}},
      {"byte-swapped magic",
       [](const std::string& p) { patch_int(p, 0, static_cast<int32_t>(__builtin_bswap32(20240520u))); },
       {"byte-swapped", "big-endian"}},
      {"llm.c model file magic", [](const std::string& p) { patch_int(p, 0, 20240326); }, {"bad magic"}},
      {"version 0", [](const std::string& p) { patch_int(p, 1, 0); }, {"unsupported version 0"}},
      {"version 2", [](const std::string& p) { patch_int(p, 1, 2); }, {"unsupported version 2"}},
      {"negative count", [](const std::string& p) { patch_int(p, 2, -5); }, {"negative token count -5"}},
      {"count one too large", [](const std::string& p) { patch_int(p, 2, kTokens + 1); }, {"101 tokens implies"}},
      {"count one too small", [](const std::string& p) { patch_int(p, 2, kTokens - 1); }, {"99 tokens implies"}},
      {"count INT32_MAX",
       [](const std::string& p) { patch_int(p, 2, std::numeric_limits<int32_t>::max()); },
       {"2147483647 tokens"}},
      {"truncated tokens", [](const std::string& p) { fs::resize_file(p, 1024 + 2 * 60); }, {"truncated or corrupt"}},
      {"odd byte count (one extra)", [](const std::string& p) { append_bytes(p, "x"); }, {"an odd number", "uint16"}},
      {"odd byte count (one short)", [](const std::string& p) { fs::resize_file(p, 1024 + 2 * kTokens - 1); },
       {"an odd number"}},
      {"a text file", [](const std::string& p) { std::ofstream(p) << std::string(2000, 'a'); }, {"bad magic"}},
      {"zero tokens", [](const std::string& p) { write_shard(p, {}); }, {"holds no tokens"}, false},
      {"too few tokens for one step", [](const std::string& p) { write_shard(p, tokens_below(8, kVocab)); },
       {"holds 8 tokens", "world*B*T+1 = 17"}, false},
      {"a directory", [](const std::string& p) {
         fs::remove(p);
         fs::create_directory(p);
       },
       {"not a regular file"}},
      {"a dangling link", [](const std::string& p) {
         fs::remove(p);
         fs::create_symlink(p + ".gone", p);
       },
       {"no such file"}},
      {"id at vocab_size", [](const std::string& p) {
         auto t = tokens_below(kTokens, kVocab);
         t[42] = kVocab;
         write_shard(p, t);
       }, {"token 42 ", "id 1000", "vocabulary of 1000"}, false},
      {"id in the padding rows", [](const std::string& p) {
         auto t = tokens_below(kTokens, kVocab);
         t[99] = 1020;  // padded vocabulary: 1024; position 99 is only ever a target
         write_shard(p, t);
       }, {"token 99 ", "id 1020", "padding rows"}, false},
      {"id 65535", [](const std::string& p) {
         auto t = tokens_below(kTokens, kVocab);
         t[0] = 65535;
         write_shard(p, t);
       }, {"token 0 ", "id 65535", "byte offset 1024"}, false},
  };
  int n = 0;
  for (const Case& c : cases) {
    INFO(c.name);
    TempDir dir;
    const std::string path = dir.file("train_000000.bin");
    write_shard(path, tokens_below(kTokens, kVocab));
    c.damage(path);
    if (c.reader_refuses) {
      const std::string msg = error_of([&] { read_shard(path); });
      INFO("read_shard: " << msg);
      REQUIRE_FALSE(msg.empty());
      CHECK_THAT(msg, ContainsSubstring("token shard " + path));
      for (const auto& w : c.words) CHECK_THAT(msg, ContainsSubstring(w));
    }
    const std::string msg = error_of([&] { ShardLoader(dir.file("train_*.bin"), 2, 4, 0, 2, 0, kVocab); });
    INFO("ShardLoader: " << msg);
    REQUIRE_FALSE(msg.empty());
    CHECK_THAT(msg, ContainsSubstring(path));
    for (const auto& w : c.words) CHECK_THAT(msg, ContainsSubstring(w));
    ++n;
  }
  CHECK(n >= 20);
}

TEST_CASE("shard malformed: token ids are checked against the vocabulary at load", "[data][malformed]") {
  std::vector<uint16_t> t = tokens_below(5000, 50257);
  CHECK_NOTHROW(check_token_ids(t, 50257, "ok.bin"));
  t[4000] = 50256;  // the last real id
  CHECK_NOTHROW(check_token_ids(t, 50257, "ok.bin"));
  CHECK_NOTHROW(check_token_ids({}, 50257, "empty.bin"));
  t[3000] = 50303;  // the last padding row of 50304
  t[3500] = 50257;
  const std::string msg = error_of([&] { check_token_ids(t, 50257, "s.bin"); });
  CHECK_THAT(msg, ContainsSubstring("token shard s.bin: token 3000 ") && ContainsSubstring("id 50303") &&
                      ContainsSubstring("50257..50303") && ContainsSubstring("model.vocab_size"));
  t[3000] = 50304;  // past the padding: no padding note
  CHECK_THAT(error_of([&] { check_token_ids(t, 50257, "s.bin"); }),
             ContainsSubstring("id 50304") && !ContainsSubstring("padding"));
  t[3000] = 65535;
  CHECK_NOTHROW(check_token_ids(t, kAnyTokenId, "any.bin"));  // every uint16 id allowed
  CHECK_NOTHROW(check_token_ids(t, 70000, "big.bin"));
  CHECK_THAT(error_of([&] { check_token_ids(t, 0, "z.bin"); }), ContainsSubstring("z.bin"));
}

TEST_CASE("shard malformed: a bad id in a later shard fails at start-up, naming it", "[data][malformed]") {
  TempDir dir;
  constexpr int B = 2, T = 4;
  const auto good = tokens_below(2 * B * T + 1, kVocab);  // two batches
  write_shard(dir.file("train_000000.bin"), good);
  auto bad = good;
  bad[5] = 2000;
  write_shard(dir.file("train_000001.bin"), bad);
  // The constructor reads every shard's ids, not only the first one it serves.
  CHECK_THAT(error_of([&] { ShardLoader(dir.file("train_*.bin"), B, T, 0, 1, 0, kVocab); }),
             ContainsSubstring(dir.file("train_000001.bin")) && ContainsSubstring("token 5 ") &&
                 ContainsSubstring("id 2000"));
  // Past the streaming pass's first chunk (2^21 tokens), positions still count from the shard's start.
  auto big = tokens_below((1 << 21) + 100, kVocab);
  big[(1 << 21) + 7] = 3000;
  write_shard(dir.file("big_000000.bin"), big);
  CHECK_THAT(error_of([&] { ShardLoader(dir.file("big_*.bin"), B, T, 0, 1, 0, kVocab); }),
             ContainsSubstring("token 2097159 ") && ContainsSubstring("id 3000"));
  // A shard replaced after start-up is checked again when it loads.
  write_shard(dir.file("train_000001.bin"), good);
  ShardLoader loader(dir.file("train_*.bin"), B, T, 0, 1, 0, kVocab);  // file order: shard 0 first
  write_shard(dir.file("train_000001.bin"), bad);
  std::vector<int32_t> x(B * T), y(B * T);
  loader.next_batch(x.data(), y.data());
  loader.next_batch(x.data(), y.data());
  CHECK_THAT(error_of([&] { loader.next_batch(x.data(), y.data()); }),
             ContainsSubstring(dir.file("train_000001.bin")) && ContainsSubstring("token 5 ") &&
                 ContainsSubstring("id 2000"));
  // Without the vocabulary (kAnyTokenId) the same shards load: the check is the loader's, not the file's.
  ShardLoader any(dir.file("train_*.bin"), B, T, 0, 1, 0);
  for (int i = 0; i < 3; ++i) any.next_batch(x.data(), y.data());
  CHECK(x[5] == 2000);
}

TEST_CASE("shard malformed: an empty glob names the data keys", "[data][malformed]") {
  CHECK_THAT(error_of([] { ShardLoader("", 2, 4, 0, 1, 0, kVocab); }),
             ContainsSubstring("data.train") && ContainsSubstring("glob"));
  CHECK(glob_files("/nonexistent_fp8t_dir/*.bin").empty());
}
