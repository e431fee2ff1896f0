// FP8 linear on the GPU: the CUDA fp8_linear against its CPU emulation (delayed and current scaling, fp8 and bf16
// storage, the bias in the GEMM or left to the reader), the bias gradient whichever inputs need gradients, the row
// count check, a short FP8 GPT training run and the chunked FP8 head. The fused linears: fp8_linear_fused_gpu_test.cpp.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>
#include <random>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "train/trainer.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;
namespace fs = std::filesystem;

namespace {

// Two optimizer steps of forward + backward (the first fills the amax history, so the second runs
// with real delayed scales); returns the second step's outputs and gradients. bias_at: LinearBias::in_reader leaves b
// out of y (its gradient is still taken).
LinearResult run_fp8_linear(Fp8LinearState& st, Device dev, const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>& b, const std::vector<float>& dy, int64_t M, int64_t IC,
                            int64_t OC, LinearBias bias_at = LinearBias::in_gemm) {
  const DType dt = dev.is_cuda() ? DType::bf16 : DType::f32;
  auto put = [&](const std::vector<float>& v, Shape shape, DType d) {
    return dev.is_cuda() ? upload(v, shape, d) : Tensor::from_vector(v, shape);
  };
  LinearResult r;
  for (int step = 0; step < 2; ++step) {
    Var xv = make_var(put(x, {M / 8, 8, IC}, dt), true), wv = make_var(put(w, {OC, IC}, dt), true),
        bv = make_var(put(b, {OC}, dt), true);
    wv->grad = Tensor::zeros({OC, IC}, DType::f32, dev, MemCategory::gradients);  // f32 like the flat buffer
    bv->grad = Tensor::zeros({OC}, DType::f32, dev, MemCategory::gradients);
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      y = fp8_linear(xv, wv, bv, st, false, bias_at);
      y = fp8_linear(xv, wv, bv, st, false, bias_at);  // a second micro-batch: the cached weight is reused
    }
    grad_of(y).copy_from(put(dy, {M / 8, 8, OC}, dt));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    if (dev.is_cuda()) CUDA_CHECK(cudaDeviceSynchronize());
    r = {y->value.to_float_vector(), grad_of(xv).to_float_vector(), wv->grad.to_float_vector(),
         bv->grad.to_float_vector()};
    st.on_optimizer_step();
  }
  return r;
}

}  // namespace

TEST_CASE("fp8 linear: CUDA matches the CPU emulation - delayed and current scaling - fp8 and bf16 storage - "
          "the bias in the GEMM or left to the reader",
          "[gpu][fp8]") {
  const int64_t M = 512, IC = 256, OC = 768;
  const auto x = round_bf16(randn(M * IC, 1.5f)), w = round_bf16(randn(OC * IC, 0.03f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 2e-4f));
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::bf16}) {
      const LinearBias at = storage == ActivationStorage::fp8 ? LinearBias::in_reader : LinearBias::in_gemm;
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      Fp8LinearState cpu("cpu", cfg), gpu("gpu", cfg);
      const LinearResult rc = run_fp8_linear(cpu, Device::cpu(), x, w, b, dy, M, IC, OC, at);
      const LinearResult rg = run_fp8_linear(gpu, kGpu, x, w, b, dy, M, IC, OC, at);
      INFO("current scaling " << (scaling == Fp8Scaling::current) << " fp8 storage "
                              << (storage == ActivationStorage::fp8) << " bias in reader "
                              << (at == LinearBias::in_reader));
      CHECK(rel_err(rg.y, rc.y) < 1e-2);
      CHECK(rel_err(rg.dx, rc.dx) < 1e-2);
      CHECK(rel_err(rg.dw, rc.dw) < 1e-3);
      CHECK(rel_err(rg.db, rc.db) < 1e-4);
      // The device statistics reached the host metas: same amaxes, saturation and scales, bit for bit.
      using MetaPair = std::pair<const Fp8TensorMeta*, const Fp8TensorMeta*>;
      for (auto [mc, mg] : {MetaPair{&cpu.input, &gpu.input}, MetaPair{&cpu.weight, &gpu.weight},
                            MetaPair{&cpu.grad_output, &gpu.grad_output}}) {
        CHECK(mg->last_amax == mc->last_amax);
        CHECK(mg->last_saturated == mc->last_saturated);
        CHECK(mg->scale == mc->scale);
        CHECK(mg->history_oldest_first() == mc->history_oldest_first());
      }
      CHECK(gpu.weight_casts == 2);  // once per optimizer step, not per micro-batch
    }
  }
}

TEST_CASE("fp8 linear: the bias gradient is added once whichever of x and w need gradients - ragged tiles",
          "[gpu][fp8]") {
  // The CUDA backward adds db inside the dy cast when there is one (dgrad and/or wgrad) and with a
  // column-sum kernel when only the bias needs a gradient. M = 272 and OC = 208 leave partial
  // (128, 64) tiles of dy; db starts non-zero, so adding it twice or not at all shows.
  const int64_t M = 272, IC = 64, OC = 208;
  const auto x = round_bf16(randn(M * IC, 1.5f)), w = round_bf16(randn(OC * IC, 0.03f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 2e-2f));
  const auto db0 = randn(OC, 0.5f);
  std::vector<double> dy_sum(OC), dy_abs(OC);
  for (int64_t i = 0; i < M * OC; ++i) {
    dy_sum[i % OC] += dy[i];
    dy_abs[i % OC] += std::fabs(dy[i]);
  }
  auto run = [&](Device dev, bool x_grad, bool w_grad) {
    const DType dt = dev.is_cuda() ? DType::bf16 : DType::f32;
    auto put = [&](const std::vector<float>& v, Shape shape, DType d) {
      return dev.is_cuda() ? upload(v, shape, d) : Tensor::from_vector(v, shape);
    };
    Fp8LinearState st("h.0.attn.c_attn", Fp8Config{});
    Var xv = make_var(put(x, {M, IC}, dt), x_grad), wv = make_var(put(w, {OC, IC}, dt), w_grad),
        bv = make_var(put(b, {OC}, dt), true);
    if (w_grad) wv->grad = Tensor::zeros({OC, IC}, DType::f32, dev, MemCategory::gradients);
    bv->grad = put(db0, {OC}, DType::f32);  // a gradient from an earlier micro-batch
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      y = fp8_linear(xv, wv, bv, st);
    }
    grad_of(y).copy_from(put(dy, {M, OC}, dt));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    if (dev.is_cuda()) CUDA_CHECK(cudaDeviceSynchronize());
    LinearResult r{{}, x_grad ? grad_of(xv).to_float_vector() : std::vector<float>{},
                   w_grad ? wv->grad.to_float_vector() : std::vector<float>{}, bv->grad.to_float_vector()};
    st.on_optimizer_step();
    return r;
  };
  for (auto [x_grad, w_grad] : {std::pair{true, true}, {true, false}, {false, true}, {false, false}}) {
    INFO("x needs a gradient " << x_grad << ", w needs a gradient " << w_grad);
    const LinearResult rg = run(kGpu, x_grad, w_grad);
    CHECK(colsum_mismatches(rg.db, db0, dy_sum, dy_abs) == 0);
    const LinearResult rc = run(Device::cpu(), x_grad, w_grad);  // dx and dw unchanged by the fusion
    CHECK(rg.dx.size() == rc.dx.size());
    CHECK(rg.dw.size() == rc.dw.size());
    if (x_grad) CHECK(rel_err(rg.dx, rc.dx) < 1e-2);
    if (w_grad) CHECK(rel_err(rg.dw, rc.dw) < 1e-3);
  }
}

TEST_CASE("fp8 linear: CUDA rejects rows that are not a multiple of 16 with an actionable message", "[gpu][fp8]") {
  Fp8LinearState st("h.0.mlp.c_fc", Fp8Config{});
  Var x = make_var(upload(randn(24 * 64), {24, 64}, DType::bf16), true);
  Var w = make_var(upload(randn(64 * 64), {64, 64}, DType::bf16), true);
  CHECK_THROWS_WITH(fp8_linear(x, w, nullptr, st), Catch::Matchers::ContainsSubstring("multiples of 16"));
}

// ------------------------------------------------------------------------------------------------ model

TEST_CASE("fp8 model: a short FP8 training run on the GPU lowers the loss", "[gpu][fp8][train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_gpu_fp8_train_{}", ::getpid());
  fs::create_directories(root / "data");
  std::mt19937 rng(5);
  std::vector<uint16_t> perm(200);
  for (int i = 0; i < 200; ++i) perm[i] = static_cast<uint16_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (const char* file : {"train_000000.bin", "val_000000.bin"}) {
    std::vector<uint16_t> toks(100000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = perm[i % 200];
    write_shard((root / "data" / file).string(), toks);
  }
  const std::string yaml = fmt::format(R"(
run: {{name: gpu-fp8-train, out_dir: {0}/run, device: cuda}}
model: {{n_layer: 2, n_head: 2, d_model: 128, vocab_size: 300, seq_len: 64}}
data: {{train: {0}/data/train_*.bin, val: {0}/data/val_*.bin}}
train: {{micro_batch: 8, max_steps: 30, eval_steps: 4}}
optim: {{lr: 3.0e-3, warmup_steps: 5}}
precision: {{compute: fp8, fp8: {{layers: [qkv, proj, fc, fc2, lm_head]}}}}
)",
                                       root.string());
  auto comm = make_single_communicator();
  const TrainResult r = train(parse_config(yaml, "gpu-fp8-train.yaml"), *comm);
  INFO("val loss " << r.first_val_loss.value() << " -> " << r.last_val_loss.value());
  CHECK(std::isfinite(r.last_val_loss.value()));
  CHECK(r.last_val_loss.value() < 0.6 * r.first_val_loss.value());
  fs::remove_all(root);
}

// The FP8 head in chunks on the GPU against the unchunked composition (delayed scaling, scales from a first step).
// B * T = 256 and chunks of 64, 96 (ragged) and 256 tokens keep every per-token loss gradient the same bits; the
// GEMMs see fewer rows (cuBLASLt may pick another algorithm) and d(w) is summed chunk by chunk, so the results are
// compared within bf16's rounding. The statistics are the same maxima over the same codes.
TEST_CASE("fp8 linear: fp8_lm_head_loss in chunks equals cross_entropy(fp8_linear) on the GPU", "[gpu][fp8]") {
  const int64_t B = 4, T = 64, C = 64, V = 1000, Vp = 1024;
  const std::vector<float> h0 = randn(B * T * C), w0 = randn(Vp * C, 0.1f);
  std::vector<int32_t> tgt(static_cast<size_t>(B * T));
  for (size_t i = 0; i < tgt.size(); ++i) tgt[i] = static_cast<int32_t>((i * 7919) % V);
  const Tensor targets = upload_i32(tgt, {B, T});
  const float seed = 0.5f;
  struct Run {
    float loss;
    std::vector<float> dh, dw;
    int64_t peak;
  };
  auto run = [&](int64_t chunk, Fp8LinearState& st) {
    Var h = make_var(upload(h0, {B, T, C}, DType::bf16), true), w = make_var(upload(w0, {Vp, C}, DType::bf16), true);
    w->grad = Tensor::zeros({Vp, C}, DType::f32, kGpu, MemCategory::gradients);
    Allocator& a = allocator_for(kGpu);
    CUDA_CHECK(cudaDeviceSynchronize());
    a.reset_peaks();
    const int64_t before = a.stats().cur(MemCategory::activations);
    Tape tape;
    Var loss;
    {
      TapeScope s(&tape);
      loss = chunk > 0 ? fp8_lm_head_loss(h, w, st, targets, V, chunk, seed)
                       : cross_entropy(fp8_linear(h, w, Var(), st), targets, V);
    }
    tape.backward(loss, seed);
    CUDA_CHECK(cudaDeviceSynchronize());
    return Run{loss->value.to_float_vector()[0], grad_of(h).to_float_vector(), w->grad.to_float_vector(),
               a.stats().pk(MemCategory::activations) - before};
  };
  for (int64_t chunk : {int64_t{64}, int64_t{96}, int64_t{256}}) {
    INFO("chunk " << chunk);
    Fp8LinearState whole("lm_head", Fp8Config{}), chunked("lm_head", Fp8Config{});  // delayed, fp8 storage
    for (Fp8LinearState* st : {&whole, &chunked}) {
      (void)run(0, *st);
      st->on_optimizer_step();
    }
    const Run ref = run(0, whole), got = run(chunk, chunked);
    CHECK(std::fabs(got.loss - ref.loss) < 1e-3 * std::fabs(ref.loss));
    CHECK(rel_err(got.dh, ref.dh) < 1e-2);
    CHECK(rel_err(got.dw, ref.dw) < 1e-2);
    whole.collect_device_stats();
    chunked.collect_device_stats();
    CHECK(chunked.input.amax_this_step == whole.input.amax_this_step);
    CHECK(chunked.grad_output.amax_this_step == Catch::Approx(whole.grad_output.amax_this_step).epsilon(1e-2));
    if (chunk < B * T) CHECK(got.peak < ref.peak);
  }
}
