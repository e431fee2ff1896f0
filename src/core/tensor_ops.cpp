// Tensor utilities without autograd (core/tensor_ops.h): the host loops here, CUDA tensors to the kernels.
#include "core/tensor_ops.h"

#include <cmath>
#include <cstring>

#ifdef FP8T_HAVE_CUDA
#include "core/cuda_check.h"
#include "kernels/elementwise.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/stream.cuh"
#endif

namespace fp8t {

namespace {

#ifdef FP8T_HAVE_CUDA
namespace k = kernels;
void expect_cuda_float(const Tensor& t, const char* op) {
  FP8T_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "{}: a CUDA tensor must be f32 or bf16, got {}", op,
             t.str());
}
#define FP8T_CUDA_ONLY(op, ...) __VA_ARGS__
#else
#define FP8T_CUDA_ONLY(op, ...) \
  FP8T_FAIL("{}: tensor is on a CUDA device but this build has no CUDA (reconfigure with -DFP8T_CUDA=ON)", op)
#endif

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
    FP8T_CUDA_ONLY("fill_", expect_cuda_float(t, "fill_");
                   k::fill(t.raw(), t.dtype(), static_cast<size_t>(t.numel()), value, k::compute_stream()));
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
    FP8T_CUDA_ONLY("add_", expect_cuda_float(dst, "add_"); expect_cuda_float(src, "add_");
                   k::add_inplace(dst.raw(), dst.dtype(), src.raw(), src.dtype(), static_cast<size_t>(dst.numel()),
                                  k::compute_stream()));
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

void add_runs_(Tensor& dst, const Tensor& src, const std::vector<AddRun>& runs) {
  FP8T_CHECK(dst.dtype() == DType::bf16 && src.dtype() == DType::f32 && dst.device() == src.device(),
             "add_runs_: {} += {}: needs a bf16 dst and an f32 src on one device", dst.str(), src.str());
  for (const AddRun& r : runs)
    FP8T_CHECK(r.n >= 0 && r.src_offset >= 0 && r.dst_offset >= 0 && r.src_offset + int64_t{r.n} <= src.numel() &&
                   r.dst_offset + r.n <= dst.numel(),
               "add_runs_: run ({} from {}, {} long) lies outside {} += {}", r.dst_offset, r.src_offset, r.n,
               dst.str(), src.str());
  if (runs.empty()) return;
  if (dst.device().is_cuda()) {
    FP8T_CUDA_ONLY("add_runs_", k::add_runs(static_cast<uint16_t*>(dst.raw()), src.data<float>(), runs.data(),
                                            static_cast<int>(runs.size()), k::compute_stream()));
    return;
  }
  for (const AddRun& r : runs)
    for (int32_t i = 0; i < r.n; ++i)
      store(dst, r.dst_offset + i, load(dst, r.dst_offset + i) + load(src, r.src_offset + i));
}

void zero_runs_(Tensor& dst, const std::vector<ZeroRun>& runs) {
  const size_t elem = dtype_size(dst.dtype());
  for (const ZeroRun& r : runs)
    FP8T_CHECK(r.n >= 0 && r.offset >= 0 && r.offset + r.n <= dst.numel(),
               "zero_runs_: run ({}, {} long) lies outside {}", r.offset, r.n, dst.str());
  if (runs.empty()) return;
  if (dst.device().is_cuda()) {
    FP8T_CUDA_ONLY("zero_runs_", k::zero_runs(dst.raw(), static_cast<int>(elem), runs.data(),
                                              static_cast<int>(runs.size()), k::compute_stream()));
    return;
  }
  for (const ZeroRun& r : runs)
    std::memset(static_cast<char*>(dst.raw()) + r.offset * elem, 0, static_cast<size_t>(r.n) * elem);
}

void scale_(Tensor& t, float s) {
  if (t.device().is_cuda()) {
    FP8T_CUDA_ONLY("scale_", expect_cuda_float(t, "scale_");
                   k::scale_inplace(t.raw(), t.dtype(), static_cast<size_t>(t.numel()), s, k::compute_stream()));
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
    FP8T_CUDA_ONLY("cast", k::cast(dst.raw(), dst.dtype(), t.raw(), t.dtype(), static_cast<size_t>(t.numel()),
                                   k::compute_stream()));
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
    if (t.dtype() != DType::f64 && std::isfinite(sum_squares(t, 0, t.numel()))) return std::nullopt;
    return first_nonfinite(t.to(Device::cpu(), MemCategory::workspace));
  }
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(load(t, i))) return i;
  return std::nullopt;
}

namespace {
void check_sum_squares(const Tensor& t, int64_t begin, int64_t end) {
  FP8T_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "sum_squares needs f32 or bf16, got {}", t.str());
  FP8T_CHECK(0 <= begin && begin <= end && end <= t.numel(), "sum_squares: range [{}, {}) outside {}", begin, end,
             t.str());
}
}  // namespace

void sum_squares_into(const Tensor& t, int64_t begin, int64_t end, Tensor& out) {
  check_sum_squares(t, begin, end);
  FP8T_CHECK(t.device().is_cuda() && out.device() == t.device() && out.dtype() == DType::f32 && out.numel() == 1,
             "sum_squares_into: t {} must be on a CUDA device and out {} one f32 element there", t.str(), out.str());
#ifdef FP8T_HAVE_CUDA
  const char* x = static_cast<const char*>(t.raw()) + begin * static_cast<int64_t>(dtype_size(t.dtype()));
  const auto n = static_cast<size_t>(end - begin);
  CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, sizeof(float), k::compute_stream()));  // the kernel adds into it
  if (t.dtype() == DType::f32)
    k::global_norm_squared(out.data<float>(), reinterpret_cast<const float*>(x), n, k::compute_stream());
  else
    k::global_norm_squared(out.data<float>(), reinterpret_cast<const __nv_bfloat16*>(x), n, k::compute_stream());
#else
  FP8T_FAIL("sum_squares_into: this build has no CUDA");
#endif
}

double sum_squares(const Tensor& t, int64_t begin, int64_t end) {
  check_sum_squares(t, begin, end);
  if (t.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    Tensor acc = Tensor::empty({1}, DType::f32, t.device(), MemCategory::workspace);
    sum_squares_into(t, begin, end, acc);
    float host = 0;
    CUDA_CHECK(cudaMemcpyAsync(&host, acc.data<float>(), sizeof(float), cudaMemcpyDeviceToHost, k::compute_stream()));
    CUDA_CHECK(cudaStreamSynchronize(k::compute_stream()));
    return host;
#else
    FP8T_FAIL("sum_squares: tensor is on a CUDA device but this build has no CUDA (reconfigure with -DFP8T_CUDA=ON)");
#endif
  }
  double acc = 0.0;
  if (t.dtype() == DType::f32) {
    const float* x = t.data<float>();
#pragma omp parallel for reduction(+ : acc) schedule(static)
    for (int64_t i = begin; i < end; ++i) acc += static_cast<double>(x[i]) * x[i];
  } else {
    const uint16_t* x = t.data<uint16_t>();
#pragma omp parallel for reduction(+ : acc) schedule(static)
    for (int64_t i = begin; i < end; ++i) {
      const double xi = bf16_to_float(x[i]);
      acc += xi * xi;
    }
  }
  return acc;
}

}  // namespace fp8t
