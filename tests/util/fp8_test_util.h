// Helpers shared by the GPU FP8 tests (tests/fp8/*_gpu_test.cpp): device scale vectors, host-transposed
// codes, FP8 codes compared byte for byte, column sums and atomically accumulated gradients within
// reordered-f32 tolerance, and identical recorded FP8 statistics.
#pragma once
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fp8/scaling.h"
#include "gpu_test_util.h"

namespace fp8t::test {

// One fp8_linear step's output and gradients, on the host (a gradient not taken is empty).
struct LinearResult {
  std::vector<float> y, dx, dw, db;
};

// A 1-D f32 device tensor holding v: scales, scale slots and amax/scale/scale_inv triples.
inline Tensor device_floats(std::vector<float> v) { return upload(v, {static_cast<int64_t>(v.size())}, DType::f32); }

// The (cols, rows) transpose of row-major (rows, cols) FP8 codes, on the host.
inline std::vector<uint8_t> transpose_codes(const std::vector<uint8_t>& c, int64_t rows, int64_t cols) {
  std::vector<uint8_t> t(c.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) t[k * rows + r] = c[r * cols + k];
  return t;
}

// The bytes of a device tensor of any dtype (after the device's queued work).
inline std::vector<uint8_t> download_bytes(const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.nbytes()));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(v.data(), t.raw(), v.size(), cudaMemcpyDeviceToHost));
  return v;
}

// The bytes of a device tensor of FP8 codes (after the device's queued work).
inline std::vector<uint8_t> download_codes(const Tensor& t) { return download_bytes(t); }

// Codes that differ (a count, not a dump of megabyte vectors when a CHECK fails); -1 if the sizes differ.
inline int64_t code_mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref) {
  if (got.size() != ref.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != ref[i];
  return bad;
}

// Codes that differ other than as +0 / -0 (0x00 / 0x80: both decode to zero); -1 if the sizes differ.
inline int64_t code_mismatches_but_zero_sign(const std::vector<uint8_t>& got, const std::vector<uint8_t>& ref) {
  if (got.size() != ref.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != ref[i] && ((got[i] | ref[i]) & 0x7F) != 0;
  return bad;
}

// The saturation count a cast's kept statistics hold (kernels::cast_stats_floats' layout: the u64 two floats past the
// amax, at cast_stats_amax_index(cols)).
inline unsigned long long kept_saturated(const std::vector<float>& stats, int64_t amax_index) {
  unsigned long long n = 0;
  std::memcpy(&n, &stats[static_cast<size_t>(amax_index) + 2], 8);
  return n;
}

// Two kept cast statistics (a kernel writing dy codes, and the plain cast) with the same amax, bit for bit, and the
// same saturation count.
inline void check_same_kept_stats(const std::vector<float>& got, const std::vector<float>& want, int64_t amax_index) {
  CHECK(std::memcmp(&got[static_cast<size_t>(amax_index)], &want[static_cast<size_t>(amax_index)], 4) == 0);
  CHECK(kept_saturated(got, amax_index) == kept_saturated(want, amax_index));
}

// Column sums of a (rows, cols) matrix in double, and of its absolute values (colsum_mismatches' references).
inline void column_sums(const std::vector<float>& v, int64_t cols, std::vector<double>& sum,
                        std::vector<double>& abs_sum) {
  sum.assign(static_cast<size_t>(cols), 0.0);
  abs_sum.assign(static_cast<size_t>(cols), 0.0);
  for (size_t i = 0; i < v.size(); ++i) {
    sum[i % cols] += v[i];
    abs_sum[i % cols] += std::fabs(v[i]);
  }
}

// Columns whose device sum differs from prior + the double column sum by more than reordered f32
// additions allow (1e-5 of the column's absolute sum, prior included); a NaN or infinite reference
// must be matched as such.
inline int64_t colsum_mismatches(const std::vector<float>& got, const std::vector<float>& prior,
                                 const std::vector<double>& sum, const std::vector<double>& abs_sum) {
  if (got.size() != prior.size() || got.size() != sum.size()) return -1;
  int64_t bad = 0;
  for (size_t c = 0; c < got.size(); ++c) {
    const double want = double(prior[c]) + sum[c];
    if (std::isnan(want)) bad += !std::isnan(got[c]);
    else if (std::isinf(want)) bad += double(got[c]) != want;
    else bad += !(std::fabs(double(got[c]) - want) <= 1e-5 * (std::fabs(prior[c]) + abs_sum[c]));
  }
  return bad;
}

// The same with nothing there before (a zero-filled sum).
inline int64_t colsum_mismatches(const std::vector<float>& got, const std::vector<double>& sum,
                                 const std::vector<double>& abs_sum) {
  return colsum_mismatches(got, std::vector<float>(got.size(), 0.0f), sum, abs_sum);
}

// Elements of got beyond what reordering a few f32 partial sums of ref can change (1e-5 relative, with
// a floor of 1e-5 of ref's rms); -1 if the sizes differ.
inline int64_t reordered_mismatches(const std::vector<float>& got, const std::vector<float>& ref) {
  const double floor = 1e-5 * rms(ref);
  int64_t bad = got.size() == ref.size() ? 0 : -1;
  for (size_t i = 0; i < got.size() && bad >= 0; ++i)
    bad += !(std::fabs(double(got[i]) - ref[i]) <= 1e-5 * std::fabs(ref[i]) + floor);
  return bad;
}

// A fused and an unfused path recorded the same statistics for one tensor: amax bits, saturation
// count, scale and amax history.
inline void check_same_meta(const Fp8TensorMeta& a, const Fp8TensorMeta& b) {
  CHECK(std::memcmp(&a.last_amax, &b.last_amax, sizeof(float)) == 0);
  CHECK(a.last_saturated == b.last_saturated);
  CHECK(a.scale == b.scale);
  CHECK(a.history_oldest_first() == b.history_oldest_first());
}

}  // namespace fp8t::test
