// The attention backward summing the columns of qkv's gradient as it writes it, for the BF16 linear that made qkv
// (AttentionDyCodes without codes, GradCell::dy_colsum): the gradient as the plain backward writes it, the sums that
// gradient gives, and that linear's gradients as with its own column sums.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "autograd/tape.h"
#include "ops/attention_cuda.h"
#include "ops/ops.h"
#include "util/attention_test_util.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

bool writes_sums() { return cuda_ops::attention_writes_dy_codes({1, 1, 3 * 64}, 1); }

// One backward of attention over random qkv (B, T, 3C) in each of its forms, into a NaN-poisoned dqkv plainly and
// with the column sums (into a poisoned dqkv and NaN sums: the launcher zeroes them): dqkv bit for bit, the sums within
// reordered f32 additions of the double column sums of the plain gradient.
void check_colsum(int B, int T, int NH, bool qkv_codes, bool out_codes) {
  INFO("B=" << B << " T=" << T << " NH=" << NH << (qkv_codes ? ", qkv as codes" : ", qkv bf16")
            << (out_codes ? ", O as codes" : ", O bf16"));
  const AttentionBackwardCase a = make_attention_case(B, T, NH, qkv_codes, out_codes);
  const std::vector<float> g = a.plain_dqkv();
  Tensor dqkv = poisoned({B, T, 3 * a.C}, DType::bf16), sums = poisoned({3 * a.C}, DType::f32);
  cuda_ops::attention_backward_colsum(dqkv, sums, a.dout, a.forms(), a.lse, NH);
  CHECK(download(dqkv) == g);
  std::vector<double> sum, abs_sum;
  column_sums(g, 3 * a.C, sum, abs_sum);
  CHECK(colsum_mismatches(download(sums), sum, abs_sum) == 0);
}

}  // namespace

TEST_CASE("attention backward sums qkv's gradient's columns for a BF16 linear's bias", "[gpu][attention]") {
  if (!writes_sums()) SKIP("column sums need the warpgroup-MMA kernels (head size 64 on a Hopper, sm_90a build)");
  // T ragged against the 64-row tiles and the 128-key blocks, and (333) not a multiple of 16.
  for (auto [B, T, NH] : {std::tuple{2, 8, 3}, std::tuple{3, 80, 3}, std::tuple{1, 333, 5}, std::tuple{2, 1024, 2}})
    for (bool qkv_codes : {false, true})
      for (bool out_codes : {false, true}) {
        if (out_codes && int64_t(B) * T % 16 != 0) continue;  // O's transposed codes need B * T a multiple of 16
        check_colsum(B, T, NH, qkv_codes, out_codes);
      }
}

namespace {

struct StepResult {
  std::vector<float> dx, dw, db;
  bool sums_left = false;  // the attention backward's column sums were in qkv's cell when the linear's backward came
};

// x (B, T, IC) -> BF16 linear (qkv, bias in the GEMM) -> attention -> dout; `fused`: the linear asks for its dy's
// column sums and the attention backward writes them, else the request is withdrawn and the linear sums dy itself.
StepResult run_block(int B, int T, int NH, int IC, bool fused) {
  const int C = NH * 64;
  std::mt19937_64 gen(5);  // the same inputs for both runs
  rng() = gen;
  Var x = make_var(upload(round_bf16(randn(int64_t{B} * T * IC)), {B, T, IC}, DType::bf16), true);
  Var w = make_var(upload(round_bf16(randn(int64_t{3} * C * IC, 0.05f)), {3 * C, IC}, DType::bf16), true);
  Var b = make_var(upload(round_bf16(randn(3 * C, 0.1f)), {3 * C}, DType::bf16), true);
  w->grad = Tensor::zeros({3 * C, IC}, DType::f32, kGpu, MemCategory::gradients);
  b->grad = Tensor::zeros({3 * C}, DType::f32, kGpu, MemCategory::gradients);
  const Tensor dout = upload(round_bf16(randn(int64_t{B} * T * C)), {B, T, C}, DType::bf16);
  Tape tape;
  Var qkv, y;
  {
    TapeScope scope(&tape);
    qkv = linear(x, w, b);
    REQUIRE(qkv->grad_cell->dy_colsum_request);
    if (!fused) qkv->grad_cell->dy_colsum_request = false;
    y = attention(qkv, NH, false);
  }
  grad_of(y).copy_from(dout);
  StepResult r;
  // The attention's node has run (nodes_left 1): what the linear's backward finds in qkv's cell.
  tape.set_progress_hook([&r, cell = qkv->grad_cell](size_t left) {
    if (left == 1) r.sums_left = cell->dy_colsum.defined();
  });
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  r.dx = download(grad_of(x));
  r.dw = download(w->grad);
  r.db = download(b->grad);
  CHECK_FALSE(qkv->grad_cell->dy_colsum.defined());  // handed over, not left behind
  return r;
}

}  // namespace

TEST_CASE("attention backward's column sums: the BF16 qkv linear's gradients as with its own", "[gpu][attention]") {
  if (!writes_sums()) SKIP("column sums need the warpgroup-MMA kernels (head size 64 on a Hopper, sm_90a build)");
  for (auto [B, T, NH, IC] : {std::tuple{2, 80, 2, 64}, std::tuple{1, 256, 3, 192}}) {
    INFO("B=" << B << " T=" << T << " NH=" << NH << " IC=" << IC);
    const StepResult fused = run_block(B, T, NH, IC, true), own = run_block(B, T, NH, IC, false);
    CHECK(fused.sums_left);  // the attention backward wrote them
    CHECK_FALSE(own.sums_left);
    CHECK(fused.dx == own.dx);  // the same dqkv into the same GEMMs
    CHECK(fused.dw == own.dw);
    CHECK(reordered_mismatches(fused.db, own.db) == 0);  // column sums in another order
  }
}
