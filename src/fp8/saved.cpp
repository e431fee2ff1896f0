// FP8 storage of saved activations: host path here (bit-exact with the CUDA one), CUDA path on the
// cast kernels.
#include "fp8/saved.h"

#include "core/check.h"
#include "fp8/quantize.h"
#include "fp8/scaling.h"

#ifdef FP8T_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/cuda_ops.h"
#endif

namespace fp8t {

namespace {
constexpr float kE4m3Max = 448.0f;
}

Fp8Saved fp8_save(const Tensor& x, Tensor* roundtrip) {
  Fp8Saved s;
  s.codes = Tensor::empty(x.shape(), DType::e4m3, x.device(), MemCategory::activations);
  s.scales = Tensor::empty({4}, DType::f32, x.device(), MemCategory::activations);
  const int64_t n = x.numel();
  if (x.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    FP8T_CHECK(x.dtype() == DType::bf16, "fp8_save: CUDA tensors must be bf16, got {}", x.str());
    s.dtype = DType::bf16;
    cuda_ops::fill(s.scales, 1.0f);
    float* amax = s.scales.data<float>();
    const cudaStream_t stream = kernels::compute_stream();
    CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    if (n > 0) {
      kernels::fp8_amax(x.raw(), DType::bf16, n, amax, stream);
      kernels::fp8_scale_from_amax(amax, kE4m3Max, 0, amax + 1, amax + 2, stream);
      const int64_t cols = x.ndim() == 0 ? 1 : x.dim(-1);
      kernels::fp8_cast(x.raw(), DType::bf16, n / cols, cols, s.codes.data<uint8_t>(), nullptr, Fp8Format::e4m3,
                        amax + 1, {}, stream);
    }
    if (roundtrip) *roundtrip = fp8_restore(s);
#else
    FP8T_FAIL("fp8_save: tensor is on a CUDA device but this build has no CUDA");
#endif
    return s;
  }
  FP8T_CHECK(x.dtype() == DType::f32, "fp8_save: CPU tensors must be f32 (FP8 emulation), got {}", x.str());
  const float amax = fp8_amax(x.data<float>(), n);
  const float scale = fp8_scale_from_amax(amax, kE4m3Max, 0, 1.0f);
  float* sc = s.scales.data<float>();
  sc[0] = amax;
  sc[1] = scale;
  sc[2] = 1.0f / scale;
  sc[3] = 0.0f;
  fp8_quantize(x.data<float>(), n, scale, Fp8Format::e4m3, s.codes.data<uint8_t>());
  if (roundtrip) *roundtrip = fp8_restore(s);
  return s;
}

Tensor fp8_restore(const Fp8Saved& s, MemCategory cat) {
  FP8T_CHECK(s.defined(), "fp8_restore: nothing saved");
  Tensor out = Tensor::empty(s.codes.shape(), s.dtype, s.codes.device(), cat);
  const int64_t n = s.codes.numel();
  if (n == 0) return out;
  if (s.codes.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    kernels::fp8_dequantize(s.codes.data<uint8_t>(), Fp8Format::e4m3, n, s.scales.data<float>() + 2,
                            out.data<__nv_bfloat16>(), kernels::compute_stream());
#endif
    return out;
  }
  fp8_dequantize(s.codes.data<uint8_t>(), n, s.scales.data<float>()[2], Fp8Format::e4m3, out.data<float>());
  return out;
}

}  // namespace fp8t
