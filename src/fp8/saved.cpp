// FP8 storage of saved activations with a scale per row: host path here (bit-exact with the CUDA one),
// CUDA path on the one-pass kernels of kernels/fp8_saved.cuh.
#include "fp8/saved.h"

#include "core/check.h"
#include "fp8/quantize.h"
#include "fp8/scaling.h"

#ifdef FP8T_HAVE_CUDA
#include "kernels/fp8_saved.cuh"
#include "kernels/stream.cuh"
#include "core/tensor_ops.h"
#endif

namespace fp8t {

namespace {

constexpr float kE4m3Max = 448.0f;
constexpr int64_t kParallelMin = 1 << 15;  // elements; below this the host loop stays on one thread

int64_t row_length(const Tensor& x) { return x.ndim() == 0 ? 1 : x.dim(-1); }

int64_t row_count(const Tensor& x) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < x.ndim(); ++d) rows *= x.dim(d);
  return rows;
}

// The saved form of x; *rt (if given: a tensor of x's shape and dtype, or x itself) receives the round
// trip.
Fp8Saved save_rows(const Tensor& x, const Tensor* rt) {
  Fp8Saved s;
  s.cols = row_length(x);
  const int64_t rows = row_count(x), cols = s.cols, n = x.numel();
  s.codes = Tensor::empty(x.shape(), DType::e4m3, x.device(), MemCategory::activations);
  s.row_scale_inv = Tensor::empty({rows}, DType::f32, x.device(), MemCategory::activations);
  if (x.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    FP8T_CHECK(x.dtype() == DType::bf16, "fp8_save: CUDA tensors must be bf16, got {}", x.str());
    s.dtype = DType::bf16;
    if (n > 0)
      kernels::fp8_save_rows(x.data<__nv_bfloat16>(), rows, cols, s.codes.data<uint8_t>(),
                             s.row_scale_inv.data<float>(), rt ? rt->data<__nv_bfloat16>() : nullptr,
                             kernels::compute_stream());
    else if (rows > 0)
      fill_(s.row_scale_inv, 1.0f);  // empty rows: amax 0, scale 1
#else
    FP8T_FAIL("fp8_save: tensor is on a CUDA device but this build has no CUDA");
#endif
    return s;
  }
  FP8T_CHECK(x.dtype() == DType::f32, "fp8_save: CPU tensors must be f32 (FP8 emulation), got {}", x.str());
  const float* px = x.data<float>();
  uint8_t* pc = s.codes.data<uint8_t>();
  float* psi = s.row_scale_inv.data<float>();
  float* prt = rt ? rt->data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (rows > 1 && n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x_r = px + r * cols;
    const float scale = fp8_scale_from_amax(fp8_amax(x_r, cols), kE4m3Max, 0, 1.0f);
    psi[r] = 1.0f / scale;
    fp8_quantize(x_r, cols, scale, Fp8Format::e4m3, pc + r * cols);
    if (prt) fp8_dequantize(pc + r * cols, cols, psi[r], Fp8Format::e4m3, prt + r * cols);  // may overwrite x_r
  }
  return s;
}

}  // namespace

Fp8Saved fp8_save(const Tensor& x, Tensor* roundtrip) {
  // Built aside and assigned last: roundtrip may point at x.
  Tensor rt = roundtrip ? Tensor::empty(x.shape(), x.dtype(), x.device(), MemCategory::activations) : Tensor();
  Fp8Saved s = save_rows(x, roundtrip ? &rt : nullptr);
  if (roundtrip) *roundtrip = std::move(rt);
  return s;
}

Fp8Saved fp8_save_inplace(Tensor& x) { return save_rows(x, &x); }

Tensor fp8_restore(const Fp8Saved& s, MemCategory cat) {
  FP8T_CHECK(s.defined(), "fp8_restore: nothing saved");
  Tensor out = Tensor::empty(s.codes.shape(), s.dtype, s.codes.device(), cat);
  const int64_t n = s.codes.numel(), rows = s.row_scale_inv.numel(), cols = s.cols;
  if (n == 0) return out;
  if (s.codes.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    kernels::fp8_dequantize_rows(s.codes.data<uint8_t>(), rows, cols, s.row_scale_inv.data<float>(),
                                 out.data<__nv_bfloat16>(), kernels::compute_stream());
#endif
    return out;
  }
  const uint8_t* pc = s.codes.data<uint8_t>();
  const float* psi = s.row_scale_inv.data<float>();
  float* po = out.data<float>();
#pragma omp parallel for schedule(static) if (rows > 1 && n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) fp8_dequantize(pc + r * cols, cols, psi[r], Fp8Format::e4m3, po + r * cols);
  return out;
}

}  // namespace fp8t
