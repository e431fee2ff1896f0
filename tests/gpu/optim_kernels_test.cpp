// AdamW update and the global-norm sum of squares against host loops.
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "gpu_test_util.h"
#include "kernels/adamw.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/stream.cuh"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("adamw matches a CPU loop - with decay mask and bf16 copy", "[gpu][adamw]") {
  for (int64_t n : {1, 1000, 1 << 20}) {
    auto p = randn(n), g = randn(n), m = randn(n, 0.1f), v = randn(n, 0.1f);
    for (auto& x : v) x = x * x;  // second moments are non-negative
    std::vector<uint8_t> mask(n);
    for (int64_t i = 0; i < n; ++i) mask[i] = (i % 3) != 0;
    Tensor tp = upload(p, {n}, DType::f32), tg = upload(g, {n}, DType::f32), tm = upload(m, {n}, DType::f32),
           tv = upload(v, {n}, DType::f32);
    Tensor tmask = Tensor::empty({n}, DType::e4m3, kGpu);  // 1-byte elements
    copy_bytes(tmask.raw(), kGpu, mask.data(), Device::cpu(), n);
    Tensor pbf = poisoned({n}, DType::bf16);
    const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    const int step = 7;
    kernels::adamw_update(tp.data<float>(), tg.data<float>(), tm.data<float>(), tv.data<float>(),
                          static_cast<const uint8_t*>(tmask.raw()), n, lr, b1, b2, eps, wd, gs, step,
                          pbf.data<__nv_bfloat16>(), kernels::compute_stream());
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g[i]) * gs;
      const double mi = b1 * double(m[i]) + (1 - b1) * gi, vi = b2 * double(v[i]) + (1 - b2) * gi * gi;
      const double mh = mi / (1 - std::pow(double(b1), step)), vh = vi / (1 - std::pow(double(b2), step));
      const double w = mask[i] ? wd : 0.0;
      p[i] = float(p[i] - lr * (mh / (std::sqrt(vh) + eps) + w * p[i]));
      m[i] = float(mi);
      v[i] = float(vi);
    }
    CHECK(rel_err(download(tp), p) < 1e-6);
    CHECK(rel_err(download(tm), m) < 1e-6);
    CHECK(rel_err(download(tv), v) < 1e-6);
    CHECK(rel_err(download(pbf), p) < 1e-2);
  }
}

TEST_CASE("global norm sums squares into a device scalar", "[gpu][global_norm]") {
  for (int64_t n : {1, 12345, 10 << 20}) {
    const auto x = randn(n);
    Tensor tx = upload(x, {n}, DType::f32);
    Tensor out = Tensor::zeros({1}, DType::f32, kGpu);
    kernels::global_norm_squared(out.data<float>(), tx.data<float>(), n, kernels::compute_stream());
    kernels::global_norm_squared(out.data<float>(), tx.data<float>(), n, kernels::compute_stream());  // accumulates
    double ref = 0.0;
    for (float v : x) ref += double(v) * v;
    CHECK(std::abs(download(out)[0] - 2 * ref) / (2 * ref) < 1e-5);
  }
}
