// Tensor: a contiguous, typed view into reference-counted storage from a category-tagged allocator.
// Views (reshape, flat slices) share storage, so parameters and gradients can be carved from one
// flat buffer and a ZeRO shard is just an offset and a length.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"

namespace fp8t {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Owns one allocation; returns it to its allocator when the last view goes away.
class Storage {
 public:
  Storage(size_t bytes, Device device, MemCategory cat);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return cat_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  MemCategory cat_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu(),
                      MemCategory cat = MemCategory::activations);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu(),
                      MemCategory cat = MemCategory::activations);
  // Host f32 tensor holding `values` (tests and small constants).
  static Tensor from_vector(const std::vector<float>& values, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  // How many tensors (this one, its views and copies) share this storage; 0 when undefined.
  long storage_use_count() const { return storage_.use_count(); }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  MemCategory category() const { return storage_->category(); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }

  // Same storage, new shape (numel must match).
  Tensor view(Shape shape) const;
  // A contiguous range of `shape` elements starting at element `offset` of this (flattened) tensor.
  Tensor slice_flat(int64_t offset, Shape shape) const;

  void zero_();
  void copy_from(const Tensor& src);  // same dtype and numel; any devices
  Tensor to(Device d, MemCategory cat = MemCategory::activations) const;
  // Host f32/f64 copy with values converted (reads bf16/fp8 exactly); fp8 is decoded without scale.
  std::vector<float> to_float_vector() const;
  std::string str() const;  // "f32[2, 3] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::f32;
};

// Byte copy between any two devices (host<->device through CUDA when built with it).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n);

}  // namespace fp8t
