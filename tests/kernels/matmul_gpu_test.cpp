// cuBLASLt GEMMs against a CPU GEMM on the same bf16-rounded inputs, forward and all three gradients.
#include <catch2/catch_test_macros.hpp>

#include "util/gpu_test_util.h"
#include <array>

#include "autograd/tape.h"
#include "core/graph_capture.h"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/cpu/gelu.h"
#include "ops/cpu/linear.h"
#include "ops/linear_cuda.h"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {
struct Shape3 { int64_t M, K, N; };
// The last two: the bias column sums over many row chunks with partial rounds of loads (vector and scalar paths).
const Shape3 kShapes[] = {{1, 16, 8},        {77, 64, 96},     {128, 768, 2304}, {1000, 200, 50},
                          {4096, 768, 3072}, {8195, 40, 1608}, {4099, 24, 203}};
}  // namespace

TEST_CASE("matmul forward - bf16 and f32 outputs - with and without bias", "[gpu][matmul]") {
  for (auto [M, K, N] : kShapes) {
    const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), b = round_bf16(randn(N));
    Tensor tx = upload(x, {M, K}, DType::bf16), tw = upload(w, {N, K}, DType::bf16);
    for (bool with_bias : {false, true}) {
      std::vector<float> ref(M * N);
      cpu::matmul_forward(ref.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, M, K, N);
      for (DType out_dt : {DType::bf16, DType::f32}) {
        Tensor out = poisoned({M, N}, out_dt);
        Tensor tb = upload(b, {N}, out_dt);
        cuda_ops::matmul_forward(out, tx, tw, with_bias ? &tb : nullptr);
        INFO("M=" << M << " K=" << K << " N=" << N << " bias=" << with_bias << " f32=" << (out_dt == DType::f32));
        CHECK(rel_err(download(out), ref) < (out_dt == DType::f32 ? 1e-3 : 1e-2));
      }
    }
  }
}

namespace {
// out = GELU(x w^T + b) and aux = x w^T + b, from one GEMM with the GELU aux epilogue (outputs poisoned first).
void check_gelu_aux(int64_t M, int64_t K, int64_t N) {
  const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), b = round_bf16(randn(N));
  std::vector<float> pre(M * N), ref(M * N);
  cpu::matmul_forward(pre.data(), x.data(), w.data(), b.data(), M, K, N);
  cpu::gelu_forward(ref.data(), pre.data(), M * N);
  Tensor tx = upload(x, {M, K}, DType::bf16), tw = upload(w, {N, K}, DType::bf16), tb = upload(b, {N}, DType::bf16);
  Tensor out = poisoned({M, N}, DType::bf16), aux = poisoned({M, N}, DType::bf16);
  kernels::matmul_cublaslt(out.raw(), DType::bf16, {tw.raw(), DType::bf16}, true, {tx.raw(), DType::bf16}, false,
                           static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), 1.0f, 0.0f,
                           kernels::MatmulEpilogue::gelu_aux_bias, tb.raw(), aux.raw(), kernels::compute_stream());
  INFO("M=" << M << " K=" << K << " N=" << N);
  CHECK(rel_err(download(out), ref) < 1e-2);
  CHECK(rel_err(download(aux), pre) < 1e-2);
}
}  // namespace

TEST_CASE("matmul GELU + bias epilogue", "[gpu][matmul]") { check_gelu_aux(256, 768, 3072); }

TEST_CASE("matmul with autotuning - the GELU aux epilogue's outputs as without it", "[gpu][matmul]") {
  // A new shape, so its plan is timed here: the candidates write D and aux in place, and the chosen one's run
  // must leave both complete (the outputs start poisoned).
  kernels::set_matmul_options(kGpu.index, {.autotune = true});
  check_gelu_aux(192, 512, 1536);
  kernels::set_matmul_options(kGpu.index, {.autotune = false});
}

namespace {
// matmul_backward adding into existing dinp, dweight and dbias, against the CPU on the same inputs.
void check_backward_accumulates(int64_t M, int64_t K, int64_t N) {
  const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), dy = round_bf16(randn(M * N));
  std::vector<float> gx(M * K, 0.0f), gw(N * K, 0.0f), gb(N, 0.0f);
  cpu::matmul_backward(gx.data(), gw.data(), gb.data(), dy.data(), x.data(), w.data(), M, K, N);
  auto dx0 = round_bf16(randn(M * K, float(rms(gx))));
  auto dw0 = randn(N * K, float(rms(gw))), db0 = randn(N, float(rms(gb)));
  Tensor dx = upload(dx0, {M, K}, DType::bf16), dw = upload(dw0, {N, K}, DType::f32), db = upload(db0, {N}, DType::f32);
  cuda_ops::matmul_backward(&dx, &dw, &db, upload(dy, {M, N}, DType::bf16), upload(x, {M, K}, DType::bf16),
                            upload(w, {N, K}, DType::bf16));
  cpu::matmul_backward(dx0.data(), dw0.data(), db0.data(), dy.data(), x.data(), w.data(), M, K, N);
  INFO("M=" << M << " K=" << K << " N=" << N);
  CHECK(rel_err(download(dx), dx0) < 1e-2);
  CHECK(rel_err(download(dw), dw0) < 1e-3);
  CHECK(rel_err(download(db), db0) < 1e-4);
}
}  // namespace

TEST_CASE("matmul backward accumulates dinp - dweight - dbias", "[gpu][matmul]") {
  for (auto [M, K, N] : kShapes) check_backward_accumulates(M, K, N);
}

TEST_CASE("matmul with autotuning - forward and accumulating backward match the CPU", "[gpu][matmul]") {
  // Shapes no other case uses, so their plans are made here with autotuning on: the forward's are timed (writing
  // its output in place), the accumulating backward's keep the first choice and must leave what they add to intact.
  kernels::set_matmul_options(kGpu.index, {.autotune = true});
  const Shape3 shapes[] = {{96, 256, 320}, {2048, 1024, 1536}, {333, 48, 80}};
  for (auto [M, K, N] : shapes) {
    const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), b = round_bf16(randn(N));
    std::vector<float> ref(M * N);
    cpu::matmul_forward(ref.data(), x.data(), w.data(), b.data(), M, K, N);
    Tensor out = poisoned({M, N}, DType::bf16), tb = upload(b, {N}, DType::bf16);
    cuda_ops::matmul_forward(out, upload(x, {M, K}, DType::bf16), upload(w, {N, K}, DType::bf16), &tb);
    INFO("M=" << M << " K=" << K << " N=" << N);
    CHECK(rel_err(download(out), ref) < 1e-2);
    check_backward_accumulates(M, K, N);
  }
  kernels::set_matmul_options(kGpu.index, {.autotune = false});
}

TEST_CASE("matmul with autotuning - a plan made inside a CUDA graph capture keeps the heuristic's choice",
          "[gpu][matmul]") {
  // Timing waits on the host, which a capturing stream forbids: the plan is made without it, and the replayed
  // graph computes the product.
  const int64_t M = 160, K = 224, N = 352;  // a shape no other case uses
  const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), b = round_bf16(randn(N));
  std::vector<float> ref(M * N);
  cpu::matmul_forward(ref.data(), x.data(), w.data(), b.data(), M, K, N);
  Tensor tx = upload(x, {M, K}, DType::bf16), tw = upload(w, {N, K}, DType::bf16), tb = upload(b, {N}, DType::bf16);
  Tensor out = poisoned({M, N}, DType::bf16);
  {  // the GEMM context's start (handle, workspace) outside the capture, as a trainer's warm-up step does
    Tensor o = poisoned({16, 16}, DType::bf16), a = upload(round_bf16(randn(256)), {16, 16}, DType::bf16);
    cuda_ops::matmul_forward(o, a, a, nullptr);
  }
  kernels::set_matmul_options(kGpu.index, {.autotune = true});
  StepGraph graph;
  CHECK_NOTHROW(graph.capture(kGpu, [&] { cuda_ops::matmul_forward(out, tx, tw, &tb); }));
  kernels::set_matmul_options(kGpu.index, {.autotune = false});
  graph.replay();
  CHECK(rel_err(download(out), ref) < 1e-2);
}

namespace {
struct MlpData {
  int64_t M, IC, H, OC;
  std::vector<float> x, w1, b1, w2, b2, dy;
};

// y = gelu_mlp(x, ...) and its gradients [y, dx, dw1, db1, dw2, db2] on `dev` in `dt` (parameter
// gradients in f32, as the trainer binds them); with LinearBias::in_reader y leaves out b2 (db2 is still computed).
std::vector<std::vector<float>> run_gelu_mlp(const MlpData& d, Device dev, DType dt, LinearBias b2_at) {
  const bool gpu = dev.is_cuda();
  auto put = [&](const std::vector<float>& v, Shape s) { return gpu ? upload(v, s, dt) : Tensor::from_vector(v, s); };
  std::vector<Var> vars = {make_var(put(d.x, {d.M, d.IC}), true), make_var(put(d.w1, {d.H, d.IC}), true),
                           make_var(put(d.b1, {d.H}), true), make_var(put(d.w2, {d.OC, d.H}), true),
                           make_var(put(d.b2, {d.OC}), true)};
  if (gpu)
    for (size_t i = 1; i < vars.size(); ++i)
      vars[i]->grad = Tensor::zeros(vars[i]->value.shape(), DType::f32, dev, MemCategory::gradients);
  Tape tape;
  Var y;
  {
    TapeScope scope(&tape);
    y = gelu_mlp(vars[0], vars[1], vars[2], vars[3], vars[4], b2_at);
  }
  grad_of(y).copy_from(put(d.dy, {d.M, d.OC}));
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  std::vector<std::vector<float>> out;
  out.push_back(download(y->value));
  for (const Var& v : vars) {
    REQUIRE(v->grad.defined());
    out.push_back(download(v->grad));
  }
  return out;
}
}  // namespace

TEST_CASE("gelu_mlp on the GPU - fused GELU epilogues - matches the CPU composition", "[gpu][matmul]") {
  for (auto dims : {std::array<int64_t, 4>{64, 64, 256, 64}, std::array<int64_t, 4>{333, 768, 3072, 768}}) {
    MlpData d{dims[0], dims[1], dims[2], dims[3], {}, {}, {}, {}, {}, {}};
    d.x = round_bf16(randn(d.M * d.IC));
    d.w1 = round_bf16(randn(d.H * d.IC, 0.05f));
    d.b1 = round_bf16(randn(d.H, 0.5f));
    d.w2 = round_bf16(randn(d.OC * d.H, 0.05f));
    d.b2 = round_bf16(randn(d.OC, 0.5f));
    d.dy = round_bf16(randn(d.M * d.OC));
    for (const LinearBias at : {LinearBias::in_gemm, LinearBias::in_reader}) {
      const auto gpu = run_gelu_mlp(d, kGpu, DType::bf16, at);
      const auto ref = run_gelu_mlp(d, Device::cpu(), DType::f32, at);
      INFO("M=" << d.M << " IC=" << d.IC << " H=" << d.H << " OC=" << d.OC << " b2 in reader "
                << (at == LinearBias::in_reader));
      const char* names[] = {"y", "dx", "dw1", "db1", "dw2", "db2"};
      for (size_t i = 0; i < gpu.size(); ++i) {
        INFO(names[i]);
        CHECK(rel_err(gpu[i], ref[i]) < 2e-2);
      }
    }
  }
}
