// QuantizedTensor: scale layouts, the host quantize/decode/dequantize of every layout, and the CUDA
// dequantize of the layouts that have a kernel.
#include "fp8/quantized_tensor.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "fp8/quantize.h"
#include "fp8/scaling.h"
#ifdef FP8T_HAVE_CUDA
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_saved.cuh"
#include "kernels/stream.cuh"
#endif

namespace fp8t {

namespace {

constexpr int64_t kBlock = 128;
constexpr int64_t kParallelMin = 1 << 15;  // elements; below this the host loops stay on one thread

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The (rows, cols) extent of one scale's block.
struct BlockExtent {
  int64_t rows, cols;
};

BlockExtent block_extent(ScaleLayout layout, int64_t rows, int64_t cols) {
  switch (layout) {
    case ScaleLayout::per_tensor: return {std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
    case ScaleLayout::per_row: return {1, std::max<int64_t>(cols, 1)};
    case ScaleLayout::block_1x128: return {1, kBlock};
    case ScaleLayout::block_128x128: return {kBlock, kBlock};
  }
  FP8T_FAIL("unknown scale layout {}", static_cast<int>(layout));
}

Shape logical_shape(const Tensor& x) { return x.ndim() == 0 ? Shape{1} : x.shape(); }

// Codes and scales of the blocks of x (rows, cols), each with a current scale fmax / amax(block).
Fp8CastStats quantize_blocks(const float* x, int64_t rows, int64_t cols, BlockExtent e, Fp8Format f, uint8_t* codes,
                             float* scale_inv) {
  const int64_t brows = ceil_div(rows, e.rows), bcols = ceil_div(cols, e.cols);
  float amax_all = 0.0f;
  bool nan = false;
  int64_t saturated = 0;
#pragma omp parallel for schedule(static) reduction(max : amax_all) reduction(|| : nan) reduction(+ : saturated) \
    if (brows > 1 && rows * cols > kParallelMin)
  for (int64_t br = 0; br < brows; ++br) {
    const int64_t r0 = br * e.rows, r1 = std::min(rows, r0 + e.rows);
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t c0 = bc * e.cols, n = std::min(cols, c0 + e.cols) - c0;
      float amax = 0.0f;
      for (int64_t r = r0; r < r1 && !std::isnan(amax); ++r) {
        const float a = fp8_amax(x + r * cols + c0, n);
        amax = std::isnan(a) ? a : std::max(amax, a);
      }
      const float scale = fp8_scale_from_amax(amax, fp8_max(f), 0, 1.0f);
      scale_inv[br * bcols + bc] = 1.0f / scale;
      for (int64_t r = r0; r < r1; ++r)
        saturated += fp8_quantize(x + r * cols + c0, n, scale, f, codes + r * cols + c0).saturated;
      if (std::isnan(amax)) nan = true;
      else amax_all = std::max(amax_all, amax);
    }
  }
  return {nan ? NAN : amax_all, saturated};
}

}  // namespace

const char* scale_layout_name(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::per_tensor: return "per_tensor";
    case ScaleLayout::per_row: return "per_row";
    case ScaleLayout::block_1x128: return "block_1x128";
    case ScaleLayout::block_128x128: return "block_128x128";
  }
  return "?";
}

Shape scale_shape(ScaleLayout layout, int64_t rows, int64_t cols) {
  switch (layout) {
    case ScaleLayout::per_tensor: return {1};
    case ScaleLayout::per_row: return {rows};
    case ScaleLayout::block_1x128: return {rows, ceil_div(cols, kBlock)};
    case ScaleLayout::block_128x128: return {ceil_div(rows, kBlock), ceil_div(cols, kBlock)};
  }
  FP8T_FAIL("unknown scale layout {}", static_cast<int>(layout));
}

float QuantizedTensor::tensor_scale_inv() const {
  FP8T_CHECK(layout == ScaleLayout::per_tensor && scale_inv.defined() && scale_inv.numel() == 1,
             "QuantizedTensor: tensor_scale_inv of a {} tensor with scales {}", scale_layout_name(layout),
             scale_inv.defined() ? scale_inv.str() : "(none)");
  return scale_inv.device().is_cpu() ? scale_inv.data<float>()[0] : scale_inv.to_float_vector()[0];
}

QuantizedTensor quantize(const Tensor& x, ScaleLayout layout, Fp8Format f, float scale, MemCategory cat,
                         Fp8CastStats* stats) {
  FP8T_CHECK(x.device().is_cpu() && x.dtype() == DType::f32, "quantize: expected a host f32 tensor, got {}", x.str());
  QuantizedTensor q;
  q.layout = layout;
  q.shape = logical_shape(x);
  q.codes = Tensor::empty(x.shape(), fp8_dtype(f), Device::cpu(), cat);
  q.scale_inv = Tensor::empty(scale_shape(layout, q.rows(), q.cols()), DType::f32, Device::cpu(), cat);
  Fp8CastStats s;
  if (layout == ScaleLayout::per_tensor) {
    q.scale_inv.data<float>()[0] = 1.0f / scale;
    s = fp8_quantize(x.data<float>(), x.numel(), scale, f, q.codes.data<uint8_t>());
  } else {
    s = quantize_blocks(x.data<float>(), q.rows(), q.cols(), block_extent(layout, q.rows(), q.cols()), f,
                        q.codes.data<uint8_t>(), q.scale_inv.data<float>());
  }
  if (stats) *stats = s;
  return q;
}

Tensor decode(const QuantizedTensor& q, MemCategory cat) {
  FP8T_CHECK(q.codes.defined() && q.codes.device().is_cpu(), "decode: expects host codes");
  Tensor out = Tensor::empty(q.codes.shape(), DType::f32, Device::cpu(), cat);
  fp8_dequantize(q.codes.data<uint8_t>(), q.codes.numel(), 1.0f, q.format(), out.data<float>());
  return out;
}

Tensor dequantize(const QuantizedTensor& q, MemCategory cat) {
  FP8T_CHECK(q.defined(), "dequantize: an empty QuantizedTensor");
  const int64_t rows = q.rows(), cols = q.cols(), n = rows * cols;
  if (q.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    Tensor out = Tensor::empty(q.shape, DType::bf16, q.device(), cat);
    if (n == 0) return out;
    const cudaStream_t stream = kernels::compute_stream();
    auto* o = out.data<__nv_bfloat16>();
    const float* s = q.scale_inv.data<float>();
    if (q.layout == ScaleLayout::per_tensor && q.codes.defined()) {
      kernels::fp8_dequantize(q.codes.data<uint8_t>(), q.format(), n, s, o, stream);
    } else if (q.layout == ScaleLayout::per_tensor) {
      kernels::fp8_dequantize_transposed(q.codes_t.data<uint8_t>(), q.format(), cols, rows, s, o, stream);
    } else if (q.layout == ScaleLayout::per_row && q.codes.defined() && q.format() == Fp8Format::e4m3) {
      kernels::fp8_dequantize_rows(q.codes.data<uint8_t>(), rows, cols, s, o, stream);
    } else {
      FP8T_FAIL("dequantize: no CUDA kernel for {} {} codes{} yet", scale_layout_name(q.layout),
                dtype_name(q.any_codes().dtype()), q.codes.defined() ? "" : " kept only transposed");
    }
    return out;
#else
    FP8T_FAIL("dequantize: tensor is on a CUDA device but this build has no CUDA");
#endif
  }
  FP8T_CHECK(q.codes.defined(), "dequantize: host codes kept only transposed are not supported");
  Tensor out = Tensor::empty(q.shape, DType::f32, Device::cpu(), cat);
  if (n == 0) return out;
  const BlockExtent e = block_extent(q.layout, rows, cols);
  const int64_t bcols = ceil_div(cols, e.cols);
  const uint8_t* pc = q.codes.data<uint8_t>();
  const float* ps = q.scale_inv.data<float>();
  float* po = out.data<float>();
#pragma omp parallel for schedule(static) if (rows > 1 && n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t c0 = bc * e.cols, len = std::min(cols, c0 + e.cols) - c0;
      fp8_dequantize(pc + r * cols + c0, len, ps[(r / e.rows) * bcols + bc], q.format(), po + r * cols + c0);
    }
  return out;
}

}  // namespace fp8t
