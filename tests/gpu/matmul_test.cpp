// cuBLASLt GEMMs against a CPU GEMM on the same bf16-rounded inputs, forward and all three gradients.
#include <catch2/catch_test_macros.hpp>

#include "gpu_test_util.h"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/cpu/reference.h"
#include "ops/cuda_ops.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {
struct Shape3 { int64_t M, K, N; };
const Shape3 kShapes[] = {{1, 16, 8}, {77, 64, 96}, {128, 768, 2304}, {1000, 200, 50}, {4096, 768, 3072}};
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

TEST_CASE("matmul GELU + bias epilogue", "[gpu][matmul]") {
  const int64_t M = 256, K = 768, N = 3072;
  const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), b = round_bf16(randn(N));
  std::vector<float> pre(M * N), ref(M * N);
  cpu::matmul_forward(pre.data(), x.data(), w.data(), b.data(), M, K, N);
  cpu::gelu_forward(ref.data(), pre.data(), M * N);
  Tensor tx = upload(x, {M, K}, DType::bf16), tw = upload(w, {N, K}, DType::bf16), tb = upload(b, {N}, DType::bf16);
  Tensor out = poisoned({M, N}, DType::bf16), aux = poisoned({M, N}, DType::bf16);
  kernels::matmul_cublaslt(out.raw(), DType::bf16, {tw.raw(), DType::bf16}, true, {tx.raw(), DType::bf16}, false, N, M,
                           K, 1.0f, 0.0f, kernels::MatmulEpilogue::gelu_aux_bias, tb.raw(), aux.raw(),
                           kernels::compute_stream());
  CHECK(rel_err(download(out), ref) < 1e-2);
  CHECK(rel_err(download(aux), pre) < 1e-2);
}

TEST_CASE("matmul backward accumulates dinp - dweight - dbias", "[gpu][matmul]") {
  for (auto [M, K, N] : kShapes) {
    const auto x = round_bf16(randn(M * K)), w = round_bf16(randn(N * K, 0.05f)), dy = round_bf16(randn(M * N));
    std::vector<float> gx(M * K, 0.0f), gw(N * K, 0.0f), gb(N, 0.0f);
    cpu::matmul_backward(gx.data(), gw.data(), gb.data(), dy.data(), x.data(), w.data(), M, K, N);
    auto dx0 = round_bf16(randn(M * K, float(rms(gx)))), dw0 = randn(N * K, float(rms(gw))), db0 = randn(N, float(rms(gb)));
    Tensor dx = upload(dx0, {M, K}, DType::bf16), dw = upload(dw0, {N, K}, DType::f32), db = upload(db0, {N}, DType::f32);
    cuda_ops::matmul_backward(&dx, &dw, &db, upload(dy, {M, N}, DType::bf16), upload(x, {M, K}, DType::bf16),
                              upload(w, {N, K}, DType::bf16));
    cpu::matmul_backward(dx0.data(), dw0.data(), db0.data(), dy.data(), x.data(), w.data(), M, K, N);
    INFO("M=" << M << " K=" << K << " N=" << N);
    CHECK(rel_err(download(dx), dx0) < 1e-2);
    CHECK(rel_err(download(dw), dw0) < 1e-3);
    CHECK(rel_err(download(db), db0) < 1e-4);
  }
}
