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

TEST_CASE("autograd: add hands a residual branch's dy request to the next node only", "[autograd]") {
  // b = linear(x) (reads its gradient only, recorded just before the add) asking for dy codes: the node recorded right
  // after y = add(a, b) is the last to add into y's gradient, and may leave b's as codes (residual_dy_cell); a node
  // recorded later, another tape, a b that asks nothing, or a == b, may not.
  auto leaf = [](std::vector<float> v, Shape s) { return make_var(Tensor::from_vector(v, s), true); };
  const Var x = leaf({1.0f, -2.0f, 0.5f, 3.0f}, {2, 2}), w = leaf({0.5f, 1.0f, -1.0f, 2.0f}, {2, 2});
  const Var bias = leaf({0.25f, -0.5f}, {2}), a = leaf({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
  Tape tape;
  TapeScope scope(&tape);
  Var b = linear(x, w, bias);
  b->grad_cell->fp8_dy = std::make_shared<const Fp8DyRequest>(Fp8DyRequest{.codes = true});
  const Var y = add(a, b);
  CHECK(residual_dy_cell(y).lock() == b->grad_cell);
  {
    Tape other;
    TapeScope inner(&other);
    CHECK_FALSE(residual_dy_cell(y).lock());
  }
  const Var z = add(y, a);  // a node after the add: y's gradient is no longer final in the next node's backward
  CHECK_FALSE(residual_dy_cell(y).lock());
  CHECK_FALSE(residual_dy_cell(z).lock());  // a's producer is no linear recorded just before
  Var b2 = linear(x, w, bias);
  CHECK_FALSE(residual_dy_cell(add(a, b2)).lock());  // no request
  b2 = linear(x, w, bias);
  b2->grad_cell->fp8_dy = b->grad_cell->fp8_dy;
  CHECK_FALSE(residual_dy_cell(add(b2, b2)).lock());  // a == b
}

TEST_CASE("autograd: a residual branch's gradient left as codes by the node after the add", "[autograd]") {
  // As the FP8 LayerNorm linear's backward does (ops/layernorm_cuda.h): the node right after y = add(a, b) finishes
  // y's gradient and leaves b's pending as codes; add's backward then gives a the gradient and leaves b's alone, and
  // b's producer (here a bf16 linear, which reads it through grad_of) gets y's gradient from materialize.
  auto leaf = [](std::vector<float> v, Shape s) { return make_var(Tensor::from_vector(v, s), true); };
  const Var x = leaf({1.0f, -2.0f, 0.5f, 3.0f}, {2, 2}), w = leaf({0.5f, 1.0f, -1.0f, 2.0f}, {2, 2});
  const Var bias = leaf({0.25f, -0.5f}, {2}), a = leaf({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
  const std::vector<float> dy = {0.5f, -1.0f, 2.0f, 0.25f};
  int writes = 0;
  auto run = [&](bool codes) {
    for (const Var& v : {x, w, bias, a}) v->grad = Tensor();
    Tape tape;
    {
      TapeScope scope(&tape);
      Var b = linear(x, w, bias);
      if (codes) b->grad_cell->fp8_dy = std::make_shared<const Fp8DyRequest>(Fp8DyRequest{.codes = true});
      const Var y = add(a, b);
      current_tape()->record("finishes y's gradient", [yg = grad_ref(y), cell = residual_dy_cell(y), &dy, &writes] {
        Tensor& g = grad_of(yg);
        g.copy_from(Tensor::from_vector(dy, {2, 2}));
        if (const auto c = cell.lock()) {
          c->pending.dy_codes = Tensor::from_vector({9.0f}, {1});  // stands in for the codes
          c->pending.materialize = [g, &writes](const Tensor&, const Tensor&) {
            ++writes;
            return g;
          };
        }
      });
    }
    TapeScope none(nullptr);
    tape.run_backward();
    return std::vector{x->grad.to_float_vector(), w->grad.to_float_vector(), bias->grad.to_float_vector(),
                       a->grad.to_float_vector()};
  };
  const auto plain = run(false);
  CHECK(writes == 0);
  const auto coded = run(true);
  CHECK(writes == 1);
  CHECK(coded == plain);
  CHECK(plain[3] == dy);
}
