// Tensor: shapes, views and flat slices sharing storage, copies across dtypes' bytes, host conversion, and
// the errors for views that do not fit.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "core/check.h"
#include "core/tensor.h"
#include "core/tensor_ops.h"

using namespace fp8t;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("tensor: shape, dims and bytes", "[core][tensor]") {
  const Tensor t = Tensor::zeros({2, 3, 4}, DType::bf16);
  CHECK(t.defined());
  CHECK(t.ndim() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.dim(0) == 2);
  CHECK(t.dim(-1) == 4);
  CHECK(t.nbytes() == 48);
  CHECK(t.device().is_cpu());
  CHECK(t.str() == "bf16[2, 3, 4] cpu");
  for (float x : t.to_float_vector()) CHECK(x == 0.0f);
  CHECK_FALSE(Tensor().defined());
}

TEST_CASE("tensor: views and flat slices share storage", "[core][tensor]") {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor v = t.view({3, 2});
  CHECK(v.raw() == t.raw());
  CHECK(v.dim(0) == 3);
  Tensor s = t.slice_flat(2, {2, 2});
  CHECK(s.data<float>()[0] == 2.0f);
  s.data<float>()[3] = 50.0f;  // element 5 of t
  CHECK(t.data<float>()[5] == 50.0f);
  Tensor ss = s.slice_flat(1, {2});  // a slice of a slice keeps counting from its own start
  CHECK(ss.data<float>()[0] == 3.0f);
  CHECK_THROWS_WITH(t.view({4, 2}), ContainsSubstring("cannot view [2, 3] as [4, 2]"));
  CHECK_THROWS(t.slice_flat(5, {2}));
  CHECK_THROWS(t.slice_flat(-1, {1}));
}

TEST_CASE("tensor: copy_from and to() copy values, not storage", "[core][tensor]") {
  Tensor a = Tensor::from_vector({1.5f, -2.0f, 3.25f}, {3});
  Tensor b = Tensor::zeros({3}, DType::f32);
  b.copy_from(a);
  a.data<float>()[0] = 9.0f;
  CHECK(b.to_float_vector() == std::vector<float>{1.5f, -2.0f, 3.25f});
  Tensor c = b.to(Device::cpu());
  CHECK(c.raw() != b.raw());
  CHECK(c.to_float_vector() == b.to_float_vector());
  Tensor wrong = Tensor::zeros({4}, DType::f32);
  CHECK_THROWS(wrong.copy_from(a));
  Tensor other_dtype = Tensor::zeros({3}, DType::bf16);
  CHECK_THROWS(other_dtype.copy_from(a));
  b.zero_();
  for (float x : b.to_float_vector()) CHECK(x == 0.0f);
}

TEST_CASE("tensor utilities: fill, add, scale, cast and the first non-finite element", "[core][tensor]") {
  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {4});
  Tensor b = Tensor::from_vector({0.5f, 0.5f, 0.5f, 0.5f}, {4});
  add_(a, b);
  scale_(a, 2.0f);
  CHECK(a.to_float_vector() == std::vector<float>{3, 5, 7, 9});
  Tensor h = cast(a, DType::bf16);
  CHECK(h.dtype() == DType::bf16);
  CHECK(h.to_float_vector() == a.to_float_vector());  // small integers are exact in bf16
  fill_(h, -1.25f);
  CHECK(h.to_float_vector() == std::vector<float>{-1.25f, -1.25f, -1.25f, -1.25f});
  CHECK(sum_squares(a, 1, 3) == 25.0 + 49.0);
  CHECK_FALSE(first_nonfinite(a).has_value());
  a.data<float>()[2] = std::numeric_limits<float>::infinity();
  CHECK(first_nonfinite(a) == 2);
  CHECK_THROWS_WITH(add_(a, Tensor::zeros({3}, DType::f32)), ContainsSubstring("element counts differ"));
}
