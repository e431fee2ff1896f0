// The tape: backward runs the recorded nodes in reverse, gradients of a value used twice add up, the seed
// scales every gradient, nothing is recorded without a tape or under NoGradScope, and a value released for
// recompute is rebuilt when backward reads it.
#include <catch2/catch_test_macros.hpp>

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
