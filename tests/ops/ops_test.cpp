// Ops on the CPU: embedding, linear, layernorm, gelu and add gradients against central finite
// differences in f64 through the real tape and f32 against f64, accumulation, no-grad, recompute, the
// packed matmul against a triple loop, argument errors, utilities and run-to-run reproducibility.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "ops/cpu/linear.h"
#include "tests/ops/gradcheck.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

// Ragged sizes on purpose: nothing divides a vector width or a block size.
constexpr int B = 2, T = 5, C = 12, OC = 7, V = 11, Vp = 16, maxT = 8;

}  // namespace

TEST_CASE("ops: embedding gradients match finite differences", "[ops]") {
  std::mt19937 rng(1);
  Tensor tokens = random_ints(rng, {B, T}, Vp);
  tokens.data<int32_t>()[3] = tokens.data<int32_t>()[0];  // a repeated token accumulates
  std::vector<Var> in{leaf(random_tensor(rng, {Vp, C})), leaf(random_tensor(rng, {maxT, C}))};
  const OpFn f = [&](const std::vector<Var>& v) { return embedding(tokens, v[0], v[1]); };
  gradcheck(in, f);
  check_f32_matches_f64({in[0]->value, in[1]->value}, f);
  // Forward value: wte[token] + wpe[t].
  NoGradScope ng;
  const Var y = f(in);
  const int32_t tok = tokens.data<int32_t>()[1 * T + 4];
  CHECK(y->value.data<double>()[(1 * T + 4) * C + 5] ==
        in[0]->value.data<double>()[tok * C + 5] + in[1]->value.data<double>()[4 * C + 5]);
}

TEST_CASE("ops: linear gradients match finite differences - with and without bias", "[ops]") {
  std::mt19937 rng(2);
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, C})), leaf(random_tensor(rng, {OC, C})),
                      leaf(random_tensor(rng, {OC}))};
  const OpFn with_bias = [](const std::vector<Var>& v) { return linear(v[0], v[1], v[2]); };
  const OpFn no_bias = [](const std::vector<Var>& v) { return linear(v[0], v[1], nullptr); };
  gradcheck(in, with_bias);
  check_f32_matches_f64({in[0]->value, in[1]->value, in[2]->value}, with_bias);
  std::vector<Var> in2{leaf(in[0]->value), leaf(in[1]->value)};
  gradcheck(in2, no_bias);
  // Only the inputs that need a gradient get one.
  std::vector<Var> frozen{leaf(in[0]->value), make_var(in[1]->value, false), leaf(in[2]->value)};
  gradcheck(frozen, with_bias);
  CHECK_FALSE(frozen[1]->grad.defined());
}

TEST_CASE("ops: layernorm gradients match finite differences", "[ops]") {
  std::mt19937 rng(3);
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, C}, DType::f64, -2.0, 3.0)),
                      leaf(random_tensor(rng, {C}, DType::f64, 0.5, 1.5)), leaf(random_tensor(rng, {C}))};
  const OpFn f = [](const std::vector<Var>& v) { return layernorm(v[0], v[1], v[2]); };
  gradcheck(in, f);
  check_f32_matches_f64({in[0]->value, in[1]->value, in[2]->value}, f);
  // Forward value against the formula on one row.
  NoGradScope ng;
  const Var y = f(in);
  const double* x = in[0]->value.data<double>() + 7 * C;
  double m = 0, var = 0;
  for (int c = 0; c < C; ++c) m += x[c] / C;
  for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m) / C;
  for (int c = 0; c < C; ++c) {
    const double want = (x[c] - m) / std::sqrt(var + 1e-5) * in[1]->value.data<double>()[c] +
                        in[2]->value.data<double>()[c];
    CHECK(std::abs(y->value.data<double>()[7 * C + c] - want) < 1e-12);
  }
}

TEST_CASE("ops: gelu gradients match finite differences", "[ops]") {
  std::mt19937 rng(4);
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, C}, DType::f64, -4.0, 4.0))};
  const OpFn f = [](const std::vector<Var>& v) { return gelu(v[0]); };
  gradcheck(in, f);
  check_f32_matches_f64({in[0]->value}, f);
  NoGradScope ng;
  const Var y = f(in);
  const double x = in[0]->value.data<double>()[5];
  const double want = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  CHECK(std::abs(y->value.data<double>()[5] - want) < 1e-14);
}

TEST_CASE("ops: add gradients match finite differences", "[ops]") {
  std::mt19937 rng(5);
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, C})), leaf(random_tensor(rng, {B, T, C}))};
  const OpFn f = [](const std::vector<Var>& v) { return add(v[0], v[1]); };
  gradcheck(in, f);
  check_f32_matches_f64({in[0]->value, in[1]->value}, f);
}

TEST_CASE("ops: a linear that leaves its bias to the residual add - values and gradients as with it in the GEMM",
          "[ops]") {
  std::mt19937 rng(51);
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, OC})), leaf(random_tensor(rng, {B, T, C})),
                      leaf(random_tensor(rng, {OC, C})), leaf(random_tensor(rng, {OC}))};
  // r + (x @ w^T + b) with b added by the add: its gradient is still the linear's.
  const OpFn in_reader = [](const std::vector<Var>& v) {
    return add(v[0], linear(v[1], v[2], v[3], LinearBias::in_reader), nullptr, v[3]);
  };
  const OpFn in_gemm = [](const std::vector<Var>& v) { return add(v[0], linear(v[1], v[2], v[3])); };
  gradcheck(in, in_reader);
  check_f32_matches_f64({in[0]->value, in[1]->value, in[2]->value, in[3]->value}, in_reader);
  // The same values as the bias in the GEMM (the sum's order differs: within f64 rounding).
  NoGradScope no_grad;
  const Tensor y1 = in_reader(in)->value, y2 = in_gemm(in)->value;
  CHECK(rel_err(y1, y2) < 1e-14);
  // Without its bias the linear's output is x @ w^T alone.
  const Tensor y3 = linear(in[1], in[2], in[3], LinearBias::in_reader)->value;
  CHECK(rel_err(y3, linear(in[1], in[2], nullptr)->value) == 0.0);
}

TEST_CASE("ops: add with b's bias sums a + (b + bias) per row and takes no gradient for the bias", "[ops]") {
  std::mt19937 rng(52);
  const Var a = leaf(random_tensor(rng, {B, T, C}, DType::f32)), b = leaf(random_tensor(rng, {B, T, C}, DType::f32));
  const Var bias = leaf(random_tensor(rng, {C}, DType::f32));
  Tape tape;
  Var y;
  {
    TapeScope scope(&tape);
    y = add(a, b, nullptr, bias);
  }
  const float *pa = a->value.data<float>(), *pb = b->value.data<float>(), *pc = bias->value.data<float>();
  for (int64_t i = 0; i < y->value.numel(); ++i)
    REQUIRE(y->value.data<float>()[i] == pa[i] + (pb[i] + pc[i % C]));
  grad_of(y).copy_from(random_tensor(rng, y->value.shape(), DType::f32));
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  CHECK(rel_err(a->grad, y->grad) == 0.0);
  CHECK(rel_err(b->grad, y->grad) == 0.0);
  CHECK_FALSE(bias->grad.defined());
  CHECK_THROWS_WITH(add(a, b, nullptr, leaf(random_tensor(rng, {C + 1}, DType::f32))),
                    Catch::Matchers::ContainsSubstring("one value per column"));
}

TEST_CASE("ops: add's row statistics are a CUDA pass; on the CPU they stay undefined and the sum is unchanged",
          "[ops]") {
  // add(a, b, &stats) computes the sum's LayerNorm statistics only where a CUDA kernel writes them with the sum
  // (tests/kernels/embedding_layernorm_gpu_test.cpp); the CPU emulation computes them in fp8_linear_ln's own
  // LayerNorm, so here the request must leave them undefined (stale ones cleared) and change nothing else.
  std::mt19937 rng(7);
  const Var a = leaf(random_tensor(rng, {B, T, C})), b = leaf(random_tensor(rng, {B, T, C}));
  RowStats stats{Tensor::zeros({B, T}, DType::f32), Tensor::zeros({B, T}, DType::f32)};
  REQUIRE(stats.defined());
  const Var with = add(a, b, &stats), without = add(a, b);
  CHECK_FALSE(stats.defined());
  for (int64_t i = 0; i < with->value.numel(); ++i)
    CHECK(with->value.data<double>()[i] == without->value.data<double>()[i]);
}

TEST_CASE("ops: an add asked for the next LayerNorm's output leaves it to layernorm on the CPU", "[ops]") {
  // The add writes the LayerNorm's output only in a CUDA kernel (tests/kernels/embedding_layernorm_gpu_test.cpp).
  // On the CPU the request leaves `normed` undefined, and layernorm(x, w, b, &stats) is then layernorm(x, w, b).
  std::mt19937 rng(9);
  const Var a = leaf(random_tensor(rng, {B, T, C})), b = leaf(random_tensor(rng, {B, T, C}));
  const Var w = leaf(random_tensor(rng, {C})), lb = leaf(random_tensor(rng, {C}));
  RowStats stats;
  stats.norm_w = w;
  stats.norm_b = lb;
  const Var sum = add(a, b, &stats);
  CHECK_FALSE(stats.normed);
  const Var with = layernorm(sum, w, lb, &stats), without = layernorm(sum, w, lb);
  for (int64_t i = 0; i < with->value.numel(); ++i)
    CHECK(with->value.data<double>()[i] == without->value.data<double>()[i]);
}

TEST_CASE("ops: an input used twice accumulates both gradient contributions", "[ops]") {
  std::mt19937 rng(11);
  // Same Var on both sides of add: d/dx = 2 * dout.
  {
    Tape tape;
    TapeScope scope(&tape);
    const Var x = leaf(random_tensor(rng, {B, T, C}));
    const Var y = add(x, x);
    const Tensor R = random_tensor(rng, {B, T, C});
    grad_of(y).copy_from(R);
    tape.run_backward();
    for (int64_t i = 0; i < R.numel(); ++i) CHECK(grad_of(x).data<double>()[i] == 2 * R.data<double>()[i]);
  }
  // A residual-style composite: x feeds gelu and a linear, and both paths reach x's gradient.
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, C})), leaf(random_tensor(rng, {C, C})),
                      leaf(random_tensor(rng, {C}))};
  gradcheck(in, [](const std::vector<Var>& v) { return add(gelu(v[0]), linear(v[0], v[1], v[2])); });
}

TEST_CASE("ops: NoGradScope records nothing", "[ops]") {
  std::mt19937 rng(12);
  Tape tape;
  TapeScope scope(&tape);
  const Var x = leaf(random_tensor(rng, {B, T, C}));
  const Var w = leaf(random_tensor(rng, {OC, C}));
  {
    NoGradScope ng;
    const Var y = gelu(linear(x, w, nullptr));
    CHECK_FALSE(y->requires_grad);
  }
  CHECK(tape.size() == 0);
  // Inputs that need no gradient record nothing either.
  const Var y = gelu(make_var(random_tensor(rng, {B, T, C})));
  CHECK_FALSE(y->requires_grad);
  CHECK(tape.size() == 0);
  const Var z = gelu(x);
  CHECK(z->requires_grad);
  CHECK(tape.size() == 1);
}

TEST_CASE("ops: checkpoint recompute gives the same gradients as storing activations", "[ops]") {
  std::mt19937 rng(13);
  const Tensor tokens_t = random_ints(rng, {B, T}, V);
  std::vector<Tensor> values{random_tensor(rng, {B, T, C}),                                        // x
                             random_tensor(rng, {C}, DType::f64, 0.5, 1.5), random_tensor(rng, {C}),  // ln
                             random_tensor(rng, {2 * C, C}), random_tensor(rng, {2 * C}),          // fc
                             random_tensor(rng, {C, 2 * C}), random_tensor(rng, {C}),              // proj
                             random_tensor(rng, {Vp, C})};                                          // head
  auto run = [&](bool recompute) {
    std::vector<Var> p;
    for (const Tensor& v : values) p.push_back(leaf(v));
    auto layer = [p](const Var& h) {
      return add(h, linear(gelu(linear(layernorm(h, p[1], p[2]), p[3], p[4])), p[5], p[6]));
    };
    Tape tape;
    TapeScope scope(&tape);
    Var h = p[0];
    for (int l = 0; l < 2; ++l) h = recompute ? checkpoint(layer, h) : layer(h);
    const Var loss = cross_entropy(linear(h, p[7], nullptr), tokens_t, V);
    tape.backward(loss);
    std::vector<Tensor> g;
    for (const Var& v : p) g.push_back(grad_of(v));
    return std::make_pair(loss->value.data<double>()[0], g);
  };
  const auto [loss_plain, g_plain] = run(false);
  const auto [loss_ckpt, g_ckpt] = run(true);
  CHECK(loss_plain == loss_ckpt);
  for (size_t i = 0; i < g_plain.size(); ++i) {
    INFO("parameter " << i);
    CHECK(rel_err(g_ckpt[i], g_plain[i]) < 1e-12);
  }
}

TEST_CASE("ops: matmul matches a naive triple loop on odd shapes", "[ops]") {
  struct Dims {
    int64_t M, K, N;
  };
  // The second shape crosses every cache block (MC, KC, NC) of the packed kernel.
  for (Dims d : {Dims{67, 131, 259}, Dims{130, 517, 300}}) {
    const int64_t M = d.M, K = d.K, N = d.N;
    INFO("M " << M << " K " << K << " N " << N);
    std::mt19937 rng(14);
    const Tensor x = random_tensor(rng, {M, K}), w = random_tensor(rng, {N, K}), b = random_tensor(rng, {N});
    const Tensor dout = random_tensor(rng, {M, N});
    // Existing gradient contents: backward must add to them.
    const Tensor dx0 = random_tensor(rng, {M, K}), dw0 = random_tensor(rng, {N, K}), db0 = random_tensor(rng, {N});
    Tensor want_y = Tensor::empty({M, N}, DType::f64), want_dx = cast(dx0, DType::f64);
    Tensor want_dw = cast(dw0, DType::f64), want_db = cast(db0, DType::f64);
    const double *px = x.data<double>(), *pw = w.data<double>(), *pd = dout.data<double>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = b.data<double>()[n];
        for (int64_t k = 0; k < K; ++k) s += px[m * K + k] * pw[n * K + k];
        want_y.data<double>()[m * N + n] = s;
        want_db.data<double>()[n] += pd[m * N + n];
        for (int64_t k = 0; k < K; ++k) {
          want_dx.data<double>()[m * K + k] += pd[m * N + n] * pw[n * K + k];
          want_dw.data<double>()[n * K + k] += pd[m * N + n] * px[m * K + k];
        }
      }
    for (DType dt : {DType::f64, DType::f32}) {
      INFO(dtype_name(dt));
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      const Tensor xx = cast(x, dt), ww = cast(w, dt), bb = cast(b, dt), dd = cast(dout, dt);
      Tensor y = Tensor::empty({M, N}, dt), y_nobias = Tensor::empty({M, N}, dt);
      Tensor dx = cast(dx0, dt), dw = cast(dw0, dt), db = cast(db0, dt);
      auto run = [&]<typename F>() {
        cpu::matmul_forward<F>(y.data<F>(), xx.data<F>(), ww.data<F>(), bb.data<F>(), M, K, N);
        cpu::matmul_forward<F>(y_nobias.data<F>(), xx.data<F>(), ww.data<F>(), nullptr, M, K, N);
        cpu::matmul_backward<F>(dx.data<F>(), dw.data<F>(), db.data<F>(), dd.data<F>(), xx.data<F>(), ww.data<F>(),
                                M, K, N);
      };
      if (dt == DType::f64) run.operator()<double>();
      else run.operator()<float>();
      CHECK(rel_err(y, want_y) < tol);
      Tensor y_plus = cast(y_nobias, DType::f64);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) y_plus.data<double>()[m * N + n] += b.data<double>()[n];
      CHECK(rel_err(y_plus, want_y) < tol);
      CHECK(rel_err(dx, want_dx) < tol);
      CHECK(rel_err(dw, want_dw) < tol);
      CHECK(rel_err(db, want_db) < tol);
    }
  }
}

TEST_CASE("ops: argument errors name the problem", "[ops]") {
  std::mt19937 rng(15);
  const Var x = leaf(random_tensor(rng, {B, T, C}));
  CHECK_THROWS_AS(linear(x, leaf(random_tensor(rng, {OC, C + 1})), nullptr), Error);
  CHECK_THROWS_AS(attention(leaf(random_tensor(rng, {B, T, 3 * C})), 5), Error);
  CHECK_THROWS_AS(add(x, leaf(random_tensor(rng, {B, T, C}, DType::f32))), Error);
  CHECK_THROWS_AS(gelu(make_var(cast(x->value, DType::bf16))), Error);
  Tensor bad_tokens = random_ints(rng, {B, T}, Vp);
  bad_tokens.data<int32_t>()[2] = Vp;
  CHECK_THROWS_AS(embedding(bad_tokens, leaf(random_tensor(rng, {Vp, C})), leaf(random_tensor(rng, {maxT, C}))),
                  Error);
  Tensor bad_targets = random_ints(rng, {B, T}, V);
  bad_targets.data<int32_t>()[1] = V;  // a padded column is never a valid target
  CHECK_THROWS_AS(cross_entropy(leaf(random_tensor(rng, {B, T, Vp})), bad_targets, V), Error);
}

TEST_CASE("ops: utilities fill - add - scale and cast", "[ops]") {
  std::mt19937 rng(16);
  Tensor a = random_tensor(rng, {3, 5}, DType::f32);
  const Tensor z = zeros_like(a, DType::f64);
  CHECK(z.dtype() == DType::f64);
  CHECK(z.shape() == a.shape());
  for (int64_t i = 0; i < z.numel(); ++i) CHECK(z.data<double>()[i] == 0.0);
  Tensor d = cast(a, DType::f64);
  add_(d, a);  // mixed dtypes on the host
  scale_(d, 0.5f);
  for (int64_t i = 0; i < a.numel(); ++i) CHECK(d.data<double>()[i] == double(a.data<float>()[i]));
  Tensor h = cast(a, DType::bf16);
  const std::vector<float> hv = h.to_float_vector();
  for (int64_t i = 0; i < a.numel(); ++i)
    CHECK(std::abs(hv[i] - a.data<float>()[i]) <= 4e-3f * std::abs(a.data<float>()[i]));
  fill_(h, 1.5f);
  for (float v : h.to_float_vector()) CHECK(v == 1.5f);
}

TEST_CASE("ops: matmul throughput on the lm_head shape", "[.bench]") {
  // Not a timed assertion: prints GFLOP/s of the three lm_head products (M=1024, K=128, N=50304).
  const int64_t M = 1024, K = 128, N = 50304;
  std::mt19937 rng(17);
  const Tensor x = random_tensor(rng, {M, K}, DType::f32), w = random_tensor(rng, {N, K}, DType::f32);
  const Tensor dout = random_tensor(rng, {M, N}, DType::f32);
  Tensor y = Tensor::empty({M, N}, DType::f32), dx = Tensor::zeros({M, K}, DType::f32);
  Tensor dw = Tensor::zeros({N, K}, DType::f32);
  auto time = [&](const char* name, auto&& fn) {
    fn();
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int reps = 3;
    for (int r = 0; r < reps; ++r) fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("matmul %-7s %8.2f ms  %7.1f GFLOP/s\n", name, s * 1e3, 2.0 * M * N * K / s / 1e9);
  };
  time("forward",
       [&] { cpu::matmul_forward<float>(y.data<float>(), x.data<float>(), w.data<float>(), nullptr, M, K, N); });
  time("dinp", [&] {
    cpu::matmul_backward<float>(dx.data<float>(), nullptr, nullptr, dout.data<float>(), x.data<float>(),
                                w.data<float>(), M, K, N);
  });
  time("dweight", [&] {
    cpu::matmul_backward<float>(nullptr, dw.data<float>(), nullptr, dout.data<float>(), x.data<float>(),
                                w.data<float>(), M, K, N);
  });
}

TEST_CASE("ops: CPU gradients are bitwise reproducible run to run", "[ops]") {
  // Resumed runs must match uninterrupted ones, so no reduction may depend on thread timing.
  std::mt19937 rng(18);
  const std::vector<Tensor> values{random_tensor(rng, {4, 64, 96}, DType::f32), random_tensor(rng, {96}, DType::f32),
                                   random_tensor(rng, {96}, DType::f32), random_tensor(rng, {200, 96}, DType::f32)};
  auto run = [&] {
    std::vector<Var> p;
    for (const Tensor& v : values) p.push_back(leaf(cast(v, DType::f32)));
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {  // the second accumulates onto the first
      Tape tape;
      TapeScope scope(&tape);
      const Var y = linear(layernorm(p[0], p[1], p[2]), p[3], nullptr);
      fill_(grad_of(y), 0.37f);
      tape.run_backward();
    }
    std::vector<std::vector<float>> g;
    for (const Var& v : p) g.push_back(grad_of(v).to_float_vector());
    return g;
  };
  const auto a = run(), b = run();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
}

