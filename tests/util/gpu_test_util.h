// Helpers for GPU kernel tests: fresh random inputs, device uploads, poisoned outputs, error norms.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/tensor.h"
#include "kernels/stream.cuh"

namespace fp8t::test {

inline std::mt19937_64& rng() {
  static std::mt19937_64 gen{std::random_device{}()};  // fresh inputs every run
  return gen;
}

// Normal(0, scale) values, never all zero.
inline std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

inline std::vector<int32_t> randint(size_t n, int32_t hi) {
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

inline const Device kGpu = Device::cuda(0);

// Device tensor of `dtype` (f32 or bf16) holding v (rounded for bf16).
inline Tensor upload(const std::vector<float>& v, Shape shape, DType dtype) {
  Tensor host = Tensor::empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::bf16)
      host.data<uint16_t>()[i] = float_to_bf16(v[i]);
    else
      host.data<float>()[i] = v[i];
  }
  return host.to(kGpu);
}

inline Tensor upload_i32(const std::vector<int32_t>& v, Shape shape) {
  Tensor host = Tensor::empty(shape, DType::i32);
  std::memcpy(host.raw(), v.data(), v.size() * sizeof(int32_t));
  return host.to(kGpu);
}

// Uninitialised device tensor filled with 0xFF bytes (NaN in f32 and bf16).
inline Tensor poisoned(Shape shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, kGpu);
  CUDA_CHECK(cudaMemset(t.raw(), 0xFF, t.nbytes()));
  return t;
}

inline std::vector<float> download(const Tensor& t) {
  CUDA_CHECK(cudaDeviceSynchronize());
  return t.to_float_vector();
}

// ||out - ref|| / ||ref||; +inf when out holds a NaN or Inf (an unwritten or broken element).
inline double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = double(out[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double rms(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / std::max<size_t>(v.size(), 1));
}

// Milliseconds per call of run() on the compute stream, by CUDA events around `iters` calls after two warm-up calls:
// for the hidden [.bench] cases, which print what they measure (no timed test passes or fails on a time).
template <typename Run>
float time_ms(Run&& run, int iters) {
  for (int warm = 0; warm < 2; ++warm) run();
  CudaEvent e0 = make_event(true), e1 = make_event(true);
  const cudaStream_t s = kernels::compute_stream();
  CUDA_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) run();
  CUDA_CHECK(cudaEventRecord(e1, s));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms / iters;
}

}  // namespace fp8t::test
