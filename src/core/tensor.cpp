// Tensor storage, views and host-side conversions.
#include "core/tensor.h"

#include <cstring>

#include "core/graph_capture.h"
#ifdef FP8T_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/stream.cuh"
#endif

namespace fp8t {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Storage::Storage(size_t bytes, Device device, MemCategory cat) : bytes_(bytes), device_(device), cat_(cat) {
  ptr_ = allocator_for(device).allocate(bytes, cat);
}

Storage::~Storage() { allocator_for(device_).deallocate(ptr_, bytes_, cat_); }

Tensor Tensor::empty(Shape shape, DType dtype, Device device, MemCategory cat) {
  for (int64_t d : shape) FP8T_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device, cat);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device, MemCategory cat) {
  Tensor t = empty(std::move(shape), dtype, device, cat);
  t.zero_();
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, Shape shape) {
  FP8T_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), "from_vector: {} values for shape {}",
             values.size(), shape_str(shape));
  Tensor t = empty(std::move(shape), DType::f32);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::view(Shape shape) const {
  FP8T_CHECK(shape_numel(shape) == numel(), "view: cannot view {} as {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_flat(int64_t offset, Shape shape) const {
  FP8T_CHECK(offset >= 0 && offset + shape_numel(shape) <= numel(), "slice_flat: [{}, +{}) outside {} elements",
             offset, shape_numel(shape), numel());
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(offset) * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::zero_() {
  if (numel() == 0) return;
#ifdef FP8T_HAVE_CUDA
  if (device().is_cuda()) {
    // Inside a CUDA graph's capture on the compute stream (core/graph_capture.h); elsewhere on the legacy
    // stream, which orders with every stream that may use the tensor.
    const cudaError_t err = graph_capturing() ? cudaMemsetAsync(raw(), 0, nbytes(), kernels::compute_stream())
                                              : cudaMemset(raw(), 0, nbytes());
    FP8T_CHECK(err == cudaSuccess, "cudaMemset failed: {}", cudaGetErrorString(err));
    return;
  }
#endif
  std::memset(raw(), 0, nbytes());
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n) {
  if (n == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
#ifdef FP8T_HAVE_CUDA
  if (graph_capturing()) {
    FP8T_CHECK(!dst_dev.is_cpu() && !src_dev.is_cpu(), "a copy of {} bytes between the host and {} inside a "
               "captured training step (train.cuda_graph): a replay would not redo it; set train.cuda_graph: false",
               n, dst_dev.is_cpu() ? src_dev.str() : dst_dev.str());
    const cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, kernels::compute_stream());
    FP8T_CHECK(err == cudaSuccess, "cudaMemcpyAsync of {} bytes failed: {}", n, cudaGetErrorString(err));
    return;
  }
  const cudaError_t err = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  FP8T_CHECK(err == cudaSuccess, "cudaMemcpy of {} bytes failed: {}", n, cudaGetErrorString(err));
#else
  FP8T_FAIL("copy to or from {} needs a CUDA build", dst_dev.is_cpu() ? src_dev.str() : dst_dev.str());
#endif
}

void Tensor::copy_from(const Tensor& src) {
  FP8T_CHECK(src.dtype() == dtype_ && src.numel() == numel(), "copy_from: {} into {}", src.str(), str());
  copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
}

Tensor Tensor::to(Device d, MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, d, cat);
  t.copy_from(*this);
  return t;
}

std::vector<float> Tensor::to_float_vector() const {
  const Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<float> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (dtype_) {
      case DType::f32: out[i] = host.data<float>()[i]; break;
      case DType::f64: out[i] = static_cast<float>(host.data<double>()[i]); break;
      case DType::bf16: out[i] = bf16_to_float(host.data<uint16_t>()[i]); break;
      case DType::e4m3: out[i] = fp8_to_float(host.data<uint8_t>()[i], Fp8Format::e4m3); break;
      case DType::e5m2: out[i] = fp8_to_float(host.data<uint8_t>()[i], Fp8Format::e5m2); break;
      case DType::i32: out[i] = static_cast<float>(host.data<int32_t>()[i]); break;
    }
  }
  return out;
}

std::string Tensor::str() const {
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_str(shape_), device().str());
}

}  // namespace fp8t
