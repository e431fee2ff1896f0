// FP8 storage of saved activations with a scale per row: host path here (bit-exact with the CUDA one),
// CUDA path on the one-pass kernels of kernels/fp8_saved.cuh.
#include "fp8/saved.h"

#include "core/check.h"
#include "fp8/quantize.h"

#ifdef FP8T_HAVE_CUDA
#include "kernels/fp8_saved.cuh"
#include "kernels/stream.cuh"
#include "core/tensor_ops.h"
#endif

namespace fp8t {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements; below this the host round trip stays on one thread

// The saved form of x; *rt (if given: a tensor of x's shape and dtype, or x itself) receives the round
// trip.
QuantizedTensor save_rows(const Tensor& x, Tensor* rt) {
  if (x.device().is_cpu()) {
    FP8T_CHECK(x.dtype() == DType::f32, "fp8_save: CPU tensors must be f32 (FP8 emulation), got {}", x.str());
    // quantize reads all of x before the round trip is written over it (rt may be x).
    QuantizedTensor s = quantize(x, ScaleLayout::per_row, Fp8Format::e4m3, 1.0f, MemCategory::activations);
    const int64_t rows = s.rows(), cols = s.cols();
    if (rt && rows > 0) {
      const uint8_t* codes = s.codes.data<uint8_t>();
      const float* scale_inv = s.scale_inv.data<float>();
      float* out = rt->data<float>();
#pragma omp parallel for schedule(static) if (rows > 1 && rows * cols > kParallelMin)
      for (int64_t r = 0; r < rows; ++r)
        fp8_dequantize(codes + r * cols, cols, scale_inv[r], Fp8Format::e4m3, out + r * cols);
    }
    return s;
  }
#ifdef FP8T_HAVE_CUDA
  FP8T_CHECK(x.dtype() == DType::bf16, "fp8_save: CUDA tensors must be bf16, got {}", x.str());
  QuantizedTensor s = fp8_saved_rows_empty(x);
  const int64_t rows = s.rows(), cols = s.cols();
  if (x.numel() > 0)
    kernels::fp8_save_rows(x.data<__nv_bfloat16>(), rows, cols, s.codes.data<uint8_t>(), s.scale_inv.data<float>(),
                           rt ? rt->data<__nv_bfloat16>() : nullptr, kernels::compute_stream());
  else if (rows > 0)
    fill_(s.scale_inv, 1.0f);  // empty rows: amax 0, scale 1
  return s;
#else
  FP8T_FAIL("fp8_save: tensor is on a CUDA device but this build has no CUDA");
#endif
}

}  // namespace

QuantizedTensor fp8_saved_rows_empty(const Tensor& x) {
  QuantizedTensor s;
  s.layout = ScaleLayout::per_row;
  s.shape = x.ndim() == 0 ? Shape{1} : x.shape();
  s.codes = Tensor::empty(x.shape(), DType::e4m3, x.device(), MemCategory::activations);
  s.scale_inv = Tensor::empty({s.rows()}, DType::f32, x.device(), MemCategory::activations);
  return s;
}

QuantizedTensor fp8_save(const Tensor& x, Tensor* roundtrip) {
  // Built aside and assigned last: roundtrip may point at x.
  Tensor rt = roundtrip ? Tensor::empty(x.shape(), x.dtype(), x.device(), MemCategory::activations) : Tensor();
  QuantizedTensor s = save_rows(x, roundtrip ? &rt : nullptr);
  if (roundtrip) *roundtrip = std::move(rt);
  return s;
}

QuantizedTensor fp8_save_inplace(Tensor& x) { return save_rows(x, &x); }

Tensor fp8_restore(const QuantizedTensor& s, MemCategory cat) {
  FP8T_CHECK(s.defined(), "fp8_restore: nothing saved");
  return dequantize(s, cat).view(s.codes.shape());
}

}  // namespace fp8t
