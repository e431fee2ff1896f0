// Import: our own HF and llm.c exports imported back give the trained weights bit for bit (BF16: the
// rounded weights) and the same val loss; the checkpoint written is one the trainer's readers accept;
// train.init_from and --resume of it start at step 0 with fresh optimizer state.
#include <catch2/catch_test_macros.hpp>
#include <cmath>

#include "import_test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/export.h"
#include "train/gpt2_formats.h"
#include "train/import.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("import: HF export then import gives the same weights bit for bit and the same val loss", "[import]") {
  const fs::path run = trained_run(), root = scratch_root() / "hf_round_trip";
  const std::string trained = model_bin(latest_of(run));
  // The trainer's own checkpoints keep wte's padding rows (vocab 64 of 128) at zero: import writes zeros there.
  const std::vector<float> w = floats(trained);
  for (size_t i = 64 * 32; i < 128 * 32; ++i) REQUIRE(w[i] == 0.0f);

  export_hf_gpt2(run, root / "hf");
  const ImportStats s = import_hf_gpt2(root / "hf", root / "run");
  CHECK(s.tensors == 2 + 12 * 2 + 2);
  CHECK(s.model.n_layer == 2);
  CHECK(s.model.vocab_size == 64);
  CHECK(s.checkpoint == root / "run" / "checkpoints" / "step_00000000");
  CHECK(model_bin(s.checkpoint) == trained);

  // A complete checkpoint at step 0 as the trainer writes it, without optimizer files.
  CHECK(verify_checkpoint(s.checkpoint, CheckpointUse::resume).empty());
  const CheckpointState st = read_checkpoint_state(s.checkpoint);
  CHECK(st.step == 0);
  CHECK(st.world_size == 1);
  CHECK(st.tokens == 0);
  CHECK(fs::exists(root / "run" / "config.yaml"));
  CHECK(load_config((root / "run" / "config.yaml").string()).run.out_dir == (root / "run").string());
  CHECK(slurp(root / "run" / "checkpoints" / "latest") == "step_00000000");
  CHECK_FALSE(fs::exists(s.checkpoint / "optim_rank0.bin"));
  CHECK(weights_only_checkpoint(s.checkpoint));
  CHECK_FALSE(weights_only_checkpoint(latest_of(run)));

  // Same weights, same val loss before the first step.
  const TrainResult a = train_from(root / "run", "from_import");
  const TrainResult b = train_from(run, "from_trained");
  REQUIRE(a.first_val_loss);
  CHECK(*a.first_val_loss == *b.first_val_loss);
  CHECK(*a.last_train_loss == *b.last_train_loss);
}

TEST_CASE("import: llm.c v3 round trips bit for bit - v5 (BF16) gives the BF16-rounded weights", "[import]") {
  const fs::path run = trained_run(), root = scratch_root() / "llmc_round_trip";
  const std::string trained = model_bin(latest_of(run));

  const ExportStats e3 = export_llmc_gpt2(run, root / "gpt2_f32.bin", DType::f32);
  CHECK(e3.tensors == 2 + 12 * 2 + 2);  // counted as our parameters (llm.c groups them in 16 arrays)
  const std::string f3 = slurp(root / "gpt2_f32.bin");
  std::vector<int32_t> h(256);
  std::memcpy(h.data(), f3.data(), 1024);
  CHECK(std::vector<int32_t>(h.begin(), h.begin() + 8) == std::vector<int32_t>{kLlmcMagic, 3, 16, 64, 2, 2, 32, 128});
  CHECK(std::all_of(h.begin() + 8, h.end(), [](int32_t x) { return x == 0; }));
  CHECK(static_cast<int64_t>(f3.size()) == 1024 + static_cast<int64_t>(trained.size()));
  // llm.c order: ln1w of both layers follows wpe (ours interleaves the layers' tensors).
  const std::vector<float> w = floats(trained), file = floats(f3.substr(1024));
  const int64_t wpe_end = (128 + 16) * 32, layer = (static_cast<int64_t>(w.size()) - wpe_end - 2 * 32) / 2;
  CHECK(std::memcmp(&file[wpe_end + 32], &w[wpe_end + layer], 32 * 4) == 0);  // ln1w of layer 1

  const ImportStats i3 = import_llmc_gpt2(root / "gpt2_f32.bin", root / "run3");
  CHECK(i3.tensors == 2 + 12 * 2 + 2);
  CHECK(model_bin(i3.checkpoint) == trained);
  CHECK(verify_checkpoint(i3.checkpoint, CheckpointUse::resume).empty());

  export_llmc_gpt2(run, root / "gpt2_bf16.bin", DType::bf16);
  CHECK(fs::file_size(root / "gpt2_bf16.bin") == 1024 + trained.size() / 2);
  std::memcpy(h.data(), slurp(root / "gpt2_bf16.bin").data(), 8);
  CHECK(h[1] == 5);
  const ImportStats i5 = import_llmc_gpt2(root / "gpt2_bf16.bin", root / "run5");
  CHECK(model_bin(i5.checkpoint) == bf16_rounded(trained));
  CHECK(model_bin(i5.checkpoint) != trained);

  const TrainResult a = train_from(root / "run3", "from_llmc");
  const TrainResult b = train_from(run, "from_trained");
  CHECK(*a.first_val_loss == *b.first_val_loss);
}

TEST_CASE("import: HF names prefixed transformer. - a tied lm_head - BF16 tensors import and train on", "[import]") {
  const fs::path run = trained_run(), root = scratch_root() / "hf_prefixed";
  const std::string trained = model_bin(latest_of(run));
  export_hf_gpt2(run, root / "hf");
  StMap prefixed;
  for (const auto& [name, t] : read_safetensors(root / "hf" / "model.safetensors")) prefixed["transformer." + name] = t;
  prefixed["lm_head.weight"] = prefixed.at("transformer.wte.weight");  // GPT2LMHeadModel saves the tied head too
  prefixed["transformer.h.0.attn.bias"] = {"F32", {1, 1, 16, 16}, std::string(16 * 16 * 4, '\0')};  // causal mask
  write_safetensors(root / "hf" / "model.safetensors", prefixed);
  const ImportStats s = import_hf_gpt2(root / "hf", root / "run");
  CHECK(s.tensors == 2 + 12 * 2 + 2 + 1);
  CHECK(model_bin(s.checkpoint) == trained);

  const TrainResult r = train_from(root / "run", "prefixed_on", 2);
  CHECK(r.steps == 2);
  REQUIRE(r.last_train_loss);
  CHECK(std::isfinite(*r.last_train_loss));
  REQUIRE(r.last_val_loss);
  CHECK(std::isfinite(*r.last_val_loss));
  CHECK(slurp(fs::path(tiny_run("prefixed_on").run.out_dir) / "log.txt").find("train.init_from: weights of") !=
        std::string::npos);

  StMap bf16 = prefixed;
  for (auto& [name, t] : bf16) t = {"BF16", t.shape, to_bf16(t.bytes)};
  write_safetensors(root / "hf" / "model.safetensors", bf16);
  CHECK(model_bin(import_hf_gpt2(root / "hf", root / "run_bf16").checkpoint) == bf16_rounded(trained));
}

TEST_CASE("import: a resume of an imported run starts with fresh moments - as init_from does", "[import][train]") {
  const fs::path run = trained_run(), root = scratch_root() / "resume_import";
  export_hf_gpt2(run, root / "hf");
  import_hf_gpt2(root / "hf", root / "run");
  auto comm = make_single_communicator();
  const Config cfg = tiny_run("resumed_import", 2);
  fs::remove_all(cfg.run.out_dir);
  const TrainResult resumed = train(cfg, *comm, root / "run");
  CHECK(resumed.steps == 2);
  const std::string log = slurp(fs::path(cfg.run.out_dir) / "log.txt");
  check_words(log, {"holds weights only (no optimizer files): AdamW moments start at zero", "at step 0"});
  const TrainResult fresh = train_from(root / "run", "init_from_import", 2);
  CHECK(*resumed.last_train_loss == *fresh.last_train_loss);
  CHECK(*resumed.last_val_loss == *fresh.last_val_loss);

  // Both given: --resume wins, and says so.
  Config both = tiny_run("both", 2);
  both.train.init_from = run.string();
  fs::remove_all(both.run.out_dir);
  CHECK(*train(both, *comm, root / "run").last_train_loss == *resumed.last_train_loss);
  check_words(slurp(fs::path(both.run.out_dir) / "log.txt"), {"wins over train.init_from"});
}

TEST_CASE("import: train.init_from refuses another model and a directory without a checkpoint", "[import][train]") {
  const fs::path run = trained_run();
  auto comm = make_single_communicator();
  Config other = tiny_run("other_model", 2);
  other.model.n_layer = 3;
  other.train.init_from = run.string();
  try {
    train(other, *comm);
    FAIL("another model was accepted");
  } catch (const Error& e) {
    check_words(e.what(), {"train.init_from", "another model", "model.n_layer is 2", "but 3 in this run's config"});
  }
  Config empty = tiny_run("no_checkpoint", 2);
  fs::create_directories(scratch_root() / "empty_dir");
  empty.train.init_from = (scratch_root() / "empty_dir").string();
  try {
    train(empty, *comm);
    FAIL("a directory without a checkpoint was accepted");
  } catch (const Error& e) {
    check_words(e.what(), {"train.init_from", "empty_dir", "holds no complete checkpoint", "fp8train import"});
  }
  // A key like any other: parsed, written back, refused early by check_run_inputs when not a directory.
  const Config parsed = parse_config("train: {init_from: runs/gpt2}\n", "i.yaml");
  CHECK(parsed.train.init_from == "runs/gpt2");
  CHECK(parse_config(parsed.to_yaml(), "again").train.init_from == "runs/gpt2");
  Config missing = tiny_run("missing_dir", 2);
  missing.train.init_from = (scratch_root() / "no_such_dir").string();
  try {
    check_run_inputs(missing);
    FAIL("a missing train.init_from was accepted");
  } catch (const Error& e) {
    check_words(e.what(), {"train.init_from", "no_such_dir", "is not a directory"});
  }
}
