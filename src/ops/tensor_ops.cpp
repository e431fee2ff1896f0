// Tensor utilities without autograd: zeros_like, fill_, add_, scale_, cast, first_nonfinite. On the host they
// accept f32, f64 and bf16 in any combination; CUDA tensors go to cuda_ops.
#include <cmath>
#include <cstring>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_optim.h"
#endif

namespace fp8t {

namespace {

double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::f64: return t.data<double>()[i];
    case DType::bf16: return bf16_to_float(t.data<uint16_t>()[i]);
    default: FP8T_FAIL("expected an f32, f64 or bf16 tensor, got {}", t.str());
  }
}

void store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.data<float>()[i] = static_cast<float>(v); return;
    case DType::f64: t.data<double>()[i] = v; return;
    case DType::bf16: t.data<uint16_t>()[i] = float_to_bf16(static_cast<float>(v)); return;
    default: FP8T_FAIL("expected an f32, f64 or bf16 tensor, got {}", t.str());
  }
}

bool is_host_float(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::bf16; }

void check_host_float(const Tensor& t, const char* op) {
  FP8T_CHECK(is_host_float(t.dtype()), "{}: expected an f32, f64 or bf16 tensor, got {}", op, t.str());
}

}  // namespace

Tensor zeros_like(const Tensor& t, DType dtype) {
  return Tensor::zeros(t.shape(), dtype, t.device(), MemCategory::activations);
}

void fill_(Tensor& t, float value) {
  if (t.device().is_cuda()) {
    FP8T_ON_CUDA("fill_", cuda_ops::fill(t, value));
    return;
  }
  check_host_float(t, "fill_");
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) store(t, i, value);
}

void add_(Tensor& dst, const Tensor& src) {
  FP8T_CHECK(dst.numel() == src.numel(), "add_: {} += {}: element counts differ", dst.str(), src.str());
  FP8T_CHECK(dst.device() == src.device(), "add_: {} += {}: tensors are on different devices", dst.str(),
             src.str());
  if (dst.device().is_cuda()) {
    FP8T_ON_CUDA("add_", cuda_ops::add_inplace(dst, src));
    return;
  }
  check_host_float(dst, "add_");
  check_host_float(src, "add_");
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::f32 && src.dtype() == DType::f32) {
    float* d = dst.data<float>();
    const float* s = src.data<float>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
  if (dst.dtype() == DType::f64 && src.dtype() == DType::f64) {
    double* d = dst.data<double>();
    const double* s = src.data<double>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) store(dst, i, load(dst, i) + load(src, i));
}

void scale_(Tensor& t, float s) {
  if (t.device().is_cuda()) {
    FP8T_ON_CUDA("scale_", cuda_ops::scale_inplace(t, s));
    return;
  }
  check_host_float(t, "scale_");
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) store(t, i, load(t, i) * s);
}

Tensor cast(const Tensor& t, DType dtype, MemCategory cat) {
  Tensor out = Tensor::empty(t.shape(), dtype, t.device(), cat);
  cast_into(out, t);
  return out;
}

void cast_into(Tensor& dst, const Tensor& t) {
  const DType dtype = dst.dtype();
  FP8T_CHECK(dst.numel() == t.numel() && dst.device() == t.device(), "cast_into: {} into {}", t.str(), dst.str());
  if (t.dtype() == dtype) {
    dst.copy_from(t);
    return;
  }
  if (t.device().is_cuda()) {
    FP8T_CHECK((t.dtype() == DType::f32 && dtype == DType::bf16) || (t.dtype() == DType::bf16 && dtype == DType::f32),
               "cast: on CUDA only f32 <-> bf16 is supported, asked {} -> {}", t.str(), dtype_name(dtype));
    FP8T_ON_CUDA("cast", cuda_ops::cast(dst, t));
    return;
  }
  check_host_float(t, "cast");
  FP8T_CHECK(is_host_float(dtype), "cast: {} -> {} is not supported (f32, f64 and bf16 only)", t.str(),
             dtype_name(dtype));
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) store(dst, i, load(t, i));
}

std::optional<int64_t> first_nonfinite(const Tensor& t) {
  if (!t.defined() || !is_host_float(t.dtype())) return std::nullopt;
  if (t.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    if (t.dtype() != DType::f64 && std::isfinite(cuda_ops::sum_squares(t.raw(), t.dtype(), t.numel())))
      return std::nullopt;
    return first_nonfinite(t.to(Device::cpu(), MemCategory::workspace));
#else
    FP8T_FAIL("first_nonfinite: tensor is on a CUDA device but this build has no CUDA");
#endif
  }
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(load(t, i))) return i;
  return std::nullopt;
}

}  // namespace fp8t
