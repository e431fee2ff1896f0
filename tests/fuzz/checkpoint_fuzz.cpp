// libFuzzer harness: the text files of a checkpoint directory, each written into a scratch checkpoint
// and read by the code that --resume, sample and export run. Input: a first line naming the file, then
// its bytes:
//   state.json        read_checkpoint_state; an accepted state must be in range
//   fp8_rank0.json    read_json_object + GPT::load_fp8_state of a 1-layer FP8 model, then the end-of-step
//                     rollover that indexes the amax history
//   optim_state.json  load_optimizer_state over valid moment files
//   manifest.json     verify_checkpoint of an otherwise intact checkpoint, for resume and for inference
//   latest            latest_checkpoint of the run directory
// Any other first line is read as state.json. FP8T_FUZZ_WRITE_SEEDS=DIR writes one valid input of each
// kind into DIR at start-up (how corpus/checkpoint/valid-* were made).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>

#include "config/config.h"
#include "dist/comm.h"
#include "dist/zero.h"
#include "fuzz_util.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/optimizer_checkpoint.h"

namespace fs = std::filesystem;

namespace {

// A 1-layer GPT whose four linears run in FP8 with a short amax history, and its optimizer.
struct Model {
  fp8t::Config cfg;
  std::unique_ptr<fp8t::GPT> gpt;
  std::unique_ptr<fp8t::AdamW> optim;

  Model() {
    cfg.run.device = fp8t::Device::cpu();
    cfg.model.n_layer = 1;
    cfg.model.n_head = 2;
    cfg.model.d_model = 16;
    cfg.model.vocab_size = 100;
    cfg.model.seq_len = 8;
    cfg.data.train = "unused_*.bin";
    cfg.train.micro_batch = 1;
    cfg.train.max_steps = 10;
    cfg.precision.compute = fp8t::ComputeMode::fp8;
    cfg.precision.fp8.amax_history_len = 4;
    gpt = std::make_unique<fp8t::GPT>(cfg.model, fp8t::Device::cpu(), fp8t::DType::f32, 1, cfg.precision);
    gpt->init(1);
    optim = std::make_unique<fp8t::AdamW>(cfg.optim, gpt->params(), 0, gpt->params().padded_numel());
  }
};

Model& model() {
  static Model m;
  return m;
}

// A complete checkpoint of the model at step 1: model.bin, optimizer files, fp8_rank0.json, state.json.
void write_checkpoint(const fs::path& dir) {
  fs::create_directories(dir);
  Model& m = model();
  fp8t::write_tensor_file(dir / "model.bin", m.gpt->params().master());
  const auto comm = fp8t::make_single_communicator();
  fp8t::save_optimizer_state(dir, *comm, 0, *m.optim);
  fp8t::write_checkpoint_text(dir / "fp8_rank0.json", m.gpt->fp8_state().dump());
  fp8t::write_checkpoint_state(dir, {1, 1, 0, 8, m.cfg.to_yaml()});
}

// Where state.json, fp8_rank0.json, optim_state.json and latest are fuzzed (no manifest).
const fs::path& files_dir() {
  static const fs::path dir = [] {
    const fs::path d = fp8t::fuzz::scratch_dir() / "run" / "checkpoints" / "step_00000001";
    write_checkpoint(d);
    return d;
  }();
  return dir;
}

// An intact checkpoint with its manifest; only manifest.json is ever replaced.
const fs::path& manifest_dir() {
  static const fs::path dir = [] {
    const fs::path d = fp8t::fuzz::scratch_dir() / "manifested";
    write_checkpoint(d);
    fp8t::write_manifest(d);
    return d;
  }();
  return dir;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_seeds(const fs::path& out) {
  fs::create_directories(out);
  for (const char* name : {"state.json", "fp8_rank0.json", "optim_state.json"})
    fp8t::fuzz::write_bytes(out / fmt::format("valid-{}", name), name + std::string("\n") + read_text(files_dir() / name));
  fp8t::fuzz::write_bytes(out / "valid-manifest.json", "manifest.json\n" + read_text(manifest_dir() / "manifest.json"));
  fp8t::fuzz::write_bytes(out / "valid-latest", "latest\nstep_00000001\n");
}

void fuzz_state_json(std::string_view bytes) {
  fp8t::fuzz::write_bytes(files_dir() / "state.json", bytes);
  const fp8t::CheckpointState s = fp8t::read_checkpoint_state(files_dir());
  FP8T_FUZZ_REQUIRE(s.step >= 0 && s.world_size >= 1 && s.zero_stage >= 0 && s.zero_stage <= 3 && s.tokens >= 0,
                    "state.json accepted out of range: step %d world_size %d zero_stage %d tokens %lld", s.step,
                    s.world_size, s.zero_stage, static_cast<long long>(s.tokens));
}

void fuzz_fp8_state(std::string_view bytes) {
  const fs::path file = files_dir() / "fp8_rank0.json";
  fp8t::fuzz::write_bytes(file, bytes);
  fp8t::GPT& gpt = *model().gpt;
  const nlohmann::json before = gpt.fp8_state();
  try {
    gpt.load_fp8_state(fp8t::read_json_object(file));
  } catch (const fp8t::Error&) {
    gpt.load_fp8_state(before);  // a refused state must not leak into the next input's model
    throw;
  }
  // An accepted state must survive the end-of-step rollover that indexes the amax history.
  gpt.on_optimizer_step();
  gpt.load_fp8_state(before);
}

void fuzz_optim_state(std::string_view bytes) {
  fp8t::fuzz::write_bytes(files_dir() / "optim_state.json", bytes);
  (void)fp8t::load_optimizer_state(files_dir(), 1, 0, *model().optim);
}

void fuzz_manifest(std::string_view bytes) {
  fp8t::fuzz::write_bytes(manifest_dir() / "manifest.json", bytes);
  try {
    (void)fp8t::verify_checkpoint(manifest_dir(), fp8t::CheckpointUse::inference);
  } catch (const fp8t::Error&) {
  }
  (void)fp8t::verify_checkpoint(manifest_dir(), fp8t::CheckpointUse::resume);
}

void fuzz_latest(std::string_view bytes) {
  const fs::path run = files_dir().parent_path().parent_path();
  fp8t::fuzz::write_bytes(run / "checkpoints" / "latest", bytes);
  (void)fp8t::latest_checkpoint(run);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Both checkpoints are written before the first input, so no input pays for them.
  files_dir();
  manifest_dir();
  if (const char* out = std::getenv("FP8T_FUZZ_WRITE_SEEDS"); out && *out) write_seeds(out);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string_view name = input.substr(0, nl);
  const std::string_view bytes = nl == std::string_view::npos ? std::string_view() : input.substr(nl + 1);
  fp8t::fuzz::expect_clean_refusal([&] {
    if (name == "fp8_rank0.json") fuzz_fp8_state(bytes);
    else if (name == "optim_state.json") fuzz_optim_state(bytes);
    else if (name == "manifest.json") fuzz_manifest(bytes);
    else if (name == "latest") fuzz_latest(bytes);
    else fuzz_state_json(name == "state.json" ? bytes : input);
  });
  return 0;
}
