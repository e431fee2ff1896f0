// The LayerNorm backward summing the columns of the residual sum's gradient for the BF16 linear whose output went into
// that sum (kernels::LayerNormDyCodes with codes null, autograd's GradCell::dy_colsum): the sums the bf16 gradient
// gives, and that linear's gradients as with its own column sums.
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "autograd/tape.h"
#include "kernels/layernorm.cuh"
#include "ops/ops.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"
#include "util/layernorm_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

using bf16 = __nv_bfloat16;

// One LayerNorm backward over random (N, C) rows into a random dinp (it accumulates), plainly and with dinp's column
// sums asked for (into a zeroed sum, as the op's launcher gives it): dinp bit for bit, dw and db up to the order of
// their f32 additions, and the sums those of the plain backward's new dinp.
void check_colsum(int64_t N, int C) {
  INFO("N=" << N << " C=" << C);
  const LayerNormBackwardCase l = make_layernorm_case(N, C);
  const LayerNormBackwardCase::Result plain = l.run(nullptr);
  const std::vector<float> g = download(plain.dinp);
  Tensor sums = Tensor::zeros({C}, DType::f32, kGpu);
  const kernels::LayerNormDyCodes dy{.stats = {.colsum = sums.data<float>()}};
  const LayerNormBackwardCase::Result fused = l.run(&dy);
  CHECK(download(fused.dinp) == g);
  CHECK(reordered_mismatches(download(fused.dw), download(plain.dw)) == 0);
  CHECK(reordered_mismatches(download(fused.db), download(plain.db)) == 0);
  std::vector<double> sum, abs_sum;
  column_sums(g, C, sum, abs_sum);
  CHECK(colsum_mismatches(download(sums), sum, abs_sum) == 0);
}

}  // namespace

TEST_CASE("layernorm backward sums the new input gradient's columns for a BF16 linear's bias", "[gpu][layernorm]") {
  // C: one partial 256-column chunk, GPT-2 124M's and 1.5B's widths, the widest one-pass kernel; N: one row group, a
  // partial one, and more than one wave of blocks.
  for (auto [N, C] : {std::tuple{8, 200}, std::tuple{12, 768}, std::tuple{64, 768}, std::tuple{4096, 1600},
                      std::tuple{40, 4096}})
    check_colsum(N, C);
}

namespace {

struct StepResult {
  std::vector<float> dx, dh, dw, db, dw1, db1, dlw, dlb, dfw, dfb;
  bool sums_left = false;  // the LayerNorm backward's column sums were in proj's cell when its backward came
};

// y = fc(ln(x + (proj(h) + pb))) in BF16 on CUDA, GPT::block's residual: proj a linear (C -> C) or, with `mlp`, a
// gelu_mlp (C -> 4C -> C) whose second bias is pb, the bias left to the add (LinearBias::in_reader), and the add
// writing ln's output in its pass (RowStats::norm_w). `fused`: proj asks for its dy's column sums and ln's backward
// writes them; else the request is withdrawn before the add and proj sums dy's columns itself.
StepResult run_residual(int64_t M, int C, bool mlp, bool fused) {
  std::mt19937_64 gen(11);  // the same inputs for both runs
  rng() = gen;
  const int64_t H = mlp ? 4 * C : C;
  const Var w1 = bf16_param(randn(H * C, 0.05f), {H, C}), b1 = bf16_param(randn(H, 0.1f), {H});
  const Var pw = bf16_param(randn(int64_t{C} * H, 0.05f), {C, H}), pb = bf16_param(randn(C, 0.1f), {C});
  const Var fw = bf16_param(randn(int64_t{4} * C * C, 0.05f), {4 * C, C}), fb = bf16_param(randn(4 * C, 0.1f), {4 * C});
  const Var lw = bf16_param(randn(C, 0.2f), {C}), lb = bf16_param(randn(C, 0.1f), {C});
  const Var x = make_var(upload(round_bf16(randn(M * C)), {M, C}, DType::bf16), true);
  const Var h = make_var(upload(round_bf16(randn(M * C)), {M, C}, DType::bf16), true);
  const Tensor dout = upload(round_bf16(randn(M * 4 * C, 1e-2f)), {M, 4 * C}, DType::bf16);
  Tape tape;
  Var out, hp;
  {
    TapeScope scope(&tape);
    hp = mlp ? gelu_mlp(h, w1, b1, pw, pb, LinearBias::in_reader) : linear(h, pw, pb, LinearBias::in_reader);
    REQUIRE(hp->grad_cell->dy_colsum_request);
    if (!fused) hp->grad_cell->dy_colsum_request = false;
    RowStats stats;
    stats.norm_w = lw;
    stats.norm_b = lb;
    const Var x1 = add(x, hp, &stats, pb);
    REQUIRE(stats.normed);
    out = linear(stats.normed, fw, fb);
  }
  grad_of(out).copy_from(dout);
  StepResult r;
  // The node before proj's (the add's, nodes_left 1) has run: what proj's backward finds in its output's cell.
  tape.set_progress_hook([&r, cell = hp->grad_cell](size_t left) {
    if (left == 1) r.sums_left = cell->dy_colsum.defined();
  });
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  r.dx = download(grad_of(x));
  r.dh = download(grad_of(h));
  r.dw = download(pw->grad);
  r.db = download(pb->grad);
  if (mlp) {
    r.dw1 = download(w1->grad);
    r.db1 = download(b1->grad);
  }
  r.dlw = download(lw->grad);
  r.dlb = download(lb->grad);
  r.dfw = download(fw->grad);
  r.dfb = download(fb->grad);
  CHECK(hp->grad_cell->dy_colsum.defined() == false);  // handed over, not left behind
  return r;
}

}  // namespace

TEST_CASE("layernorm backward's column sums: the BF16 proj's and gelu_mlp's gradients as with their own",
          "[gpu][layernorm][matmul]") {
  for (bool mlp : {false, true})
    for (auto [M, C] : {std::tuple{int64_t{64}, 128}, std::tuple{int64_t{160}, 320}}) {
      INFO("M=" << M << " C=" << C << (mlp ? " gelu_mlp" : " linear"));
      const StepResult fused = run_residual(M, C, mlp, true), own = run_residual(M, C, mlp, false);
      CHECK(fused.sums_left);  // the LayerNorm backward wrote them
      CHECK_FALSE(own.sums_left);
      CHECK(fused.dx == own.dx);  // the residual gradient as before
      CHECK(fused.dh == own.dh);  // the same dy into the same GEMMs
      CHECK(fused.dw == own.dw);
      CHECK(fused.dw1 == own.dw1);
      CHECK(fused.dfw == own.dfw);
      CHECK(reordered_mismatches(fused.db, own.db) == 0);  // column sums in another order
      CHECK(reordered_mismatches(fused.db1, own.db1) == 0);
      CHECK(reordered_mismatches(fused.dfb, own.dfb) == 0);
      CHECK(reordered_mismatches(fused.dlw, own.dlw) == 0);
      CHECK(reordered_mismatches(fused.dlb, own.dlb) == 0);
    }
}
