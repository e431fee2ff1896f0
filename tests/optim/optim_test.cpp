// AdamW, learning-rate schedules and gradient norms against hand-worked values.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <cmath>

#include "optim/adamw.h"
#include "optim/schedule.h"

using namespace fp8t;
using Catch::Approx;

TEST_CASE("optim: warmup then cosine / linear decay to min_lr_ratio", "[optim]") {
  OptimConfig c;
  c.lr = 1.0;
  c.min_lr_ratio = 0.1;
  c.warmup_steps = 10;
  CHECK(lr_at(c, 0, 110) == Approx(0.1));
  CHECK(lr_at(c, 9, 110) == Approx(1.0));
  CHECK(lr_at(c, 10, 110) == Approx(1.0));
  CHECK(lr_at(c, 109, 110) == Approx(0.1));
  CHECK(lr_at(c, 10 + 99 / 2, 110) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 49.0 / 99))));
  c.schedule = Schedule::linear;
  CHECK(lr_at(c, 109, 110) == Approx(0.1));
  CHECK(lr_at(c, 10 + 33, 110) == Approx(1.0 - 0.9 * 33.0 / 99));
  c.schedule = Schedule::constant;
  CHECK(lr_at(c, 80, 110) == Approx(1.0));
}

TEST_CASE("optim: AdamW step matches the closed form - no decay on biases/norms", "[optim]") {
  std::vector<ParamSpec> specs = {{"w", {2, 2}, true}, {"b", {3}, false}};
  ParameterStore P(specs, Device::cpu(), DType::f32, 4);  // 7 -> padded 8
  REQUIRE(P.padded_numel() == 8);
  for (int i = 0; i < 7; ++i) {
    P.master().data<float>()[i] = 1.0f + i;
    P.grads().data<float>()[i] = 0.5f - 0.25f * i;
  }
  OptimConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  AdamW opt(c, P, 0, P.padded_numel());
  opt.step(1, 0.01, 2.0);
  for (int i = 0; i < 7; ++i) {
    const double g = 2.0 * (0.5 - 0.25 * i);
    const double m = 0.1 * g, v = 0.05 * g * g;
    const double mhat = m / 0.1, vhat = v / 0.05;
    const double wd = i < 4 ? 0.1 : 0.0;
    const double expect = (1.0 + i) - 0.01 * (mhat / (std::sqrt(vhat) + 1e-8) + wd * (1.0 + i));
    CHECK(P.master().data<float>()[i] == Approx(expect).epsilon(1e-6));
  }
  CHECK(P.master().data<float>()[7] == 0.0f);  // padding stays put
  CHECK(sum_squares(P.grads(), 0, 7) == Approx(0.25 + 0.0625 + 0 + 0.0625 + 0.25 + 0.5625 + 1.0));
}

TEST_CASE("optim: an AdamW over two shards equals one over the whole buffer", "[optim]") {
  std::vector<ParamSpec> specs = {{"w", {5, 3}, true}, {"b", {5}, false}, {"g", {4}, false}};
  ParameterStore A(specs, Device::cpu(), DType::f32, 2), B(specs, Device::cpu(), DType::f32, 2);
  for (int64_t i = 0; i < A.numel(); ++i) {
    A.master().data<float>()[i] = B.master().data<float>()[i] = std::sin(1.0f + i);
    A.grads().data<float>()[i] = B.grads().data<float>()[i] = std::cos(3.0f * i);
  }
  OptimConfig c;
  AdamW whole(c, A, 0, A.padded_numel());
  const int64_t half = B.padded_numel() / 2;
  AdamW s0(c, B, 0, half), s1(c, B, half, B.padded_numel());
  for (int step = 1; step <= 3; ++step) {
    whole.step(step, 1e-2, 0.5);
    s0.step(step, 1e-2, 0.5);
    s1.step(step, 1e-2, 0.5);
  }
  for (int64_t i = 0; i < A.padded_numel(); ++i) REQUIRE(A.master().data<float>()[i] == B.master().data<float>()[i]);
  CHECK(s0.m().numel() == half);
}
