// Test helpers for ops: random f64/f32 tensors, a gradient check that runs an op through the real tape
// and compares every input gradient to central finite differences in double precision, and the same op
// in f32 against f64.
#pragma once
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace fp8t::test {

// Uniform values in [lo, hi), never all zeros.
inline Tensor random_tensor(std::mt19937& rng, Shape shape, DType dtype = DType::f64, double lo = -1.0,
                            double hi = 1.0) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::f64) t.data<double>()[i] = u(rng);
    else t.data<float>()[i] = static_cast<float>(u(rng));
  }
  return t;
}

inline Tensor random_ints(std::mt19937& rng, Shape shape, int32_t hi) {
  Tensor t = Tensor::empty(std::move(shape), DType::i32);
  std::uniform_int_distribution<int32_t> u(0, hi - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = u(rng);
  return t;
}

// Host values of any float tensor as doubles (f64 read exactly).
inline std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f64) {
    std::copy(t.data<double>(), t.data<double>() + t.numel(), v.begin());
  } else {
    const std::vector<float> f = t.to_float_vector();
    std::copy(f.begin(), f.end(), v.begin());
  }
  return v;
}

inline double dot(const Tensor& a, const std::vector<double>& w) {
  const std::vector<double> v = to_doubles(a);
  double s = 0.0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

using OpFn = std::function<Var(const std::vector<Var>&)>;

// Checks d(sum(f(inputs) * R))/d(input) for every input with requires_grad, R random.
// Elementwise tolerance |analytic - numeric| <= rtol * max(|analytic|, |numeric|, floor).
inline void gradcheck(const std::vector<Var>& inputs, const OpFn& f, uint32_t seed = 7, double eps = 1e-6,
                      double rtol = 1e-5, double floor = 1e-3) {
  std::mt19937 rng(seed);
  Tape tape;
  Var out;
  {
    TapeScope scope(&tape);
    out = f(inputs);
  }
  REQUIRE(out->requires_grad);
  REQUIRE(tape.size() > 0);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> R(static_cast<size_t>(out->value.numel()));
  for (double& r : R) r = u(rng);
  Tensor seed_grad = Tensor::empty(out->value.shape(), DType::f64);
  std::copy(R.begin(), R.end(), seed_grad.data<double>());
  grad_of(out).copy_from(seed_grad);
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  auto loss = [&] {
    NoGradScope ng;
    return dot(f(inputs)->value, R);
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Var& in = inputs[k];
    if (!in->requires_grad) continue;
    REQUIRE(in->grad.defined());
    const std::vector<double> analytic = to_doubles(in->grad);
    double* x = in->value.data<double>();
    int bad = 0;
    for (int64_t i = 0; i < in->value.numel(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double lp = loss();
      x[i] = x0 - eps;
      const double lm = loss();
      x[i] = x0;
      const double numeric = (lp - lm) / (2 * eps);
      const double a = analytic[static_cast<size_t>(i)];
      const double tol = rtol * std::max({std::abs(a), std::abs(numeric), floor});
      if (std::abs(a - numeric) > tol && bad++ < 5) {
        INFO("input " << k << " (" << in->value.str() << ") element " << i << ": analytic " << a << " numeric "
                      << numeric);
        CHECK(std::abs(a - numeric) <= tol);
      }
    }
    CHECK(bad == 0);
  }
}

// Max over elements of |a - b| / (|b| + 0.1 * max|b|): a relative error that tolerates cancellation.
inline double rel_err(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = to_doubles(a), vb = to_doubles(b);
  double mx = 0.0;
  for (double v : vb) mx = std::max(mx, std::abs(v));
  double e = 0.0;
  for (size_t i = 0; i < va.size(); ++i)
    e = std::max(e, std::abs(va[i] - vb[i]) / (std::abs(vb[i]) + 0.1 * mx + 1e-30));
  return e;
}

// A leaf of the graph that needs a gradient.
inline Var leaf(Tensor t) { return make_var(std::move(t), true); }

// Forward + backward (seed R) in f64 and in f32 from the same values; outputs and every gradient
// must agree to FP32 accuracy.
inline void check_f32_matches_f64(const std::vector<Tensor>& values, const OpFn& f, double tol = 1e-5) {
  std::vector<Tensor> outs, grads[2];
  std::mt19937 rng(99);
  Tensor R;
  for (int pass = 0; pass < 2; ++pass) {
    const DType dt = pass == 0 ? DType::f64 : DType::f32;
    std::vector<Var> vars;
    for (const Tensor& v : values) vars.push_back(leaf(cast(v, dt)));
    Tape tape;
    Var out;
    {
      TapeScope scope(&tape);
      out = f(vars);
    }
    if (!R.defined()) R = random_tensor(rng, out->value.shape());
    grad_of(out).copy_from(cast(R, dt));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    outs.push_back(out->value);
    for (const Var& v : vars) grads[pass].push_back(grad_of(v));
  }
  INFO("output");
  CHECK(rel_err(outs[1], outs[0]) <= tol);
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("gradient of input " << i);
    CHECK(rel_err(grads[1][i], grads[0][i]) <= tol);
  }
}

}  // namespace fp8t::test
