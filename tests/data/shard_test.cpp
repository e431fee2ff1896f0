// Token shards: round trip, rejection of damaged files by name, and ShardLoader's rank striding.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <unistd.h>

#include "core/check.h"
#include "data/shard.h"
#include "tests/util/temp_dir.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

std::vector<uint16_t> iota_tokens(size_t n, uint16_t start = 0) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Overwrites the int32 at header index `slot`.
void patch_header(const std::string& path, int slot, int32_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(slot * 4);
  f.write(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

TEST_CASE("data: shard round trip keeps every token and writes llm.c's header", "[data]") {
  TempDir dir;
  const std::string path = dir.file("train_000000.bin");
  std::vector<uint16_t> tokens = iota_tokens(1000, 7);
  tokens[3] = 65535;  // the full uint16 range survives
  write_shard(path, tokens);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(fs::file_size(path) == 1024 + 2 * tokens.size());
  CHECK(read_shard(path) == tokens);

  std::ifstream in(path, std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof header);
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 1000);

  write_shard(path, {});  // an empty shard is legal and overwrites in place
  CHECK(read_shard(path).empty());
}

TEST_CASE("data: damaged shards are rejected with the file name", "[data]") {
  TempDir dir;
  const std::string path = dir.file("val_000000.bin");
  write_shard(path, iota_tokens(100));

  SECTION("missing") {
    REQUIRE_THROWS_WITH(read_shard(dir.file("nope.bin")),
                        ContainsSubstring("nope.bin") && ContainsSubstring("no such file"));
  }
  SECTION("truncated tokens") {
    fs::resize_file(path, 1024 + 2 * 99);
    REQUIRE_THROWS_WITH(read_shard(path), ContainsSubstring(path) &&
                                              ContainsSubstring("truncated") &&
                                              ContainsSubstring("prepare_data.sh"));
  }
  SECTION("truncated header") {
    fs::resize_file(path, 100);
    REQUIRE_THROWS_WITH(read_shard(path), ContainsSubstring(path) && ContainsSubstring("header"));
  }
  SECTION("bad magic") {
    patch_header(path, 0, 12345);
    REQUIRE_THROWS_AS(read_shard(path), Error);
    REQUIRE_THROWS_WITH(read_shard(path), ContainsSubstring(path) && ContainsSubstring("magic"));
  }
  SECTION("bad version") {
    patch_header(path, 1, 2);
    REQUIRE_THROWS_WITH(read_shard(path), ContainsSubstring(path) && ContainsSubstring("version"));
  }
  SECTION("count disagrees with size") {
    patch_header(path, 2, 101);
    REQUIRE_THROWS_WITH(read_shard(path), ContainsSubstring(path) && ContainsSubstring("101"));
  }
}

TEST_CASE("data: expand_glob sorts and names a pattern that matches nothing", "[data]") {
  TempDir dir;
  for (const char* name : {"train_000002.bin", "train_000000.bin", "train_000001.bin"}) {
    write_shard(dir.file(name), iota_tokens(4));
  }
  const auto files = expand_glob(dir.file("train_*.bin"));
  REQUIRE(files.size() == 3);
  CHECK(files[0] == dir.file("train_000000.bin"));
  CHECK(files[2] == dir.file("train_000002.bin"));
  REQUIRE_THROWS_WITH(expand_glob(dir.file("val_*.bin")), ContainsSubstring("val_*.bin"));
}

TEST_CASE("data: loader ranks read disjoint windows that together cover the stream", "[data]") {
  TempDir dir;
  constexpr int B = 2, T = 4, W = 2, BT = B * T;
  // Two shards with distinct token values: 3 groups of W*B*T (+1 target) fit in each, with 4
  // spare tokens in the second that must be skipped.
  write_shard(dir.file("s_000000.bin"), iota_tokens(3 * W * BT + 1, 0));
  write_shard(dir.file("s_000001.bin"), iota_tokens(3 * W * BT + 5, 1000));
  const std::string pattern = dir.file("s_*.bin");

  ShardLoader rank0(pattern, B, T, 0, W, 0), rank1(pattern, B, T, 1, W, 0);
  CHECK(rank0.batches_per_epoch() == 6);
  std::vector<int32_t> in0(BT), tg0(BT), in1(BT), tg1(BT);
  std::vector<int32_t> stream;  // rank 0's then rank 1's window, step by step
  for (int step = 0; step < 6; ++step) {
    rank0.next_batch(in0.data(), tg0.data());
    rank1.next_batch(in1.data(), tg1.data());
    for (int i = 0; i < BT; ++i) {
      REQUIRE(tg0[i] == in0[i] + 1);  // targets are the inputs shifted by one
      REQUIRE(tg1[i] == in1[i] + 1);
    }
    std::set<int32_t> a(in0.begin(), in0.end()), b(in1.begin(), in1.end());
    for (int32_t t : a) REQUIRE_FALSE(b.count(t));
    stream.insert(stream.end(), in0.begin(), in0.end());
    stream.insert(stream.end(), in1.begin(), in1.end());
  }
  std::vector<int32_t> expected;
  for (int i = 0; i < 3 * W * BT; ++i) expected.push_back(i);
  for (int i = 0; i < 3 * W * BT; ++i) expected.push_back(1000 + i);
  CHECK(stream == expected);

  // Wrap-around: after the last shard, the first batch of the first shard comes again.
  rank1.next_batch(in1.data(), tg1.data());
  CHECK(in1[0] == BT);
  CHECK(rank1.epoch() == 1);

  // reset() replays from the very start.
  rank0.next_batch(in0.data(), tg0.data());
  rank0.reset();
  rank0.next_batch(in0.data(), tg0.data());
  CHECK(in0[0] == 0);
  CHECK(rank0.epoch() == 0);
}

TEST_CASE("data: shuffled loader is deterministic - per-rank disjoint - and covers each epoch",
          "[data]") {
  TempDir dir;
  constexpr int B = 1, T = 3, W = 2, BT = B * T;
  write_shard(dir.file("s_000000.bin"), iota_tokens(5 * W * BT + 1, 0));
  write_shard(dir.file("s_000001.bin"), iota_tokens(4 * W * BT + 1, 500));
  const std::string pattern = dir.file("s_*.bin");
  ShardLoader r0(pattern, B, T, 0, W, 42), r1(pattern, B, T, 1, W, 42);
  ShardLoader again(pattern, B, T, 0, W, 42);
  std::vector<int32_t> a(BT), b(BT), c(BT), ta(BT), tb(BT), tc(BT);
  std::multiset<int32_t> seen;
  for (int step = 0; step < r0.batches_per_epoch(); ++step) {
    r0.next_batch(a.data(), ta.data());
    r1.next_batch(b.data(), tb.data());
    again.next_batch(c.data(), tc.data());
    REQUIRE(a == c);
    REQUIRE(b[0] == a[0] + BT);  // same group, neighbouring window
    seen.insert(a.begin(), a.end());
    seen.insert(b.begin(), b.end());
  }
  CHECK(seen.size() == 9 * W * BT);
  CHECK(std::set<int32_t>(seen.begin(), seen.end()).size() == seen.size());
}

TEST_CASE("data: loader rejects a shard too small for one step - naming it", "[data]") {
  TempDir dir;
  write_shard(dir.file("tiny_000000.bin"), iota_tokens(16));  // needs 2*2*4+1 = 17
  REQUIRE_THROWS_WITH(ShardLoader(dir.file("tiny_*.bin"), 2, 4, 0, 2, 0),
                      ContainsSubstring("tiny_000000.bin") && ContainsSubstring("16") &&
                          ContainsSubstring("17"));
  REQUIRE_NOTHROW(ShardLoader(dir.file("tiny_*.bin"), 2, 4, 0, 1, 0));
  REQUIRE_THROWS_WITH(ShardLoader(dir.file("none_*.bin"), 2, 4, 0, 1, 0),
                      ContainsSubstring("none_*.bin"));
}
