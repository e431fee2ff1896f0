// Byte-level GPT-2 BPE tokenizer that reproduces the ids of the npm package gpt-3-encoder 1.1.4.
// The implementation (bpe.cpp) needs PCRE2; without it (FP8T_HAVE_PCRE2 undefined) this header
// still compiles but nothing is defined, so callers guard their use with #ifdef FP8T_HAVE_PCRE2.
#pragma once
#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp8t {

// GPT-2's reversible byte -> code point table: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order, so every byte string becomes printable text that the
// BPE can treat as characters. Entry b is the UTF-8 encoding of the code point for byte b.
std::array<std::string, 256> gpt2_bytes_to_unicode();

class Gpt2Tokenizer {
 public:
  static constexpr int kEot = 50256;  // <|endoftext|>, the document separator

  // Reads dir/encoder.json (token -> id) and dir/vocab.bpe (merges in rank order).
  static Gpt2Tokenizer load(const std::string& dir);

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

  // Ids exactly as gpt-3-encoder's encode() gives for the same text. Like that package (which
  // sees a JS string), invalid UTF-8 is first replaced by U+FFFD, and "<|endoftext|>" in the
  // text is ordinary text, never the EOT id. Thread-safe (the word cache is locked).
  std::vector<int> encode(std::string_view text) const;
  // The UTF-8 text of ids; incomplete or invalid UTF-8 (e.g. a multi-byte character cut
  // between tokens) becomes U+FFFD, as TextDecoder does in the JS package.
  std::string decode(std::span<const int> ids) const;
  // The raw bytes of ids, with no UTF-8 repair: for streaming output token by token.
  std::string decode_bytes(std::span<const int> ids) const;

  int eot() const { return kEot; }
  int vocab_size() const;  // 50257 for GPT-2's files

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Replaces each maximal invalid UTF-8 subsequence by U+FFFD, following the WHATWG decoder (as
// Node's Buffer.toString and TextDecoder do), so byte input maps to the same text JS would see.
std::string sanitize_utf8(std::string_view bytes);

}  // namespace fp8t
