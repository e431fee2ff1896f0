// The fused FP8 linears on the GPU: fp8_linear_gelu and fp8_linear_ln against gelu / layernorm then fp8_linear, bit for
// bit (scalings, storages, steps), and fp8_linear_ln with its input's statistics and codes from the residual add.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <utility>
#include <vector>

#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("fp8 linear: fp8_linear_gelu equals gelu then fp8_linear on the GPU - scalings - storages - steps",
          "[gpu][fp8]") {
  // Separate, identically configured states; two optimizer steps so that delayed scaling runs on
  // scales from the history. Forward bits, pre's and w's gradients and every recorded statistic must
  // be identical; db comes from the dy cast's column-sum atomics, whose f32 order varies run to run,
  // so it is compared within reordered-f32-sum tolerance. M = 272 and H = 208 leave partial tiles.
  const int64_t M = 272, H = 208, OC = 96;
  const auto pre = round_bf16(randn(M * H, 2.0f)), w = round_bf16(randn(OC * H, 0.05f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 1e-3f));
  std::vector<double> dy_sum(OC), dy_abs(OC);
  for (int64_t i = 0; i < M * OC; ++i) {
    dy_sum[i % OC] += dy[i];
    dy_abs[i % OC] += std::fabs(dy[i]);
  }
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::fp8_all, ActivationStorage::bf16}) {
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      // Fused twice: with pre passed as a shared handle (the round trip is written over it, so a later
      // reader sees what gelu(pre, fp8_all) leaves) and moved in as the last handle (nothing can read pre
      // afterwards, so with fp8_all the op does not write the round trip: pre's gradient is read through a
      // GradRef kept before the move). Both must equal the composition.
      enum class Mode { plain, fused, fused_moved };
      Fp8LinearState fused("fused", cfg), moved("moved", cfg), plain("plain", cfg);
      auto run = [&](Fp8LinearState& st, Mode mode) {
        Var pv = make_var(upload(pre, {M / 16, 16, H}, DType::bf16), true);
        const GradRef pg = grad_ref(pv);
        Var wv = make_var(upload(w, {OC, H}, DType::bf16), true), bv = make_var(upload(b, {OC}, DType::bf16), true);
        wv->grad = Tensor::zeros({OC, H}, DType::f32, kGpu, MemCategory::gradients);
        bv->grad = Tensor::zeros({OC}, DType::f32, kGpu, MemCategory::gradients);
        Tape tape;
        Var y;
        {
          TapeScope scope(&tape);
          if (mode == Mode::plain) y = fp8_linear(gelu(pv, storage == ActivationStorage::fp8_all), wv, bv, st);
          else if (mode == Mode::fused) y = fp8_linear_gelu(pv, wv, bv, st);
          else y = fp8_linear_gelu(std::move(pv), wv, bv, st);
        }
        grad_of(y).copy_from(upload(dy, {M / 16, 16, OC}, DType::bf16));
        {
          TapeScope none(nullptr);
          tape.run_backward();
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        LinearResult r{y->value.to_float_vector(), grad_of(pg).to_float_vector(), wv->grad.to_float_vector(),
                       bv->grad.to_float_vector()};
        st.on_optimizer_step();
        return r;
      };
      for (int step = 0; step < 2; ++step) {
        INFO("current scaling " << (scaling == Fp8Scaling::current) << " storage " << static_cast<int>(storage)
                                << " step " << step);
        const LinearResult f = run(fused, Mode::fused), m = run(moved, Mode::fused_moved);
        const LinearResult u = run(plain, Mode::plain);
        for (const LinearResult* r : {&f, &m}) {
          CHECK(r->y == u.y);
          CHECK(r->dx == u.dx);
          CHECK(r->dw == u.dw);
          CHECK(colsum_mismatches(r->db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        }
        CHECK(colsum_mismatches(u.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        for (Fp8LinearState* st : {&fused, &moved})
          for (auto [mf, mu] : {std::pair{&st->input, &plain.input}, std::pair{&st->weight, &plain.weight},
                                std::pair{&st->grad_output, &plain.grad_output}})
            check_same_meta(*mf, *mu);
      }
      CHECK(fused.input.last_amax > 0.0f);
    }
  }
  // Evaluation (no tape): the fused forward casts without a transposed output.
  Fp8LinearState fused("fused", Fp8Config{}), plain("plain", Fp8Config{});
  Var pv = make_var(upload(pre, {M, H}, DType::bf16), false);
  Var wv = make_var(upload(w, {OC, H}, DType::bf16), false), bv = make_var(upload(b, {OC}, DType::bf16), false);
  CHECK(download(fp8_linear_gelu(pv, wv, bv, fused)->value) == download(fp8_linear(gelu(pv), wv, bv, plain)->value));
}

TEST_CASE("fp8 linear: fp8_linear_ln equals layernorm then fp8_linear on the GPU - scalings - storages - steps",
          "[gpu][fp8]") {
  // Separate, identically configured states; two optimizer steps (delayed scaling then runs on scales
  // from the history). The second step starts with an existing x gradient (the residual stream's),
  // which the LayerNorm backward must add to; the first has none (zero-filled). Forward bits, x's and
  // w's gradients and every recorded statistic must be identical; db, d ln_w and d ln_b come from
  // atomics whose f32 order varies run to run, so they are compared within reordered-f32-sum
  // tolerance. M = 272 and C = 208 leave partial tiles.
  const int64_t M = 272, C = 208, OC = 96;
  const auto x = round_bf16(randn(M * C, 2.0f)), w = round_bf16(randn(OC * C, 0.05f));
  const auto lw = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 0.3f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 1e-3f));
  const auto dx_prior = round_bf16(randn(M * C, 1e-3f));
  std::vector<double> dy_sum(OC), dy_abs(OC);
  for (int64_t i = 0; i < M * OC; ++i) {
    dy_sum[i % OC] += dy[i];
    dy_abs[i % OC] += std::fabs(dy[i]);
  }
  struct Result {
    std::vector<float> y, dx, dlw, dlb, dw, db;
  };
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::fp8_all, ActivationStorage::bf16}) {
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      Fp8LinearState fused("fused", cfg), plain("plain", cfg);
      auto run = [&](Fp8LinearState& st, bool fuse, bool prior_dx) {
        Var xv = make_var(upload(x, {M / 16, 16, C}, DType::bf16), true);
        if (prior_dx) xv->grad = upload(dx_prior, {M / 16, 16, C}, DType::bf16);
        Var lwv = make_var(upload(lw, {C}, DType::bf16), true), lbv = make_var(upload(lb, {C}, DType::bf16), true);
        Var wv = make_var(upload(w, {OC, C}, DType::bf16), true), bv = make_var(upload(b, {OC}, DType::bf16), true);
        lwv->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
        lbv->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
        wv->grad = Tensor::zeros({OC, C}, DType::f32, kGpu, MemCategory::gradients);
        bv->grad = Tensor::zeros({OC}, DType::f32, kGpu, MemCategory::gradients);
        Tape tape;
        Var y;
        {
          TapeScope scope(&tape);
          y = fuse ? fp8_linear_ln(xv, lwv, lbv, wv, bv, st) : fp8_linear(layernorm(xv, lwv, lbv), wv, bv, st);
        }
        grad_of(y).copy_from(upload(dy, {M / 16, 16, OC}, DType::bf16));
        {
          TapeScope none(nullptr);
          tape.run_backward();
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        Result r{y->value.to_float_vector(),   grad_of(xv).to_float_vector(), lwv->grad.to_float_vector(),
                 lbv->grad.to_float_vector(),  wv->grad.to_float_vector(),    bv->grad.to_float_vector()};
        st.on_optimizer_step();
        return r;
      };
      for (int step = 0; step < 2; ++step) {
        INFO("current scaling " << (scaling == Fp8Scaling::current) << " storage " << static_cast<int>(storage)
                                << " step " << step);
        const Result f = run(fused, true, step == 1), u = run(plain, false, step == 1);
        CHECK(f.y == u.y);
        CHECK(f.dx == u.dx);
        CHECK(f.dw == u.dw);
        CHECK(reordered_mismatches(f.dlw, u.dlw) == 0);
        CHECK(reordered_mismatches(f.dlb, u.dlb) == 0);
        CHECK(rms(f.dlw) > 0.0);
        CHECK(colsum_mismatches(f.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        CHECK(colsum_mismatches(u.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        for (auto [mf, mu] : {std::pair{&fused.input, &plain.input}, std::pair{&fused.weight, &plain.weight},
                              std::pair{&fused.grad_output, &plain.grad_output}})
          check_same_meta(*mf, *mu);
      }
      CHECK(fused.input.last_amax > 0.0f);
    }
  }
  // Only the LayerNorm weight needs a gradient (x and the linear frozen): the backward still runs
  // the LayerNorm backward, with a throwaway x gradient, and d ln_w matches the composition.
  {
    Fp8LinearState fused("fused", Fp8Config{}), plain("plain", Fp8Config{});
    auto run = [&](Fp8LinearState& st, bool fuse) {
      Var xv = make_var(upload(x, {M, C}, DType::bf16), false);
      Var lwv = make_var(upload(lw, {C}, DType::bf16), true), lbv = make_var(upload(lb, {C}, DType::bf16), false);
      Var wv = make_var(upload(w, {OC, C}, DType::bf16), false), bv = make_var(upload(b, {OC}, DType::bf16), false);
      lwv->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
      Tape tape;
      Var y;
      {
        TapeScope scope(&tape);
        y = fuse ? fp8_linear_ln(xv, lwv, lbv, wv, bv, st) : fp8_linear(layernorm(xv, lwv, lbv), wv, bv, st);
      }
      grad_of(y).copy_from(upload(dy, {M, OC}, DType::bf16));
      {
        TapeScope none(nullptr);
        tape.run_backward();
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(!xv->grad.defined());
      return lwv->grad.to_float_vector();
    };
    const auto f = run(fused, true), u = run(plain, false);
    CHECK(reordered_mismatches(f, u) == 0);
    CHECK(rms(f) > 0.0);
  }
  // Evaluation (no tape): the fused forward casts without a transposed output.
  Fp8LinearState fused("fused", Fp8Config{}), plain("plain", Fp8Config{});
  Var xv = make_var(upload(x, {M, C}, DType::bf16), false);
  Var lwv = make_var(upload(lw, {C}, DType::bf16), false), lbv = make_var(upload(lb, {C}, DType::bf16), false);
  Var wv = make_var(upload(w, {OC, C}, DType::bf16), false), bv = make_var(upload(b, {OC}, DType::bf16), false);
  CHECK(download(fp8_linear_ln(xv, lwv, lbv, wv, bv, fused)->value) ==
        download(fp8_linear(layernorm(xv, lwv, lbv), wv, bv, plain)->value));
}

TEST_CASE("fp8 linear: fp8_linear_ln with its input's statistics (and codes) from the residual add - scalings - "
          "storages",
          "[gpu][fp8]") {
  // x = add(a, b) then fp8_linear_ln(x): with the statistics that add computes in its pass, with those and the
  // input codes the add casts ahead where fp8_ln_cast_ahead applies (delayed scaling, fp8_all), and without either
  // (the linear's own statistics pass and cast). Separate, identically configured states, two steps. Forward bits,
  // a's, b's and w's gradients must be identical; d ln_w, d ln_b and db come from atomics, compared within
  // reordered-f32-sum tolerance. M = 272 and C = 208 leave partial tiles.
  const int64_t M = 272, C = 208, OC = 96;
  const auto a = round_bf16(randn(M * C, 2.0f)), b = round_bf16(randn(M * C, 0.5f));
  const auto w = round_bf16(randn(OC * C, 0.05f)), bias = round_bf16(randn(OC, 0.1f));
  const auto lw = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 0.3f)), dy = round_bf16(randn(M * OC, 1e-3f));
  struct Result {
    std::vector<float> y, da, db_in, dlw, dlb, dw, dbias;
    bool stats_given = false, ahead_made = false, codes_taken = false;
  };
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::fp8_all}) {
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      Fp8LinearState with("with", cfg), without("without", cfg), ahead("ahead", cfg);
      auto run = [&](Fp8LinearState& st, bool use_stats, bool cast_ahead) {
        Var av = make_var(upload(a, {M / 16, 16, C}, DType::bf16), true);
        Var bv = make_var(upload(b, {M / 16, 16, C}, DType::bf16), true);
        Var lwv = make_var(upload(lw, {C}, DType::bf16), true), lbv = make_var(upload(lb, {C}, DType::bf16), true);
        Var wv = make_var(upload(w, {OC, C}, DType::bf16), true);
        Var biasv = make_var(upload(bias, {OC}, DType::bf16), true);
        for (const Var* v : {&lwv, &lbv, &wv, &biasv})
          (*v)->grad = Tensor::zeros((*v)->value.shape(), DType::f32, kGpu, MemCategory::gradients);
        Tape tape;
        Var y;
        RowStats stats;
        if (cast_ahead) stats.cast_ahead = fp8_ln_cast_ahead(st, lwv, lbv);
        const bool ahead_made = stats.cast_ahead != nullptr;
        {
          TapeScope scope(&tape);
          const Var x = add(av, bv, use_stats ? &stats : nullptr);
          y = fp8_linear_ln(x, lwv, lbv, wv, biasv, st, use_stats ? &stats : nullptr);
        }
        grad_of(y).copy_from(upload(dy, {M / 16, 16, OC}, DType::bf16));
        {
          TapeScope none(nullptr);
          tape.run_backward();
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        Result r{y->value.to_float_vector(),  grad_of(av).to_float_vector(), grad_of(bv).to_float_vector(),
                 lwv->grad.to_float_vector(), lbv->grad.to_float_vector(),   wv->grad.to_float_vector(),
                 biasv->grad.to_float_vector(), stats.defined(), ahead_made,
                 stats.cast_ahead && !stats.cast_ahead->codes.defined()};
        st.on_optimizer_step();
        return r;
      };
      for (int step = 0; step < 2; ++step) {
        INFO("current scaling " << (scaling == Fp8Scaling::current) << " storage " << static_cast<int>(storage)
                                << " step " << step);
        const Result f = run(with, true, false), u = run(without, false, false), h = run(ahead, true, true);
        CHECK(f.stats_given);
        CHECK(h.stats_given);
        const bool applies = scaling == Fp8Scaling::delayed && storage == ActivationStorage::fp8_all;
        CHECK(h.ahead_made == applies);
        CHECK(h.codes_taken == applies);  // the add cast them and the linear took them
        CHECK(h.y == u.y);
        CHECK(h.da == u.da);
        CHECK(h.db_in == u.db_in);
        CHECK(h.dw == u.dw);
        CHECK(reordered_mismatches(h.dlw, u.dlw) == 0);
        CHECK(reordered_mismatches(h.dlb, u.dlb) == 0);
        CHECK(reordered_mismatches(h.dbias, u.dbias) == 0);
        check_same_meta(ahead.input, without.input);
        check_same_meta(ahead.grad_output, without.grad_output);
        CHECK(f.y == u.y);
        CHECK(f.da == u.da);
        CHECK(f.db_in == u.db_in);
        CHECK(f.dw == u.dw);
        CHECK(reordered_mismatches(f.dlw, u.dlw) == 0);
        CHECK(reordered_mismatches(f.dlb, u.dlb) == 0);
        CHECK(reordered_mismatches(f.dbias, u.dbias) == 0);
        for (auto [mf, mu] :
             {std::pair{&with.input, &without.input}, std::pair{&with.grad_output, &without.grad_output}})
          check_same_meta(*mf, *mu);
      }
    }
  }
  // Evaluation (no tape): the add casts ahead with no statistics recorded, and the linear takes its codes.
  Fp8Config cfg;
  cfg.scaling = Fp8Scaling::delayed;
  cfg.activation_storage = ActivationStorage::fp8_all;
  Fp8LinearState e_ahead("e_ahead", cfg), e_plain("e_plain", cfg);
  const Var av = make_var(upload(a, {M, C}, DType::bf16), false), bv = make_var(upload(b, {M, C}, DType::bf16), false);
  const Var lwv = make_var(upload(lw, {C}, DType::bf16), false), lbv = make_var(upload(lb, {C}, DType::bf16), false);
  const Var wv = make_var(upload(w, {OC, C}, DType::bf16), false);
  const Var biasv = make_var(upload(bias, {OC}, DType::bf16), false);
  RowStats stats;
  stats.cast_ahead = fp8_ln_cast_ahead(e_ahead, lwv, lbv);
  REQUIRE(stats.cast_ahead);
  const Var y_ahead = fp8_linear_ln(add(av, bv, &stats), lwv, lbv, wv, biasv, e_ahead, &stats);
  CHECK_FALSE(stats.cast_ahead->codes.defined());
  CHECK(download(y_ahead->value) == download(fp8_linear_ln(add(av, bv), lwv, lbv, wv, biasv, e_plain)->value));
}
