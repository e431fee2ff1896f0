// Whole-model checks on the GPU: a GPT-2 forward/backward in BF16 against the FP32 CPU model on the
// same weights and tokens, and a short GPU training run whose loss falls.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <filesystem>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "gpu_test_util.h"
#include "nn/gpt.h"
#include "ops/ops.h"
#include "train/trainer.h"

using namespace fp8t;
namespace fs = std::filesystem;

namespace {
ModelConfig small_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;  // head size 64
  m.d_model = 128;
  m.vocab_size = 300;  // padded to 384
  m.seq_len = 64;
  return m;
}

std::pair<float, std::vector<float>> loss_and_grads(GPT& model, const Tensor& x, const Tensor& y) {
  model.params().zero_grads();
  Tape tape;
  Var loss;
  {
    TapeScope s(&tape);
    loss = model.loss(x, y);
  }
  tape.backward(loss);
  return {loss->value.to_float_vector()[0], model.params().grads().to_float_vector()};
}
}  // namespace

TEST_CASE("gpu model: BF16 GPT-2 forward and backward match the FP32 CPU model", "[gpu][model]") {
  const ModelConfig m = small_model();
  GPT cpu(m, Device::cpu(), DType::f32);
  GPT gpu(m, test::kGpu, DType::bf16);
  cpu.init(42);
  gpu.init(42);
  const auto tokens = test::randint(4 * 64, m.vocab_size), targets = test::randint(4 * 64, m.vocab_size);
  Tensor xc = Tensor::empty({4, 64}, DType::i32), yc = Tensor::empty({4, 64}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), xc.data<int32_t>());
  std::copy(targets.begin(), targets.end(), yc.data<int32_t>());
  const auto [lc, gc] = loss_and_grads(cpu, xc, yc);
  const auto [lg, gg] = loss_and_grads(gpu, xc.to(test::kGpu), yc.to(test::kGpu));
  CHECK(std::fabs(lc - lg) / lc < 1e-2);
  // Per-parameter relative error of the gradient: BF16 activations, FP32 accumulation.
  for (const auto& s : cpu.params().specs()) {
    double num = 0, den = 0;
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) {
      num += (double(gc[i]) - gg[i]) * (double(gc[i]) - gg[i]);
      den += double(gc[i]) * gc[i];
    }
    INFO(s.name << " rel err " << std::sqrt(num / std::max(den, 1e-30)));
    CHECK(std::sqrt(num / std::max(den, 1e-30)) < 5e-2);
  }
}

TEST_CASE("gpu model: a short BF16 training run on the GPU lowers the loss", "[gpu][model][train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_gpu_train_{}", ::getpid());
  fs::create_directories(root / "data");
  std::mt19937 rng(3);
  std::vector<uint16_t> perm(200);
  for (int i = 0; i < 200; ++i) perm[i] = static_cast<uint16_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (const char* name : {"train_000000.bin", "val_000000.bin"}) {
    std::vector<uint16_t> toks(100000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = perm[i % 200];
    write_shard((root / "data" / name).string(), toks);
  }
  const std::string yaml = fmt::format(R"(
run: {{name: gpu-train, out_dir: {0}/run, device: cuda}}
model: {{n_layer: 2, n_head: 2, d_model: 128, vocab_size: 300, seq_len: 64}}
data: {{train: {0}/data/train_*.bin, val: {0}/data/val_*.bin}}
train: {{micro_batch: 8, max_steps: 40, eval_steps: 4}}
optim: {{lr: 3.0e-3, warmup_steps: 5}}
precision: {{compute: bf16}}
)",
                                       root.string());
  auto comm = make_single_communicator();
  const TrainResult r = train(parse_config(yaml, "gpu-train.yaml"), *comm);
  CHECK(r.last_val_loss < 0.5 * r.first_val_loss);
  fs::remove_all(root);
}
