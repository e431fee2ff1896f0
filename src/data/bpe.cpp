// GPT-2 byte-level BPE, a line-by-line port of gpt-3-encoder 1.1.4's Encoder.js (see bpe.h).
// Compiled only when PCRE2 is found; the JS quirks it reproduces are marked "JS:".
#include "data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/check.h"

namespace fp8t {

namespace {

// JS's \s is WhiteSpace + LineTerminator: TAB VT FF SP NBSP ZWNBSP, any Zs, LF CR LS PS.
// PCRE2's \s (with UCP) lacks U+FEFF, so the class is spelled out to match JS exactly.
#define FP8T_JS_SPACE R"(\t\n\x{0B}\f\r\p{Zs}\x{2028}\x{2029}\x{FEFF})"
// Encoder.js: /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" FP8T_JS_SPACE R"(\p{L}\p{N}]+)"
    R"(|[)" FP8T_JS_SPACE R"(]+(?![^)" FP8T_JS_SPACE R"(])|[)" FP8T_JS_SPACE R"(]+)";
#undef FP8T_JS_SPACE

// JS: a pair absent from the merges ranks 10e10, so it never wins while a real merge exists.
constexpr int64_t kUnknownRank = 100'000'000'000;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  FP8T_CHECK(in.good(),
             "tokenizer: cannot read {} ({}); run scripts/prepare_data.sh to fetch the GPT-2 "
             "vocabulary or pass the right --vocab directory",
             path, what);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Pcre2CodeFree {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct Pcre2MatchDataFree {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

std::array<std::string, 256> gpt2_bytes_to_unicode() {
  std::array<std::string, 256> table;
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    append_utf8(table[b], printable[b] ? b : 256 + n++);
  }
  return table;
}

std::string sanitize_utf8(std::string_view s) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(s.size());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    int need = 0;
    uint8_t lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lower = 0xA0;  // overlong
      if (b == 0xED) upper = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lower = 0x90;  // overlong
      if (b == 0xF4) upper = 0x8F;  // above U+10FFFF
    } else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = i + 1;
    int seen = 0;
    while (seen < need && j < n) {
      const auto c = static_cast<uint8_t>(s[j]);
      if (c < lower || c > upper) break;
      lower = 0x80;
      upper = 0xBF;
      ++j;
      ++seen;
    }
    if (seen == need) {
      out.append(s.substr(i, j - i));
    } else {
      out += kReplacement;  // one U+FFFD per maximal invalid subpart; s[j] is re-examined
    }
    i = j;
  }
  return out;
}

struct Gpt2Tokenizer::Impl {
  std::array<std::string, 256> byte_encoder;
  std::unordered_map<std::string, int> encoder;  // byte-encoded token -> id
  std::vector<std::string> decoder;              // id -> raw bytes
  // JS: bpe_ranks is an object keyed by the pair array's toString(), i.e. "first,second";
  // pairs whose parts contain commas can therefore collide, and we collide the same way.
  std::unordered_map<std::string, int64_t> ranks;
  std::unique_ptr<pcre2_code, Pcre2CodeFree> regex;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int>> cache;  // pre-token bytes -> ids

  int64_t rank_of(const std::string& first, const std::string& second, std::string& key) const {
    key.assign(first).append(1, ',').append(second);
    const auto it = ranks.find(key);
    return it == ranks.end() ? kUnknownRank : it->second;
  }

  // Encoder.js bpe(): repeatedly merge the lowest-ranked adjacent pair everywhere it occurs.
  std::vector<int> bpe(std::string_view piece) const {
    std::vector<std::string> word;
    word.reserve(piece.size());
    for (char c : piece) word.push_back(byte_encoder[static_cast<uint8_t>(c)]);
    std::string key;
    while (word.size() > 1) {
      int64_t best_rank = std::numeric_limits<int64_t>::max();
      size_t best = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        const int64_t r = rank_of(word[i], word[i + 1], key);
        if (r <= best_rank) {  // JS: minPairs[rank] = pair, so the last pair of a rank wins
          best_rank = r;
          best = i;
        }
      }
      if (best_rank == kUnknownRank) break;
      const std::string first = word[best], second = word[best + 1];
      std::vector<std::string> merged;
      merged.reserve(word.size());
      size_t i = 0;
      while (i < word.size()) {
        const auto j = std::find(word.begin() + i, word.end(), first) - word.begin();
        if (static_cast<size_t>(j) == word.size()) {
          merged.insert(merged.end(), word.begin() + i, word.end());
          break;
        }
        merged.insert(merged.end(), word.begin() + i, word.begin() + j);
        i = j;
        if (i + 1 < word.size() && word[i + 1] == second) {
          merged.push_back(first + second);
          i += 2;
        } else {
          merged.push_back(word[i]);
          i += 1;
        }
      }
      word = std::move(merged);
    }
    std::vector<int> ids;
    ids.reserve(word.size());
    for (const std::string& token : word) {
      const auto it = encoder.find(token);
      // Only reachable through a comma collision that builds a token outside the vocabulary,
      // where the JS would emit `undefined`; there is no id to give.
      FP8T_CHECK(it != encoder.end(),
                 "tokenizer: BPE produced '{}' which is not in encoder.json (the reference JS "
                 "would emit undefined here)",
                 token);
      ids.push_back(it->second);
    }
    return ids;
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->byte_encoder = gpt2_bytes_to_unicode();
  std::unordered_map<std::string, uint8_t> byte_decoder;
  for (int b = 0; b < 256; ++b) byte_decoder[impl->byte_encoder[b]] = static_cast<uint8_t>(b);

  const std::string encoder_path = dir + "/encoder.json";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(encoder_path, "token -> id map"));
  } catch (const nlohmann::json::exception& e) {
    FP8T_FAIL("tokenizer: {} is not valid JSON ({}); re-run scripts/prepare_data.sh",
              encoder_path, e.what());
  }
  FP8T_CHECK(json.is_object() && !json.empty(),
             "tokenizer: {} must be a JSON object of token -> id", encoder_path);
  for (const auto& [token, id_json] : json.items()) {
    FP8T_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 &&
                   id_json.get<int64_t>() < 1'000'000,
               "tokenizer: {}: token '{}' has a bad id {}", encoder_path, token, id_json.dump());
    const int id = id_json.get<int>();
    impl->encoder[token] = id;
    if (static_cast<size_t>(id) >= impl->decoder.size()) impl->decoder.resize(id + 1);
    // The token is a string of byte-encoder characters; turn it back into the raw bytes.
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const auto lead = static_cast<uint8_t>(token[i]);
      const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      const auto it = byte_decoder.find(token.substr(i, len));
      FP8T_CHECK(it != byte_decoder.end(),
                 "tokenizer: {}: token '{}' has a character outside GPT-2's byte alphabet; this "
                 "is not a GPT-2 encoder.json",
                 encoder_path, token);
      bytes += static_cast<char>(it->second);
      i += len;
    }
    impl->decoder[id] = std::move(bytes);
  }

  // JS: lines.slice(1, length - 1) drops the "#version" line and the last line (empty when the
  // file ends in a newline); each line splits on whitespace runs.
  const std::string bpe_path = dir + "/vocab.bpe";
  const std::string bpe_text = read_file(bpe_path, "BPE merges");
  std::vector<std::string_view> lines;
  for (size_t start = 0;;) {
    const size_t nl = bpe_text.find('\n', start);
    lines.emplace_back(std::string_view(bpe_text).substr(start, nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  FP8T_CHECK(lines.size() > 2, "tokenizer: {} holds no merges; re-run scripts/prepare_data.sh",
             bpe_path);
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    std::string key;
    std::istringstream parts{std::string(lines[i])};
    for (std::string part; parts >> part;) key += (key.empty() ? "" : ",") + part;
    impl->ranks[key] = static_cast<int64_t>(i - 1);  // JS: a later duplicate key overwrites
  }

  int err = 0;
  PCRE2_SIZE err_offset = 0;
  impl->regex.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr));
  if (!impl->regex) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    FP8T_FAIL("tokenizer: PCRE2 rejected the pre-tokenizer pattern at offset {}: {}", err_offset,
              reinterpret_cast<const char*>(msg.data()));
  }
  pcre2_jit_compile(impl->regex.get(), PCRE2_JIT_COMPLETE);  // optional: falls back when absent
  return Gpt2Tokenizer(std::move(impl));
}

int Gpt2Tokenizer::vocab_size() const { return static_cast<int>(impl_->decoder.size()); }

std::vector<int> Gpt2Tokenizer::encode(std::string_view raw) const {
  const std::string text = sanitize_utf8(raw);  // the regex below may assume valid UTF-8
  std::unique_ptr<pcre2_match_data, Pcre2MatchDataFree> match(
      pcre2_match_data_create_from_pattern(impl_->regex.get(), nullptr));
  FP8T_CHECK(match != nullptr, "tokenizer: out of memory creating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::vector<int> ids;
  ids.reserve(text.size() / 3);
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(impl_->regex.get(), subject, text.size(), offset,
                               PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: every character matches some branch
    FP8T_CHECK(rc > 0, "tokenizer: PCRE2 match failed with code {} at byte {}", rc, offset);
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0], end = ovector[1];
    FP8T_CHECK(end > begin, "tokenizer: empty pre-token at byte {}", begin);
    const std::string piece = text.substr(begin, end - begin);
    {
      std::lock_guard lock(impl_->cache_mutex);
      auto it = impl_->cache.find(piece);
      if (it == impl_->cache.end()) it = impl_->cache.emplace(piece, impl_->bpe(piece)).first;
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
    offset = end;
  }
  return ids;
}

std::string Gpt2Tokenizer::decode_bytes(std::span<const int> ids) const {
  std::string bytes;
  for (int id : ids) {
    FP8T_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->decoder.size(),
               "tokenizer: cannot decode id {}: the vocabulary has ids 0..{}", id,
               impl_->decoder.size() - 1);
    bytes += impl_->decoder[id];
  }
  return bytes;
}

// TextDecoder would also drop a leading U+FEFF; we keep it, so decode(encode(x)) == x always.
std::string Gpt2Tokenizer::decode(std::span<const int> ids) const {
  return sanitize_utf8(decode_bytes(ids));
}

}  // namespace fp8t
