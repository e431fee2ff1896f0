// The LayerNorm backward writing the residual sum's gradient as the E5M2 dy codes of the FP8 linear whose output went
// into that sum (kernels::LayerNormDyCodes, autograd's GradCell::residual_b): the codes, statistics and column sums the
// bf16 gradient and the linear's own cast give, and that linear's gradients unchanged.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "autograd/tape.h"
#include "fp8/device_meta.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"
#include "util/layernorm_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

using bf16 = __nv_bfloat16;

// One LayerNorm backward over random (N, C) rows into a random dinp (it accumulates), twice: plainly, then the
// reference cast of the new dinp to E5M2; and with dy codes (into poisoned codes; `want_codes_t`: whether it asks for
// the transposed codes too, which otherwise must stay poisoned). dy_scale = fmax / amax * headroom.
void check_dy_codes(int64_t N, int C, float headroom, bool want_codes_t = true) {
  INFO("N=" << N << " C=" << C << ", headroom " << headroom << ", codes_t " << want_codes_t);
  REQUIRE(kernels::layernorm_backward_writes_dy_codes(N, C));
  const LayerNormBackwardCase l = make_layernorm_case(N, C);
  const LayerNormBackwardCase::Result plain = l.run(nullptr);
  const Tensor& dinp = plain.dinp;
  const std::vector<float> g = download(dinp);
  float amax = 0.0f;
  for (float v : g) amax = std::max(amax, std::fabs(v));
  REQUIRE(std::isfinite(amax));
  REQUIRE(amax > 0.0f);
  const Tensor scale = upload({57344.0f / amax * headroom}, {1}, DType::f32);
  // The reference: the plain cast of the bf16 gradient, statistics and column sums from zero.
  Tensor codes = poisoned({N, C}, DType::e5m2), codes_t = poisoned({C, N}, DType::e5m2);
  Tensor stats = Tensor::zeros({kernels::cast_stats_floats(C)}, DType::f32, kGpu);
  float* s = stats.data<float>();
  const int64_t a = kernels::cast_stats_amax_index(C);
  kernels::fp8_cast(dinp.raw(), DType::bf16, N, C, codes.data<uint8_t>(), codes_t.data<uint8_t>(), Fp8Format::e5m2,
                    scale.data<float>(), {s + a, reinterpret_cast<unsigned long long*>(s + a + 2), s},
                    kernels::compute_stream());

  // The codes path, into codes poisoned with 0x7F (E5M2 NaN, which no finite gradient gives).
  Tensor got_codes = Tensor::empty({N, C}, DType::e5m2, kGpu), got_codes_t = Tensor::empty({C, N}, DType::e5m2, kGpu);
  CUDA_CHECK(cudaMemset(got_codes.raw(), 0x7F, got_codes.nbytes()));
  CUDA_CHECK(cudaMemset(got_codes_t.raw(), 0x7F, got_codes_t.nbytes()));
  Tensor got_stats = Tensor::zeros({kernels::cast_stats_floats(C)}, DType::f32, kGpu);
  float* gs = got_stats.data<float>();
  const kernels::LayerNormDyCodes dy{.codes = got_codes.data<uint8_t>(),
                                     .codes_t = want_codes_t ? got_codes_t.data<uint8_t>() : nullptr,
                                     .scale = scale.data<float>(),
                                     .stats = {gs + a, reinterpret_cast<unsigned long long*>(gs + a + 2), gs}};
  const LayerNormBackwardCase::Result fused = l.run(&dy);
  CHECK(download(fused.dinp) == g);  // dinp bit for bit
  CHECK(reordered_mismatches(download(fused.dw), download(plain.dw)) == 0);  // other block counts: another order
  CHECK(reordered_mismatches(download(fused.db), download(plain.db)) == 0);
  const auto poisoned_bytes = [](const std::vector<uint8_t>& b) {
    return std::count(b.begin(), b.end(), uint8_t{0x7F}) == static_cast<std::ptrdiff_t>(b.size());
  };
  CHECK(code_mismatches_but_zero_sign(download_bytes(got_codes), download_bytes(codes)) == 0);
  if (want_codes_t) CHECK(code_mismatches_but_zero_sign(download_bytes(got_codes_t), download_bytes(codes_t)) == 0);
  else CHECK(poisoned_bytes(download_bytes(got_codes_t)));

  const std::vector<float> got = download(got_stats), want = download(stats);
  check_same_kept_stats(got, want, a);
  if (headroom > 1.0f) CHECK(kept_saturated(want, a) > 0);
  std::vector<double> sum, abs_sum;
  column_sums(g, C, sum, abs_sum);
  CHECK(colsum_mismatches(std::vector<float>(got.begin(), got.begin() + C), sum, abs_sum) == 0);
}

}  // namespace

TEST_CASE("layernorm backward writes the new input gradient as the E5M2 codes the cast gives",
          "[gpu][layernorm][fp8]") {
  // C: one partial 256-column chunk, GPT-2 124M's and 1.5B's widths (3 and 7 chunks, the last partial), the widest
  // one-pass kernel; N: one row group, a partial one, and many more than one wave of blocks.
  for (auto [N, C] : {std::tuple{8, 200}, std::tuple{12, 768}, std::tuple{64, 768}, std::tuple{4096, 1600},
                      std::tuple{40, 4096}})
    check_dy_codes(N, C, 0.5f);
  check_dy_codes(256, 1600, 8.0f);  // a scale that saturates: the counts agree too
  check_dy_codes(64, 768, 0.5f, false);  // row-major codes only (a frozen weight: no wgrad)
  CHECK_FALSE(kernels::layernorm_backward_writes_dy_codes(64, 8192));  // the two-kernel backward
  CHECK_FALSE(kernels::layernorm_backward_writes_dy_codes(64, 100));   // rows not 16-byte vectors
}

namespace {

struct StepResult {
  std::vector<float> dx, dh, dw, db, dlw, dlb;
  Fp8DeviceSlot dy_slot;
  bool codes_left = false, codes_t_left = false;  // proj's gradient was left as codes when its backward came
};

// y = fc(ln(x + proj(h))) with FP8 linears proj (C -> C) and fc (LayerNorm prologue, C -> 4C), two steps (the second
// with delayed scales from the first). `fused`: proj asks for its dy as codes and fc's LayerNorm backward writes them;
// else the request is withdrawn and proj casts its dy itself. `h_grad` false: proj's input needs no gradient, so proj
// asks for the transposed codes only (wgrad's).
std::vector<StepResult> run_residual(int64_t M, int C, ActivationStorage storage, bool fused, bool h_grad = true) {
  Fp8Config cfg;
  cfg.activation_storage = storage;
  Fp8LinearState proj_st("h.0.attn.c_proj", cfg), fc_st("h.0.mlp.c_fc", cfg);
  std::mt19937_64 gen(7);  // the same inputs for both runs
  rng() = gen;
  const Var pw = bf16_param(randn(int64_t{C} * C, 0.05f), {C, C}), pb = bf16_param(randn(C, 0.1f), {C});
  const Var fw = bf16_param(randn(int64_t{4} * C * C, 0.05f), {4 * C, C}), fb = bf16_param(randn(4 * C, 0.1f), {4 * C});
  const Var lw = bf16_param(randn(C, 0.2f), {C}), lb = bf16_param(randn(C, 0.1f), {C});
  std::vector<StepResult> steps;
  for (int step = 0; step < 2; ++step) {
    Var x = make_var(upload(round_bf16(randn(M * C)), {M, C}, DType::bf16), true);
    Var h = make_var(upload(round_bf16(randn(M * C)), {M, C}, DType::bf16), h_grad);
    const Tensor dout = upload(round_bf16(randn(M * 4 * C, 1e-2f)), {M, 4 * C}, DType::bf16);
    for (const Var& p : {pw, pb, fw, fb, lw, lb}) p->grad.zero_();
    Tape tape;
    Var out, hp;
    {
      TapeScope scope(&tape);
      hp = fp8_linear(h, pw, pb, proj_st);
      REQUIRE(hp->grad_cell->fp8_dy);  // delayed scaling, E5M2 gradients: the linear asks
      if (!fused) hp->grad_cell->fp8_dy.reset();
      const Var x1 = add(x, hp);
      out = fp8_linear_ln(x1, lw, lb, fw, fb, fc_st);
    }
    grad_of(out).copy_from(dout);
    StepResult r;
    // The node before proj's (the add's, nodes_left 1) has run: what proj's backward finds in its output's cell.
    tape.set_progress_hook([&r, cell = hp->grad_cell](size_t left) {
      if (left != 1) return;
      r.codes_left = cell->pending.dy_codes.defined();
      r.codes_t_left = cell->pending.dy_codes_t.defined();
    });
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    r.dx = download(grad_of(x));
    if (h_grad) r.dh = download(grad_of(h));
    r.dw = download(pw->grad);
    r.db = download(pb->grad);
    r.dlw = download(lw->grad);
    r.dlb = download(lb->grad);
    const Fp8DeviceSlot* slots = proj_st.device.slots(kGpu, proj_st.metas());
    CUDA_CHECK(cudaMemcpy(&r.dy_slot, slots + static_cast<int>(Fp8Role::grad_output),
                          sizeof(Fp8DeviceSlot), cudaMemcpyDeviceToHost));
    steps.push_back(std::move(r));
    proj_st.on_optimizer_step();
    fc_st.on_optimizer_step();
  }
  return steps;
}

}  // namespace

TEST_CASE("layernorm backward's dy codes: the FP8 proj linear's gradients as with its own cast - storages",
          "[gpu][layernorm][fp8]") {
  for (auto storage : {ActivationStorage::bf16, ActivationStorage::fp8, ActivationStorage::fp8_all})
    for (auto [M, C] : {std::tuple{int64_t{64}, 128}, std::tuple{int64_t{160}, 320}}) {
      INFO("M=" << M << " C=" << C << " storage " << static_cast<int>(storage));
      const auto fused = run_residual(M, C, storage, true);
      const auto cast = run_residual(M, C, storage, false);
      for (size_t step = 0; step < fused.size(); ++step) {
        INFO("step " << step);
        CHECK((fused[step].codes_left && fused[step].codes_t_left));  // the LayerNorm backward wrote them
        CHECK_FALSE((cast[step].codes_left || cast[step].codes_t_left));
        CHECK(fused[step].dx == cast[step].dx);  // the residual gradient as before
        CHECK(fused[step].dh == cast[step].dh);  // dgrad and wgrad read the same codes: bit for bit
        CHECK(fused[step].dw == cast[step].dw);
        CHECK(reordered_mismatches(fused[step].db, cast[step].db) == 0);  // column sums in another order
        CHECK(reordered_mismatches(fused[step].dlw, cast[step].dlw) == 0);
        CHECK(reordered_mismatches(fused[step].dlb, cast[step].dlb) == 0);
        CHECK(fused[step].dy_slot.amax == cast[step].dy_slot.amax);
        CHECK(fused[step].dy_slot.saturated == cast[step].dy_slot.saturated);
        CHECK(fused[step].dy_slot.scale == cast[step].dy_slot.scale);
      }
    }
}

TEST_CASE("layernorm backward's dy codes: transposed codes only where proj's input needs no gradient",
          "[gpu][layernorm][fp8]") {
  for (auto storage : {ActivationStorage::fp8, ActivationStorage::fp8_all}) {
    INFO("storage " << static_cast<int>(storage));
    const auto fused = run_residual(160, 320, storage, true, false);
    const auto cast = run_residual(160, 320, storage, false, false);
    for (size_t step = 0; step < fused.size(); ++step) {
      INFO("step " << step);
      CHECK(fused[step].codes_t_left);  // wgrad's codes, made from a scratch of row-major codes
      CHECK_FALSE(fused[step].codes_left);
      CHECK(fused[step].dx == cast[step].dx);
      CHECK(fused[step].dw == cast[step].dw);
      CHECK(reordered_mismatches(fused[step].db, cast[step].db) == 0);
      CHECK(fused[step].dy_slot.amax == cast[step].dy_slot.amax);
      CHECK(fused[step].dy_slot.scale == cast[step].dy_slot.scale);
    }
  }
}
