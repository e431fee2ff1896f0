// The tape: backward runs the recorded nodes in reverse, gradients of a value used twice add up, the seed
// scales every gradient, nothing is recorded without a tape or under NoGradScope, and a value released for
// recompute is rebuilt when backward reads it.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "ops/ops.h"

using namespace fp8t;

namespace {
Var leaf(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return make_var(Tensor::from_vector(std::move(v), {n}), true);
}
}  // namespace

TEST_CASE("tape: nodes run in reverse order of recording", "[autograd][tape]") {
  Tape tape;
  std::vector<std::string> order;
  tape.record("first", [&] { order.push_back("first"); });
  tape.record("second", [&] { order.push_back("second"); });
  tape.record("third", [&] { order.push_back("third"); });
  CHECK(tape.size() == 3);
  tape.run_backward();
  CHECK(order == std::vector<std::string>{"third", "second", "first"});
}

TEST_CASE("tape: a value read twice gets the sum of both gradients, scaled by the seed", "[autograd][tape]") {
  Tape tape;
  Var x = leaf({-2.0f});  // the loss is a scalar
  Var z;
  {
    TapeScope scope(&tape);
    z = add(add(x, x), x);  // 3 x: x is read by two nodes, one of them twice
  }
  CHECK(z->requires_grad);
  tape.backward(z, 0.5f);
  CHECK(grad_of(x).to_float_vector() == std::vector<float>{1.5f});
}

TEST_CASE("tape: nothing is recorded without a tape or under NoGradScope", "[autograd][tape]") {
  Var x = leaf({1.0f, 2.0f});
  Var y = add(x, x);  // no current tape
  CHECK_FALSE(grad_enabled());
  Tape tape;
  {
    TapeScope scope(&tape);
    CHECK(grad_enabled());
    {
      NoGradScope off;
      CHECK_FALSE(grad_enabled());
      y = add(x, x);
    }
    CHECK(tape.size() == 0);
    CHECK_FALSE(y->requires_grad);
    y = add(x, x);
  }
  CHECK(tape.size() == 1);
  CHECK(y->requires_grad);
}

TEST_CASE("tape: a value released for recompute is rebuilt by the first read", "[autograd][tape]") {
  Tape tape;
  Var x = leaf({1.0f, 2.0f});
  int rebuilt = 0;
  Var y;
  {
    TapeScope scope(&tape);
    y = add(x, x);
    release_for_recompute(y, [&] {
      ++rebuilt;
      return Tensor::from_vector({2.0f, 4.0f}, {2});
    });
  }
  CHECK(rebuilt == 0);
  CHECK(value_of(y).to_float_vector() == std::vector<float>{2.0f, 4.0f});
  CHECK(rebuilt == 1);
  Var kept = add(x, x);  // not released, and without a tape release is a no-op
  release_for_recompute(kept, [&] { return Tensor(); });
  CHECK(value_of(kept).to_float_vector() == std::vector<float>{2.0f, 4.0f});
}

namespace {
Var leaf2(std::vector<float> v, int64_t rows, int64_t cols) {
  return make_var(Tensor::from_vector(std::move(v), {rows, cols}), true);
}

// out (M, N) = a (M, K) @ b^T (b (N, K)), or with ta = true a^T (a (K, M)) @ b (b (K, N)).
std::vector<float> matmul_ref(const std::vector<float>& a, const std::vector<float>& b, int M, int K, int N, bool ta) {
  std::vector<float> out(static_cast<size_t>(M) * N, 0.0f);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        out[m * N + n] += ta ? a[k * M + m] * b[k * N + n] : a[m * K + k] * b[n * K + k];
  return out;
}

// With w (N, K) stored row-major, g (M, N) @ w (N, K): the input gradient of a linear.
std::vector<float> times_w(const std::vector<float>& g, const std::vector<float>& w, int M, int N, int K) {
  std::vector<float> out(static_cast<size_t>(M) * K, 0.0f);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) out[m * K + k] += g[m * N + n] * w[n * K + k];
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-5f * (1.0f + std::abs(want[i])));
}
}  // namespace

// A residual add y = x1 + h whose branch h ends in a linear recorded just before the add: h takes d(y)'s buffer
// itself (the linear's backward runs next and only reads it), as x1 does. Not when another node comes between,
// and not when the linear writes x1's gradient (x1 is its input): then its dgrad would accumulate into the buffer
// it reads.
TEST_CASE("tape: an add shares its output gradient with a branch's last linear only when that is safe",
          "[autograd][tape]") {
  const int M = 2, K = 3, Kz = 4;
  const std::vector<float> xv = {0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.75f};
  const std::vector<float> zv = {1.0f, -2.0f, 0.5f, 0.25f, -1.5f, 0.75f, 2.0f, -0.5f};
  const std::vector<float> w1v = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, -0.7f, 0.8f, 0.9f};
  const std::vector<float> w2v = {0.2f, 0.1f, -0.3f, 0.5f, -0.4f, 0.6f, 0.7f, -0.1f, 0.3f, -0.8f, 0.2f, 0.9f};
  const std::vector<float> g = {1.0f, -0.5f, 2.0f, 0.25f, 1.5f, -1.0f};  // d(y)
  for (const bool branch_last : {true, false}) {
    INFO("branch recorded " << (branch_last ? "last" : "before the residual's linear"));
    Tape tape;
    Var x = leaf2(xv, M, K), z = leaf2(zv, M, Kz), w1 = leaf2(w1v, K, K), w2 = leaf2(w2v, K, Kz);
    Var x1, h, y;
    {
      TapeScope scope(&tape);
      if (branch_last) {
        x1 = linear(x, w1, Var());
        h = linear(z, w2, Var());
      } else {
        h = linear(z, w2, Var());
        x1 = linear(x, w1, Var());
      }
      y = add(x1, h);
    }
    grad_of(y).copy_from(Tensor::from_vector(g, {M, K}));
    tape.run_backward();
    CHECK((grad_of(h).raw() == grad_of(x1).raw()) == branch_last);
    check_close(grad_of(w1).to_float_vector(), matmul_ref(g, xv, K, M, K, true));
    check_close(grad_of(w2).to_float_vector(), matmul_ref(g, zv, K, M, Kz, true));
    check_close(grad_of(x).to_float_vector(), times_w(g, w1v, M, K, K));
    check_close(grad_of(z).to_float_vector(), times_w(g, w2v, M, K, Kz));
  }
  {  // y = x + linear(x): the linear writes x's gradient, so it must read a copy of d(y)
    Tape tape;
    Var x = leaf2(xv, M, K), w1 = leaf2(w1v, K, K);
    Var h, y;
    {
      TapeScope scope(&tape);
      h = linear(x, w1, Var());
      y = add(x, h);
    }
    grad_of(y).copy_from(Tensor::from_vector(g, {M, K}));
    tape.run_backward();
    CHECK(grad_of(h).raw() != grad_of(x).raw());
    std::vector<float> want = times_w(g, w1v, M, K, K);
    for (size_t i = 0; i < want.size(); ++i) want[i] += g[i];
    check_close(grad_of(x).to_float_vector(), want);
  }
}
