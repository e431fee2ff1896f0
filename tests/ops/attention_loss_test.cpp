// Attention and the loss ops on the CPU: attention and cross_entropy gradients against central finite
// differences in f64 and f32 against f64, attention against a naive causal softmax and its causality,
// cross_entropy over a padded vocabulary, and the chunked lm_head_loss against cross_entropy(linear).
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <random>
#include <tuple>

#include "ops/cpu/cross_entropy.h"
#include "tests/ops/gradcheck.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

// Ragged sizes on purpose: nothing divides a vector width or a block size.
constexpr int B = 2, T = 5, C = 12, NH = 3, V = 11, Vp = 16;

}  // namespace

TEST_CASE("ops: attention gradients match finite differences", "[ops]") {
  std::mt19937 rng(6);
  for (int nh : {NH, 1}) {
    INFO("n_head " << nh);
    std::vector<Var> in{leaf(random_tensor(rng, {B, T, 3 * C}, DType::f64, -1.5, 1.5))};
    const OpFn f = [nh](const std::vector<Var>& v) { return attention(v[0], nh); };
    gradcheck(in, f);
    check_f32_matches_f64({in[0]->value}, f);
  }
}

TEST_CASE("ops: attention forward matches a naive causal softmax", "[ops]") {
  std::mt19937 rng(7);
  const Var qkv = make_var(random_tensor(rng, {B, T, 3 * C}, DType::f64, -2.0, 2.0));
  const Var y = attention(qkv, NH);
  const int HS = C / NH;
  const double* x = qkv->value.data<double>();
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= t; ++j) {
          s[j] = 0;
          for (int i = 0; i < HS; ++i)
            s[j] += x[(b * T + t) * 3 * C + h * HS + i] * x[(b * T + j) * 3 * C + C + h * HS + i];
          s[j] /= std::sqrt(double(HS));
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - mx);
        for (int i = 0; i < HS; ++i) {
          double o = 0;
          for (int j = 0; j <= t; ++j) o += std::exp(s[j] - mx) / sum * x[(b * T + j) * 3 * C + 2 * C + h * HS + i];
          worst = std::max(worst, std::abs(o - y->value.data<double>()[(b * T + t) * C + h * HS + i]));
        }
      }
  CHECK(worst < 1e-13);
}

TEST_CASE("ops: attention is causal", "[ops]") {
  std::mt19937 rng(8);
  Tensor x = random_tensor(rng, {B, T, 3 * C});
  const Tensor before = attention(make_var(x), NH)->value;
  const int t_changed = 3;
  for (int c = 0; c < 3 * C; ++c) x.data<double>()[(0 * T + t_changed) * 3 * C + c] += 0.5;
  const Tensor after = attention(make_var(x), NH)->value;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      double diff = 0;
      for (int c = 0; c < C; ++c)
        diff = std::max(diff, std::abs(before.data<double>()[(b * T + t) * C + c] -
                                       after.data<double>()[(b * T + t) * C + c]));
      INFO("b " << b << " t " << t);
      if (b == 0 && t >= t_changed) CHECK(diff > 1e-6);
      else CHECK(diff == 0.0);
    }
}

TEST_CASE("ops: cross_entropy gradients match finite differences", "[ops]") {
  std::mt19937 rng(9);
  const Tensor targets = random_ints(rng, {B, T}, V);
  std::vector<Var> in{leaf(random_tensor(rng, {B, T, Vp}, DType::f64, -3.0, 3.0))};
  const OpFn f = [&](const std::vector<Var>& v) { return cross_entropy(v[0], targets, V); };
  gradcheck(in, f);
  check_f32_matches_f64({in[0]->value}, f);
}

TEST_CASE("ops: cross_entropy ignores padded vocabulary columns", "[ops]") {
  std::mt19937 rng(10);
  const Tensor targets = random_ints(rng, {B, T}, V);
  Tensor logits = random_tensor(rng, {B, T, Vp}, DType::f64, -3.0, 3.0);
  auto run = [&](const Tensor& l) {
    Tape tape;
    TapeScope scope(&tape);
    const Var x = leaf(l);
    const Var loss = cross_entropy(x, targets, V);
    tape.backward(loss);
    return std::make_pair(loss->value.data<double>()[0], grad_of(x));
  };
  const auto [loss0, grad0] = run(logits);
  // The loss is the mean over tokens of logsumexp over the first V columns minus the target logit.
  double want = 0;
  for (int r = 0; r < B * T; ++r) {
    const double* x = logits.data<double>() + r * Vp;
    double s = 0;
    for (int i = 0; i < V; ++i) s += std::exp(x[i]);
    want += (std::log(s) - x[targets.data<int32_t>()[r]]) / (B * T);
  }
  CHECK(std::abs(loss0 - want) < 1e-13);
  for (int r = 0; r < B * T; ++r)
    for (int i = V; i < Vp; ++i) {
      CHECK(grad0.data<double>()[r * Vp + i] == 0.0);
      logits.data<double>()[r * Vp + i] = 1e4 * (i % 2 ? 1 : -1);  // would dominate any softmax it entered
    }
  const auto [loss1, grad1] = run(logits);
  CHECK(loss1 == loss0);
  for (int64_t i = 0; i < grad0.numel(); ++i) CHECK(grad1.data<double>()[i] == grad0.data<double>()[i]);
  // The reference leaves existing padded-column gradients untouched (it accumulates, never clears).
  const Tensor logits32 = cast(logits, DType::f32);
  Tensor dlogits = random_tensor(rng, {B, T, Vp}, DType::f32);
  const Tensor before = cast(dlogits, DType::f32);
  const std::vector<float> dlosses(B * T, 0.25f);
  cpu::cross_entropy_backward<float>(dlogits.data<float>(), logits32.data<float>(), targets.data<int32_t>(),
                                     dlosses.data(), B * T, V, Vp);
  for (int r = 0; r < B * T; ++r)
    for (int i = V; i < Vp; ++i) CHECK(dlogits.data<float>()[r * Vp + i] == before.data<float>()[r * Vp + i]);
}

TEST_CASE("lm_head_loss: chunked head and loss equal cross_entropy(linear) with gradients", "[ops]") {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t B = 3, T = 7, C = 12, V = 37, Vp = 40;
  auto rand_tensor = [&](Shape s, float sd) {
    Tensor t = Tensor::empty(std::move(s), DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = sd * nd(rng);
    return t;
  };
  const Tensor h0 = rand_tensor({B, T, C}, 1.0f), w0 = rand_tensor({Vp, C}, 0.3f);
  Tensor targets = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % V);
  const float seed = 0.25f;
  auto run = [&](int64_t chunk) {
    Var h = make_var(h0, true), w = make_var(w0, true);
    Tape tape;
    Var loss;
    {
      TapeScope s(&tape);
      loss = chunk > 0 ? lm_head_loss(h, w, targets, V, chunk, seed) : cross_entropy(linear(h, w, nullptr), targets, V);
    }
    tape.backward(loss, seed);
    return std::make_tuple(loss->value.data<float>()[0], h->grad.to_float_vector(), w->grad.to_float_vector());
  };
  const auto [l_ref, dh_ref, dw_ref] = run(0);
  for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{21}, int64_t{64}}) {
    const auto [l, dh, dw] = run(chunk);
    INFO("chunk " << chunk);
    CHECK(l == Catch::Approx(l_ref).epsilon(1e-6));
    REQUIRE(dh.size() == dh_ref.size());
    for (size_t i = 0; i < dh.size(); ++i) REQUIRE(dh[i] == Catch::Approx(dh_ref[i]).margin(1e-6));
    for (size_t i = 0; i < dw.size(); ++i) REQUIRE(dw[i] == Catch::Approx(dw_ref[i]).margin(1e-6));
  }
  // The gradients were computed for `seed`: another seed is refused.
  Var h = make_var(h0, true), w = make_var(w0, true);
  Tape tape;
  Var loss;
  {
    TapeScope s(&tape);
    loss = lm_head_loss(h, w, targets, V, 8, seed);
  }
  CHECK_THROWS_WITH(tape.backward(loss, 1.0f), Catch::Matchers::ContainsSubstring("seed"));
}
