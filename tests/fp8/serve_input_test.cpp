// fp8_linear's serve_input on the CPU emulation: the input is dropped after the forward and served from
// the linear's codes, dequantized; the linear's own results do not change; attention's backward reads
// the served output (one FP8 copy of attention's output for both of its readers).
#include <catch2/catch_test_macros.hpp>
#include <random>

#include "config/config.h"
#include "fp8/quantize.h"
#include "ops/fp8_linear.h"
#include "ops/ops.h"

using namespace fp8t;

namespace {

Tensor randn(std::mt19937& rng, Shape shape, float stdev) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32, Device::cpu(), MemCategory::workspace);
  std::normal_distribution<float> d(0.0f, stdev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), Device::cpu(), MemCategory::activations);
  c.copy_from(t);
  return c;
}

Fp8Config delayed() {
  Fp8Config c;
  c.scaling = Fp8Scaling::delayed;
  return c;
}

}  // namespace

TEST_CASE("fp8: serve_input drops the input and serves its dequantized codes; the linear is unchanged", "[fp8]") {
  std::mt19937 rng(11);
  const int64_t B = 4, T = 8, IC = 32, OC = 16;
  const Tensor xs = randn(rng, {B, T, IC}, 1.0f), w = randn(rng, {OC, IC}, 0.1f), dy = randn(rng, {B, T, OC}, 1.0f);
  struct Result {
    std::vector<float> y, dx, dw, served;
  };
  auto run = [&](bool serve) {
    Fp8LinearState st("serve", delayed());
    Var x = make_var(copy_of(xs), true), wv = make_var(copy_of(w), true);
    Tape tape;
    Var y;
    Result r;
    {
      TapeScope scope(&tape);
      y = fp8_linear(x, wv, nullptr, st, serve);
      CHECK(x->value.defined() == !serve);
      r.served = value_of(x).to_float_vector();
      // What the linear quantized x to: codes at the step's scale, decoded.
      const QuantizedTensor q =
          quantize(xs.view({B * T, IC}), ScaleLayout::per_tensor, Fp8Format::e4m3, st.input.scale, MemCategory::workspace);
      const std::vector<float> ref = dequantize(q).to_float_vector();
      if (serve) {
        CHECK(r.served == ref);
      } else {
        CHECK(r.served == xs.to_float_vector());
      }
    }
    grad_of(y).copy_from(dy);
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    r.y = y->value.to_float_vector();
    r.dx = grad_of(x).to_float_vector();
    r.dw = grad_of(wv).to_float_vector();
    return r;
  };
  const Result s = run(true), p = run(false);
  CHECK(s.y == p.y);
  CHECK(s.dx == p.dx);
  CHECK(s.dw == p.dw);
  CHECK(s.served != p.served);  // the codes round: the check above is not vacuous
}

TEST_CASE("fp8: attention's backward reads the output a serving projection served", "[fp8]") {
  // qkv -> attention -> proj (serve_input) against the same with attention's output replaced, after the
  // projection read it, by the served values: identical qkv gradients; and different from the unserved
  // run's (the delta = rowsum(dO * O) of the FP8 O).
  std::mt19937 rng(12);
  const int B = 2, T = 8, C = 16, NH = 2;
  const Tensor qkv = randn(rng, {B, T, 3 * C}, 1.0f), w = randn(rng, {C, C}, 0.2f), dy = randn(rng, {B, T, C}, 1.0f);
  enum class Mode { served, replaced, plain };
  std::vector<float> served_o;
  auto run = [&](Mode mode) {
    Fp8LinearState st("proj", delayed());
    Var q = make_var(copy_of(qkv), true), wv = make_var(copy_of(w), true);
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      Var o = attention(q, NH);
      y = fp8_linear(o, wv, Var(), st, mode == Mode::served);
      if (mode == Mode::served) served_o = value_of(o).to_float_vector();
      if (mode == Mode::replaced) {
        REQUIRE(served_o.size() == static_cast<size_t>(B * T * C));
        std::copy(served_o.begin(), served_o.end(), o->value.data<float>());
      }
    }
    grad_of(y).copy_from(dy);
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    return grad_of(q).to_float_vector();
  };
  const std::vector<float> served = run(Mode::served), replaced = run(Mode::replaced), plain = run(Mode::plain);
  CHECK(served == replaced);
  CHECK(served != plain);
}
