// GPT-2 BPE: table invariants, UTF-8 repair, and id-for-id agreement with the reference JS
// encoder (npm gpt-3-encoder 1.1.4) on text written for this test, not taken from Brown.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "data/bpe.h"

#ifdef FP8T_HAVE_PCRE2
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include <unistd.h>

#include "core/check.h"
#include "data/prepare.h"
#include "data/shard.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = FP8T_SOURCE_DIR;
const fs::path kVocab = kSource / "data" / "gpt2-vocab";
const fs::path kJsEncoder = kSource / "data" / "npm" / "gpt-3-encoder" / "Encoder.js";

// Text with contractions, numbers, punctuation runs, odd whitespace and non-ASCII scripts.
const std::vector<std::string> kSamples = {
    "I'm sure they'll say it's fine, but we'd've known if you'd told us. DON'T SHOUT; "
    "it's the cat's toy, not the dogs' toys. She said 'hello' and left.",
    "In 2023, the bridge carried 1,234,567 cars; tolls rose 3.5% to $4.75 (up from $4.59).\n"
    "Call 555-0123 or write to help@example.org before 9:30am on 12/31.  Version 10.0.19045 "
    "shipped; pi is 3.14159265358979 and 0xFF == 255.",
    "Wait... what?!  No -- really???\tTabs\tand  double  spaces   everywhere.\n\n\n"
    "Trailing spaces   \nand a line with only spaces:\n     \nthen CRLF\r\nlines\r\n",
    "The caf\u00e9 served cr\u00e8me br\u00fbl\u00e9e \u2014 a na\u00efve choice \U0001F600! "
    "Stra\u00dfe, \u00c5ngstr\u00f6m, \u0141\u00f3d\u017a, \u041c\u043e\u0441\u043a\u0432\u0430, "
    "\u0391\u03b8\u03ae\u03bd\u03b1, \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, "
    "\u0645\u0631\u062d\u0628\u0627, \u0928\u092e\u0938\u094d\u0924\u0947, e\u0301 (combining), "
    "\U0001F468\u200D\U0001F469\u200D\U0001F467 family, flags \U0001F1FA\U0001F1F8, "
    "\u00bd \u2154 \u2163 \u00b2 superscripts.",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product\n"
    "    if x != y: return {\"key\": [1, 2, 3]}\n<|endoftext|> is plain text here.",
    "Odd spaces:\u00a0no-break,\u3000ideographic,\u2009thin,\u2028line sep,\u2029para sep,"
    "\ufeffzero-width no-break, \u000bvt, \u000cff, \u0085nel.   \u00a0 \n  ",
    "",
    " ",
    "'s 'S 'll've'd 'm'''",
};

// The reference ids: gpt-3-encoder's encode() on the same bytes, read as UTF-8 by Node.
std::vector<int> js_encode(const std::string& text) {
  const fs::path file =
      fs::temp_directory_path() / ("fp8t_bpe_test_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(file, std::ios::binary);
    out << text;
  }
  const std::string cmd = "node -e 'const e = require(process.argv[1]); "
                          "const t = require(\"fs\").readFileSync(process.argv[2], \"utf8\"); "
                          "process.stdout.write(JSON.stringify(e.encode(t)));' \"" +
                          kJsEncoder.string() + "\" \"" + file.string() + "\"";
  std::FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  const int status = ::pclose(pipe);
  fs::remove(file);
  REQUIRE(status == 0);
  return nlohmann::json::parse(output).get<std::vector<int>>();
}

bool have_node() { return std::system("node --version > /dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("data: bytes_to_unicode is GPT-2's reversible byte alphabet", "[data]") {
  const auto table = gpt2_bytes_to_unicode();
  CHECK(std::set<std::string>(table.begin(), table.end()).size() == 256);
  CHECK(table['A'] == "A");
  CHECK(table['!'] == "!");
  CHECK(table[0xE9] == "\u00e9");   // printable Latin-1 maps to itself
  CHECK(table[' '] == "\u0120");    // the familiar "G-dot" of GPT-2 vocabularies
  CHECK(table['\n'] == "\u010a");
  CHECK(table[0] == "\u0100");
  CHECK(table[0xAD] == "\u0143");   // soft hyphen: the last of the 68 remapped bytes
  for (const std::string& s : table) CHECK(s.find(' ') == std::string::npos);
}

TEST_CASE("data: sanitize_utf8 replaces invalid sequences like the WHATWG decoder", "[data]") {
  CHECK(sanitize_utf8("plain ascii") == "plain ascii");
  CHECK(sanitize_utf8("caf\u00e9 \U0001F600") == "caf\u00e9 \U0001F600");
  CHECK(sanitize_utf8("\xff") == "\uFFFD");
  CHECK(sanitize_utf8("a\xc3") == "a\uFFFD");                // truncated 2-byte sequence
  CHECK(sanitize_utf8("\xe2\x82z") == "\uFFFDz");            // one U+FFFD per maximal subpart
  CHECK(sanitize_utf8("\xed\xa0\x80") == "\uFFFD\uFFFD\uFFFD");  // a surrogate
  CHECK(sanitize_utf8("\xc0\xaf") == "\uFFFD\uFFFD");        // overlong
  CHECK(sanitize_utf8("\xf4\x90\x80\x80") == "\uFFFD\uFFFD\uFFFD\uFFFD");  // > U+10FFFF
}

TEST_CASE("data: GPT-2 tokenizer matches gpt-3-encoder 1.1.4 id for id", "[data]") {
  if (!fs::exists(kVocab / "encoder.json") || !fs::exists(kVocab / "vocab.bpe")) {
    SKIP("run scripts/prepare_data.sh first (needs data/gpt2-vocab)");
  }
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(kVocab.string());
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eot() == 50256);
  CHECK(tok.encode("Hello world") == std::vector<int>{15496, 995});
  const int eot = tok.eot();
  CHECK(tok.decode(std::span<const int>(&eot, 1)) == "<|endoftext|>");
  CHECK_THROWS_AS(tok.decode(std::vector<int>{50257}), Error);

  for (const std::string& text : kSamples) {
    INFO("text: " << text);
    const std::vector<int> ids = tok.encode(text);
    CHECK(tok.decode(ids) == text);
  }

  if (!have_node() || !fs::exists(kJsEncoder)) {
    SKIP("node or " + kJsEncoder.string() + " missing: run scripts/prepare_data.sh first");
  }
  std::string all;
  for (const std::string& text : kSamples) {
    INFO("text: " << text);
    REQUIRE(tok.encode(text) == js_encode(text));
    all += text;
  }
  REQUIRE(tok.encode(all) == js_encode(all));
  // Invalid UTF-8 reaches JS as U+FFFD; our encode must see the same text.
  const std::string broken = "ok \xff\xfe then \xe2\x82 and a lone \xc3 end \xed\xa0\x80!";
  REQUIRE(tok.encode(broken) == js_encode(broken));
  CHECK(tok.decode(tok.encode(broken)) == sanitize_utf8(broken));
}

TEST_CASE("data: prepare_shards splits every document and shards by size", "[data]") {
  if (!fs::exists(kVocab / "encoder.json") || !fs::exists(kVocab / "vocab.bpe")) {
    SKIP("run scripts/prepare_data.sh first (needs data/gpt2-vocab)");
  }
  const fs::path dir =
      fs::temp_directory_path() / ("fp8t_prepare_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> inputs;
  for (int d = 0; d < 2; ++d) {
    inputs.push_back((dir / ("doc" + std::to_string(d) + ".txt")).string());
    std::ofstream(inputs.back()) << kSamples[d];
  }
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(kVocab.string());
  const size_t n0 = 1 + tok.encode(kSamples[0]).size(), n1 = 1 + tok.encode(kSamples[1]).size();

  PrepareOptions opts;
  opts.vocab_dir = kVocab.string();
  opts.out_dir = (dir / "out").string();
  opts.inputs = inputs;
  opts.val_fraction = 0.25;
  opts.shard_tokens = 16;
  fs::create_directories(opts.out_dir);
  write_shard(opts.out_dir + "/train_000099.bin", {});  // stale output of an earlier run
  const PrepareStats stats = prepare_shards(opts);
  CHECK(stats.documents == 2);
  const size_t v0 = std::llround(0.25 * n0), v1 = std::llround(0.25 * n1);
  CHECK(stats.val_tokens == static_cast<int64_t>(v0 + v1));
  // The train part of each document starts with an EOT of its own.
  CHECK(stats.train_tokens == static_cast<int64_t>(n0 + n1 - v0 - v1 + 2));
  CHECK(stats.train_files.size() == (n0 + n1 - v0 - v1 + 2 + 15) / 16);
  CHECK_FALSE(fs::exists(opts.out_dir + "/train_000099.bin"));

  std::vector<uint16_t> val;
  for (const auto& f : expand_glob(opts.out_dir + "/val_*.bin")) {
    const auto part = read_shard(f);
    CHECK(part.size() <= 16);
    val.insert(val.end(), part.begin(), part.end());
  }
  REQUIRE(val.size() == v0 + v1);
  CHECK(val[0] == tok.eot());   // each document starts with EOT...
  CHECK(val[v0] == tok.eot());  // ...and both contribute their first quarter to val
  std::vector<uint16_t> train;
  for (const auto& f : expand_glob(opts.out_dir + "/train_*.bin")) {
    const auto part = read_shard(f);
    train.insert(train.end(), part.begin(), part.end());
  }
  REQUIRE(train.size() == n0 + n1 - v0 - v1 + 2);
  CHECK(train[0] == tok.eot());
  CHECK(train[n0 - v0 + 1] == tok.eot());  // the second document's train part
  CHECK(train[1] == tok.encode(kSamples[0])[v0 - 1]);
  fs::remove_all(dir);
}

#else
TEST_CASE("data: GPT-2 tokenizer needs PCRE2", "[data]") {
  SKIP("built without PCRE2: install libpcre2-dev and rebuild to test the tokenizer");
}
#endif
