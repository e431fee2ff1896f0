// manifest.json: what a checkpoint records, and resume / export / sample refusing each kind of damage
// with a message that names the file and what differs; a checkpoint without a manifest loads with a warning.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sys/wait.h>

#include "checkpoint_test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/export.h"

using namespace fp8t;
using namespace fp8t::test;
using Catch::Matchers::ContainsSubstring;

namespace {

std::string export_error(const fs::path& ckpt) {
  try {
    export_hf_gpt2(ckpt, ckpt.parent_path() / (ckpt.filename().string() + "_hf"));
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("exporting " << ckpt << " was accepted");
  return "";
}

// `fp8train <args>`: exit code and stdout + stderr.
std::pair<int, std::string> run_cli(const std::string& args) {
  FILE* p = ::popen((std::string(FP8T_BINARY) + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  return {WEXITSTATUS(::pclose(p)), out};
}

// Writes `value` as model.bin's float at `index` (the manifest then disagrees: reseal to get past it).
void poke_float(const fs::path& file, int64_t index, float value) {
  std::string b = slurp(file);
  std::memcpy(b.data() + index * 4, &value, 4);
  spit(file, b);
}

}  // namespace

TEST_CASE("checkpoint: the manifest records the model and every file's size and CRC32C", "[checkpoint]") {
  const fs::path ck = trained_run() / "checkpoints" / "step_00000002";
  const nlohmann::json m = read_json(ck / "manifest.json");
  CHECK(m.at("format_version") == kCheckpointFormatVersion);
  CHECK(m.at("model").at("n_layer") == 2);
  CHECK(m.at("model").at("n_head") == 2);
  CHECK(m.at("model").at("d_model") == 32);
  CHECK(m.at("model").at("vocab_size") == 64);
  CHECK(m.at("model").at("seq_len") == 16);
  CHECK(m.at("model").at("elements") == 30080);    // wte padded to 128 rows
  CHECK(m.at("model").at("parameters") == 28032);  // without the 64 padding rows of 32
  CHECK(m.at("model").at("config_crc32c").get<std::string>().size() == 8);
  size_t listed = 0;
  for (const auto& entry : fs::directory_iterator(ck)) {
    const std::string name = entry.path().filename().string();
    CHECK_FALSE(name.starts_with("."));  // the per-file digests are gone
    if (name == "manifest.json") continue;
    INFO(name);
    REQUIRE(m.at("files").contains(name));
    const std::string bytes = slurp(entry.path());
    CHECK(m["files"][name]["bytes"] == bytes.size());
    CHECK(m["files"][name]["crc32c"] == fmt::format("{:08x}", crc32c(bytes.data(), bytes.size())));
    ++listed;
  }
  CHECK(listed == m.at("files").size());
  for (const char* f : {"model.bin", "state.json", "optim_rank0.bin", "optim_v_rank0.bin", "optim_state.json"})
    CHECK(m.at("files").contains(f));
  CHECK(verify_checkpoint(ck, CheckpointUse::resume).empty());
}

TEST_CASE("checkpoint: a clean copy resumes - a flipped bit in model.bin is refused everywhere", "[checkpoint]") {
  auto comm = make_single_communicator();
  const fs::path good = copy_checkpoint("clean");
  Config cfg = tiny_run("resume_clean");
  fs::remove_all(cfg.run.out_dir);
  CHECK(train(cfg, *comm, good).steps == 4);
  CHECK(slurp(fs::path(cfg.run.out_dir) / "checkpoints" / "step_00000004" / "model.bin") ==
        slurp(trained_run() / "checkpoints" / "step_00000004" / "model.bin"));

  const fs::path ck = copy_checkpoint("bitflip");
  flip_bit(ck / "model.bin", 12345, 3);
  const std::initializer_list<std::string> refused = {"model.bin", "checksum mismatch", "use an earlier checkpoint"};
  check_words(resume_error(ck, "resume_bitflip"), refused);
  check_words(export_error(ck), refused);
#ifdef FP8T_HAVE_PCRE2  // without the tokenizer, sample refuses before it opens the checkpoint
  const auto [code, out] = run_cli("sample --checkpoint " + ck.string());
  CHECK(code != 0);
  check_words(out, refused);
#endif
  const auto [ecode, eout] = run_cli("export --checkpoint " + ck.string() + " --out " + (ck.string() + "_cli"));
  CHECK(ecode != 0);
  check_words(eout, refused);
}

TEST_CASE("checkpoint: a truncated - emptied or over-long optimizer file is refused on resume", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("optim");
  const std::string m = slurp(ck / "optim_rank0.bin"), v = slurp(ck / "optim_v_rank0.bin");
  SECTION("truncated") {
    spit(ck / "optim_rank0.bin", m.substr(0, m.size() / 2));
    CHECK_THAT(resume_error(ck, "resume_trunc"),
               ContainsSubstring("optim_rank0.bin") && ContainsSubstring(fmt::format("holds {} bytes", m.size() / 2)) &&
                   ContainsSubstring(fmt::format("records {}", m.size())) && ContainsSubstring("truncated"));
  }
  SECTION("emptied") {
    spit(ck / "optim_v_rank0.bin", "");
    CHECK_THAT(resume_error(ck, "resume_empty"),
               ContainsSubstring("optim_v_rank0.bin") && ContainsSubstring("holds 0 bytes"));
  }
  SECTION("over-long") {
    spit(ck / "optim_rank0.bin", m + std::string(64, '\0'));
    CHECK_THAT(resume_error(ck, "resume_long"),
               ContainsSubstring("optim_rank0.bin") && ContainsSubstring("extended or replaced"));
  }
  SECTION("over-long and resealed: the sizes disagree with model.bin") {
    spit(ck / "optim_rank0.bin", m + std::string(64, '\0'));
    spit(ck / "optim_v_rank0.bin", v + std::string(64, '\0'));
    reseal(ck);
    CHECK_THAT(resume_error(ck, "resume_long_sealed"),
               ContainsSubstring("optimizer files") && ContainsSubstring("model.bin holds 30080 values"));
  }
  SECTION("truncated in a checkpoint without a manifest") {
    fs::remove(ck / "manifest.json");
    spit(ck / "optim_rank0.bin", m.substr(0, m.size() - 40));
    spit(ck / "optim_v_rank0.bin", v.substr(0, v.size() - 40));
    CHECK_THAT(resume_error(ck, "resume_trunc_v1"),
               ContainsSubstring("hold 30070 elements per moment but model.bin holds 30080"));
  }
}

TEST_CASE("checkpoint: a missing - an unlisted file and a damaged manifest are refused", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("files");
  SECTION("missing") {
    fs::remove(ck / "optim_v_rank0.bin");
    CHECK_THAT(resume_error(ck, "resume_missing"),
               ContainsSubstring("optim_v_rank0.bin") && ContainsSubstring("listed in manifest.json but cannot be read"));
  }
  SECTION("unlisted") {
    spit(ck / "fp8_rank0.json", "{}");
    CHECK_THAT(resume_error(ck, "resume_unlisted"),
               ContainsSubstring("fp8_rank0.json") && ContainsSubstring("not listed in manifest.json"));
  }
  SECTION("not JSON") {
    spit(ck / "manifest.json", slurp(ck / "manifest.json").substr(0, 40));
    CHECK_THAT(resume_error(ck, "resume_badjson"),
               ContainsSubstring("manifest.json is not valid JSON"));
  }
  SECTION("a newer format version") {
    nlohmann::json m = read_json(ck / "manifest.json");
    m["format_version"] = 3;
    write_json(ck / "manifest.json", m);
    CHECK_THAT(export_error(ck), ContainsSubstring("format_version 3 is newer than this fp8train reads (2)"));
  }
  SECTION("a mistyped checksum") {
    nlohmann::json m = read_json(ck / "manifest.json");
    m["files"]["model.bin"]["crc32c"] = 1234;
    write_json(ck / "manifest.json", m);
    CHECK_THAT(export_error(ck), ContainsSubstring("manifest.json: key 'crc32c' is 1234, not a string"));
  }
  SECTION("a path out of the checkpoint") {
    nlohmann::json m = read_json(ck / "manifest.json");
    m["files"]["../../etc/passwd"] = {{"bytes", 1}, {"crc32c", "00000000"}};
    write_json(ck / "manifest.json", m);
    CHECK_THAT(export_error(ck), ContainsSubstring("\"../../etc/passwd\", not a file name inside the checkpoint"));
  }
}

TEST_CASE("checkpoint: a NaN or Inf in model.bin is named by parameter and element at load", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("nan");
  // h.1.attn.c_attn.weight (96, 32) starts after wte (4096), wpe (512), block 0 (12704), h.1.ln_1 (64).
  const int64_t c_attn = 4096 + 512 + 12704 + 64;
  poke_float(ck / "model.bin", c_attn + 2 * 32 + 5, NAN);
  poke_float(ck / "model.bin", c_attn + 90 * 32, INFINITY);
  reseal(ck);  // written that way: the checksums agree, the values do not
  const std::initializer_list<std::string> named = {
      "model.bin: parameter h.1.attn.c_attn.weight holds 2 non-finite value(s)",
      "the first is element 69 (row 2, column 5) = nan"};
  check_words(resume_error(ck, "resume_nan"), named);
  check_words(export_error(ck), named);
  fs::remove(ck / "manifest.json");  // the check does not depend on the manifest
  check_words(export_error(ck), named);
}

TEST_CASE("checkpoint: sample and export refuse a model.bin longer than the model and its padding", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("padding");
  const int64_t numel = 30080;
  int world = 2;
  while (numel % world == 0) ++world;  // a world size whose padding adds elements
  nlohmann::json s = read_json(ck / "state.json");
  s["world_size"] = world;
  write_json(ck / "state.json", s);
  reseal(ck);
  const int64_t padded = (numel + world - 1) / world * world;
  CHECK_THAT(export_error(ck), ContainsSubstring("model.bin holds 120320 bytes") &&
                                   ContainsSubstring(fmt::format("padded to a multiple of the {} rank(s)", world)) &&
                                   ContainsSubstring(fmt::format("takes exactly {}", padded * 4)));
  // A state.json of a one-layer model over the two-layer model.bin: a prefix would load, it is refused.
  s["world_size"] = 1;
  std::string cfg = s["config"];
  cfg.replace(cfg.find("n_layer: 2"), 10, "n_layer: 1");
  s["config"] = cfg;
  write_json(ck / "state.json", s);
  fs::remove(ck / "manifest.json");
  CHECK_THAT(export_error(ck), ContainsSubstring("model.bin holds 120320 bytes") &&
                                   ContainsSubstring("longer than that model"));
}

TEST_CASE("checkpoint: a state.json of another model is refused even at the same byte size", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("othermodel");
  nlohmann::json s = read_json(ck / "state.json");
  std::string cfg = s["config"];
  cfg.replace(cfg.find("n_head: 2"), 9, "n_head: 4");  // same parameters, same bytes: another model
  s["config"] = cfg;
  write_json(ck / "state.json", s);
  CHECK_THAT(resume_error(ck, "resume_nhead_raw"),
             ContainsSubstring("state.json") && ContainsSubstring("checksum mismatch"));
  reseal(ck);
  CHECK_THAT(resume_error(ck, "resume_nhead_sealed"),
             ContainsSubstring("state.json describes another model than its manifest records") &&
                 ContainsSubstring("model.n_head is 2 in manifest.json but 4 in state.json's config"));
  fs::remove(ck / "manifest.json");
  CHECK_THAT(resume_error(ck, "resume_nhead_v1"),
             ContainsSubstring("the checkpoint holds another model than this run") &&
                 ContainsSubstring("model.n_head is 4 in the checkpoint's state.json but 2 in this run's config"));
}

TEST_CASE("checkpoint: without a manifest a checkpoint still loads - with a warning", "[checkpoint]") {
  const fs::path ck = copy_checkpoint("v1");
  fs::remove(ck / "manifest.json");
  const ExportStats st = export_hf_gpt2(ck, ck.parent_path() / "v1_hf");
  CHECK(st.tensors > 0);
  CHECK_THAT(st.warning, ContainsSubstring("has no manifest.json") && ContainsSubstring("cannot be verified"));
  auto comm = make_single_communicator();
  const Config cfg = tiny_run("resume_v1");
  fs::remove_all(cfg.run.out_dir);
  CHECK(train(cfg, *comm, ck).steps == 4);
  CHECK_THAT(slurp(fs::path(cfg.run.out_dir) / "log.txt"), ContainsSubstring("cannot be verified"));
  // Its next checkpoint has one.
  CHECK(verify_checkpoint(fs::path(cfg.run.out_dir) / "checkpoints" / "step_00000004", CheckpointUse::resume)
            .empty());
  const auto [code, out] = run_cli("export --checkpoint " + ck.string() + " --out " + (ck.string() + "_cli"));
  CHECK(code == 0);
  CHECK_THAT(out, ContainsSubstring("warning") && ContainsSubstring("has no manifest.json"));
}

TEST_CASE("checkpoint: a damaged FP8 state file is refused naming it", "[checkpoint][fp8]") {
  const std::string fp8 = "precision: {compute: fp8, fp8: {amax_history_len: 4}}";
  auto comm = make_single_communicator();
  Config cfg = tiny_run("fp8_source", 2, fp8);
  fs::remove_all(cfg.run.out_dir);
  REQUIRE(train(cfg, *comm).steps == 2);
  const fs::path ck = scratch_root() / "copies" / "fp8";
  fs::remove_all(ck);
  fs::create_directories(ck.parent_path());
  fs::copy(fs::path(cfg.run.out_dir) / "checkpoints" / "step_00000002", ck);
  nlohmann::json f = read_json(ck / "fp8_rank0.json");
  f["h.0.mlp.c_fc"]["input"]["pos"] = -1;
  write_json(ck / "fp8_rank0.json", f);
  reseal(ck);
  CHECK_THAT(resume_error(ck, "fp8_resume", 4, fp8),
             ContainsSubstring("fp8_rank0.json") && ContainsSubstring("h.0.mlp.c_fc input") &&
                 ContainsSubstring("position -1 is outside [0, 4)"));
}
