// Import of damaged or foreign inputs: every refusal names the file and the header field, key or tensor
// and says what is wrong; nothing is written for a refused import.
#include <catch2/catch_test_macros.hpp>

#include "import_test_util.h"
#include "train/export.h"
#include "train/import.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("accepted");
  return "";
}

// A copy of the trained run's llm.c export with header int `field` set to `value`.
fs::path llmc_with(const std::string& name, int field, int32_t value) {
  static const fs::path good = [] {
    const fs::path p = scratch_root() / "llmc_good.bin";
    export_llmc_gpt2(trained_run(), p, DType::f32);
    return p;
  }();
  std::string b = slurp(good);
  if (field >= 0) std::memcpy(b.data() + 4 * field, &value, 4);
  const fs::path p = scratch_root() / (name + ".bin");
  spit(p, b);
  return p;
}

std::string llmc_error(const fs::path& file) {
  const fs::path out = scratch_root() / "llmc_out" / file.stem();
  const std::string e = error_of([&] { import_llmc_gpt2(file, out); });
  CHECK_FALSE(fs::exists(out / "checkpoints"));
  return e;
}

// The trained run's HF export, edited by `edit` (on the tensors) and `edit_config` (on config.json).
template <class E, class C>
std::string hf_error(const std::string& name, E&& edit, C&& edit_config) {
  const fs::path dir = scratch_root() / "hf_bad" / name;
  fs::remove_all(dir);
  export_hf_gpt2(trained_run(), dir);
  StMap m = read_safetensors(dir / "model.safetensors");
  edit(m);
  write_safetensors(dir / "model.safetensors", m);
  nlohmann::json config = read_json(dir / "config.json");
  edit_config(config);
  write_json(dir / "config.json", config);
  return error_of([&] { import_hf_gpt2(dir, dir / "run"); });
}
template <class E>
std::string hf_error(const std::string& name, E&& edit) {
  return hf_error(name, edit, [](nlohmann::json&) {});
}

}  // namespace

TEST_CASE("import: malformed llm.c files are refused naming the file and the header field", "[import]") {
  const fs::path magic = llmc_with("bad_magic", 0, 20240520);
  check_words(llmc_error(magic), {magic.string(), "header field [0] (magic) is 20240520", "not llm.c's model magic "
                                  "20240326", "token shard"});
  const fs::path version = llmc_with("bad_version", 1, 4);
  check_words(llmc_error(version),
              {version.string(), "header field [1] (version) is 4", "version 3 (float32", "and 5 (bfloat16"});
  const fs::path layers = llmc_with("zero_layers", 4, 0);
  check_words(llmc_error(layers), {layers.string(), "header field [4] (num_layers) is 0", "not a positive count"});
  const fs::path padded = llmc_with("small_padded", 7, 63);
  check_words(llmc_error(padded), {padded.string(), "header field [7] (padded_vocab_size) is 63", "vocab_size) 64"});
  const fs::path heads = llmc_with("odd_heads", 5, 3);
  check_words(llmc_error(heads), {heads.string(), "field [6] (channels) is 32", "field [5] (num_heads) 3"});

  const fs::path cut = llmc_with("truncated", -1, 0);
  std::string b = slurp(cut);
  spit(cut, b.substr(0, b.size() - 6));
  check_words(llmc_error(cut), {cut.string(), "bytes, but its header", "num_layers 2", "the file is truncated"});
  const fs::path longer = llmc_with("longer", -1, 0);
  spit(longer, b + "xxxx");
  check_words(llmc_error(longer), {longer.string(), "longer than that model"});
  const fs::path stub = llmc_with("stub", -1, 0);
  spit(stub, b.substr(0, 100));
  check_words(llmc_error(stub), {stub.string(), "holds 100 bytes", "1024-byte header"});
}

TEST_CASE("import: malformed HF directories are refused naming the file and the tensor or key", "[import]") {
  check_words(hf_error("missing", [](StMap& m) { m.erase("h.1.mlp.c_fc.bias"); }),
              {"model.safetensors", "tensor 'h.1.mlp.c_fc.bias' is missing", "transformer.h.1.mlp.c_fc.bias"});
  // Our own (out, in) layout where HF's Conv1D (in, out) is expected: the same bytes, the shape refused.
  check_words(hf_error("shape", [](StMap& m) { m["h.0.attn.c_attn.weight"].shape = {96, 32}; }),
              {"model.safetensors", "tensor 'h.0.attn.c_attn.weight' has shape [96, 32]", "needs [32, 96]",
               "Conv1D layout (in, out)", "n_embd 32"});
  check_words(hf_error("wte_rows", [](StMap& m) { m["wte.weight"].shape = {32, 64}; }),
              {"tensor 'wte.weight' has shape [32, 64]", "needs [64, 32]"});
  check_words(hf_error("f16", [](StMap& m) { m["ln_f.bias"].dtype = "F16"; }),
              {"tensor 'ln_f.bias' has dtype F16", "F32 or BF16"});
  check_words(hf_error("untied",
                       [](StMap& m) {
                         m["lm_head.weight"] = m["wte.weight"];
                         m["lm_head.weight"].bytes[5] ^= 1;
                       }),
              {"lm_head.weight differs from wte.weight", "untied output layer", "cannot be imported"});
  check_words(hf_error("extra", [](StMap& m) { m["h.0.attn.q_norm.weight"] = m["ln_f.bias"]; }),
              {"1 tensor(s) that are not GPT-2's", "h.0.attn.q_norm.weight"});
  check_words(hf_error("twice", [](StMap& m) { m["transformer.ln_f.bias"] = m["ln_f.bias"]; }),
              {"holds both 'ln_f.bias' and 'transformer.ln_f.bias'"});
  check_words(hf_error("no_n_embd", [](StMap&) {}, [](nlohmann::json& c) { c.erase("n_embd"); }),
              {"config.json: key 'n_embd' is missing", "n_positions (or n_ctx)"});
  check_words(hf_error("bad_layers", [](StMap&) {}, [](nlohmann::json& c) { c["n_layer"] = "two"; }),
              {"config.json", "key 'n_layer' is \"two\""});
  check_words(hf_error("bert", [](StMap&) {}, [](nlohmann::json& c) { c["model_type"] = "bert"; }),
              {"config.json: model_type is \"bert\"", "GPT-2 models only"});
  check_words(hf_error("nan", [](StMap& m) { std::memcpy(m["h.1.ln_2.weight"].bytes.data(), "\0\0\xc0\x7f", 4); }),
              {"model.safetensors", "non-finite", "h.1.ln_2.weight"});

  // A truncated file: the last tensor's data_offsets run past the payload.
  const fs::path dir = scratch_root() / "hf_bad" / "truncated";
  fs::remove_all(dir);
  export_hf_gpt2(trained_run(), dir);
  const std::string file = slurp(dir / "model.safetensors");
  spit(dir / "model.safetensors", file.substr(0, file.size() - 8));
  check_words(error_of([&] { import_hf_gpt2(dir, dir / "run"); }),
              {"model.safetensors", "data_offsets", "outside the", "truncated"});
  spit(dir / "model.safetensors", file.substr(0, 6));
  check_words(error_of([&] { import_hf_gpt2(dir, dir / "run"); }), {"holds 6 bytes", "too short"});
  CHECK_FALSE(fs::exists(dir / "run"));

  // An --out that already holds a run is not overwritten.
  spit(dir / "model.safetensors", file);
  import_hf_gpt2(dir, dir / "run");
  check_words(error_of([&] { import_hf_gpt2(dir, dir / "run"); }), {"--out", "already holds checkpoints"});
  check_words(error_of([&] { import_hf_gpt2(dir / "nowhere", dir / "run2"); }), {"has no config.json", "--hf"});
}

TEST_CASE("import: the CLI imports and exports both formats and refuses --dtype for HF", "[import][cli]") {
  const fs::path root = scratch_root() / "cli";
  fs::remove_all(root);
  const std::string bin = FP8T_BINARY, run = trained_run().string();
  auto sh = [](const std::string& cmd) { return std::system((cmd + " > /dev/null 2>&1").c_str()); };
  CHECK(sh(bin + " export --checkpoint " + run + " --format llmc --dtype bf16 --out " + (root / "m.bin").string()) ==
        0);
  CHECK(sh(bin + " import --llmc " + (root / "m.bin").string() + " --out " + (root / "a").string()) == 0);
  CHECK(model_bin(root / "a" / "checkpoints" / "step_00000000") == bf16_rounded(model_bin(latest_of(trained_run()))));
  CHECK(sh(bin + " export --checkpoint " + run + " --out " + (root / "hf").string()) == 0);
  CHECK(sh(bin + " import --hf " + (root / "hf").string() + " --out " + (root / "b").string()) == 0);
  CHECK(fs::exists(root / "b" / "checkpoints" / "step_00000000" / "manifest.json"));
  CHECK(sh(bin + " export --checkpoint " + run + " --dtype bf16 --out " + (root / "hf2").string()) != 0);
  CHECK(sh(bin + " import --out " + (root / "c").string()) != 0);
  CHECK(sh(bin + " import --hf x --llmc y --out " + (root / "c").string()) != 0);
}
