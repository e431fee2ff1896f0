// Pending gradients (autograd/variable.h): whoever touches a gradient left pending gets it written
// first, so the result never depends on whether the producer that could consume it runs.
#include <catch2/catch_test_macros.hpp>

#include "autograd/tape.h"
#include "config/config.h"
#include "ops/fp8_linear.h"
#include "ops/ops.h"

using namespace fp8t;

namespace {

// A pending gradient whose written form is operand * input + 1 (a stand-in for the GELU backward), and
// a count of how often it was written.
void set_pending(const Var& v, std::vector<float> operand, std::vector<float> input, int* writes) {
  const Shape shape = v->value.shape();
  PendingGrad& p = v->grad_cell->pending;
  p.operand = Tensor::from_vector(operand, shape);
  p.input = [t = Tensor::from_vector(input, shape)] { return t; };
  p.materialize = [writes](const Tensor& op, const Tensor& in) {
    ++*writes;
    std::vector<float> g = op.to_float_vector();
    const std::vector<float> x = in.to_float_vector();
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] * x[i] + 1.0f;
    return Tensor::from_vector(g, op.shape());
  };
}

}  // namespace

TEST_CASE("autograd: grad_of and grad_exists write a pending gradient once", "[autograd]") {
  Var v = make_var(Tensor::from_vector({0.0f, 0.0f, 0.0f}, {3}), true);
  int writes = 0;
  set_pending(v, {1.0f, 2.0f, 3.0f}, {2.0f, 2.0f, -1.0f}, &writes);
  CHECK_FALSE(v->grad.defined());
  CHECK(grad_exists(grad_ref(v)));
  CHECK(writes == 1);
  CHECK_FALSE(v->grad_cell->pending.defined());
  CHECK(grad_of(v).to_float_vector() == std::vector<float>{3.0f, 5.0f, -2.0f});
  CHECK(writes == 1);

  Var u = make_var(Tensor::from_vector({0.0f, 0.0f}, {2}), true);
  set_pending(u, {1.0f, 1.0f}, {4.0f, 5.0f}, &writes);
  CHECK(grad_of(grad_ref(u)).to_float_vector() == std::vector<float>{5.0f, 6.0f});
  CHECK(writes == 2);
  Var none = make_var(Tensor::from_vector({0.0f}, {1}), true);
  CHECK_FALSE(grad_exists(none));  // nothing pending, nothing written

  // A gradient both written and pending is a bug in the op that left it pending.
  Var both = make_var(Tensor::from_vector({0.0f}, {1}), true);
  both->grad = Tensor::from_vector({1.0f}, {1});
  set_pending(both, {1.0f}, {1.0f}, &writes);
  CHECK_THROWS(grad_of(both));
}

TEST_CASE("autograd: an op's backward adds to a pending gradient after writing it", "[autograd]") {
  // a's gradient is pending when add's backward runs: add must not take d(out) as a's whole gradient
  // (its shortcut for a gradient that does not exist yet) but write the pending one and add to it.
  Var a = make_var(Tensor::from_vector({1.0f, 2.0f}, {2}), true);
  Var b = make_var(Tensor::from_vector({3.0f, 4.0f}, {2}), true);
  Tape tape;
  Var y;
  {
    TapeScope scope(&tape);
    y = add(a, b);
  }
  int writes = 0;
  set_pending(a, {2.0f, 3.0f}, {1.0f, 2.0f}, &writes);  // written: {3, 7}
  grad_of(y).copy_from(Tensor::from_vector({10.0f, 20.0f}, {2}));
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  CHECK(writes == 1);
  CHECK(a->grad.to_float_vector() == std::vector<float>{13.0f, 27.0f});
  CHECK(b->grad.to_float_vector() == std::vector<float>{10.0f, 20.0f});
}

TEST_CASE("autograd: the CPU FP8 MLP leaves no gradient pending", "[autograd][fp8]") {
  // On the CPU fp8_linear_gelu runs gelu then fp8_linear, whose gradients are written as before (the
  // emulation is f32 throughout: fusing would change no bit and save nothing), so no Var is marked.
  auto filled = [](Shape shape, float step) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = step * static_cast<float>(static_cast<int>(i % 7) - 3);
    return Tensor::from_vector(v, shape);
  };
  Fp8LinearState fc("fc", Fp8Config{}), fc2("fc2", Fp8Config{});
  Var x = make_var(filled({16, 16}, 0.25f), true);
  Var w1 = make_var(filled({32, 16}, 0.05f), true), b1 = make_var(filled({32}, 0.1f), true);
  Var w2 = make_var(filled({16, 32}, 0.05f), true), b2 = make_var(filled({16}, 0.1f), true);
  Tape tape;
  Var pre, y;
  {
    TapeScope scope(&tape);
    pre = fp8_linear(x, w1, b1, fc);
    y = fp8_linear_gelu(pre, w2, b2, fc2);
  }
  CHECK_FALSE(pre->grad_cell->takes_pending);
  CHECK_FALSE(pre->grad_cell->fp8_dy);  // nor asked for its gradient as FP8 codes (a CUDA-only pass)
  fill_(grad_of(y), 1.0f);
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  CHECK(pre->grad.defined());
  CHECK_FALSE(pre->grad_cell->pending.defined());
  CHECK(b1->grad.defined());
}

TEST_CASE("autograd: a gradient pending as cast codes is written by its materialize alone", "[autograd]") {
  // The codes form (an FP8 linear's dy, cast by the op that computed it): no operand and no input; whoever else
  // reads the gradient gets what materialize writes (that op's backward run again), once, and the codes go.
  Var v = make_var(Tensor::from_vector({0.0f, 0.0f}, {2}), true);
  int writes = 0;
  PendingGrad& p = v->grad_cell->pending;
  p.dy_codes_t = Tensor::from_vector({1.0f, 2.0f}, {2});  // stands in for (cols, rows) codes
  p.dy_stats = Tensor::from_vector({0.0f, 0.0f, 0.0f, 0.0f}, {4});
  p.materialize = [&writes](const Tensor& op, const Tensor& in) {
    ++writes;
    CHECK_FALSE(op.defined());
    CHECK_FALSE(in.defined());
    return Tensor::from_vector({5.0f, 6.0f}, {2});
  };
  CHECK(p.defined());
  CHECK(grad_of(v).to_float_vector() == std::vector<float>{5.0f, 6.0f});
  CHECK(writes == 1);
  CHECK_FALSE(v->grad_cell->pending.defined());
  CHECK_FALSE(v->grad_cell->pending.dy_codes_t.defined());
}
