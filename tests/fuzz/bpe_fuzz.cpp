// libFuzzer harness: arbitrary bytes through the GPT-2 tokenizer. encode then decode must give back
// the text with invalid UTF-8 replaced (the tokenizer's documented contract), every id must be in
// the vocabulary, and decoding the input read as ids either works or refuses with fp8t::Error.
// The vocabulary comes from $FP8T_GPT2_VOCAB, else data/gpt2-vocab of the source tree.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe.h"
#include "fuzz_util.h"

namespace {

const fp8t::Gpt2Tokenizer& tokenizer() {
  static const fp8t::Gpt2Tokenizer tok = [] {
    const char* env = std::getenv("FP8T_GPT2_VOCAB");
    const std::string dir = env && *env ? env : FP8T_SOURCE_DIR "/data/gpt2-vocab";
    try {
      return fp8t::Gpt2Tokenizer::load(dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bpe_fuzz: cannot load the GPT-2 vocabulary from %s (set FP8T_GPT2_VOCAB): %s\n",
                   dir.c_str(), e.what());
      std::exit(2);
    }
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fp8t::Gpt2Tokenizer& tok = tokenizer();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fp8t::fuzz::expect_clean_refusal([&] {
    const std::vector<int> ids = tok.encode(bytes);
    for (int id : ids) FP8T_FUZZ_REQUIRE(id >= 0 && id < tok.vocab_size(), "encode gave id %d", id);
    const std::string text = fp8t::sanitize_utf8(bytes);
    FP8T_FUZZ_REQUIRE(tok.decode(ids) == text, "decode(encode(x)) differs from x with invalid UTF-8 replaced");
    FP8T_FUZZ_REQUIRE(tok.decode_bytes(ids) == text, "decode_bytes(encode(x)) differs from x");
    FP8T_FUZZ_REQUIRE(fp8t::sanitize_utf8(text) == text, "sanitize_utf8 is not idempotent");
  });
  // The same bytes as little-endian uint16 ids shifted by -1024: negative and past-the-vocabulary
  // ids must be refused.
  std::vector<int> ids(size / 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, data + 2 * i, 2);
    ids[i] = static_cast<int>(v) - 1024;
  }
  fp8t::fuzz::expect_clean_refusal([&] {
    const std::string raw = tok.decode_bytes(ids);
    FP8T_FUZZ_REQUIRE(tok.decode(ids) == fp8t::sanitize_utf8(raw), "decode is not decode_bytes then sanitize");
  });
  return 0;
}
