// FP8 cast kernels (plain and with transpose), the amax pass and the device scale update.
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cast.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr int kThreads = 256;

template <Fp8Format F>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  // NaN gets the host codec's canonical code explicitly: the hardware keeps NaN payload/sign bits.
  if (isnan(v)) return F == Fp8Format::e4m3 ? 0x7F : 0x7E;
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

// Per-thread running statistics: |x| as float bits (unsigned order = float order for |x|, and every
// NaN compares above +inf, so NaN sticks), and the saturation count.
struct ThreadStats {
  unsigned amax_bits = 0;
  unsigned saturated = 0;
  __device__ __forceinline__ void add(float x, float v, float fmax) {
    amax_bits = max(amax_bits, __float_as_uint(fabsf(x)));
    saturated += fabsf(v) > fmax ? 1u : 0u;
  }
};

// One atomic per block for each statistic. blockDim.x * blockDim.y == kThreads.
__device__ __forceinline__ void flush_stats(ThreadStats s, Fp8CastOutputs out) {
  __shared__ unsigned s_amax[kThreads / 32], s_sat[kThreads / 32];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, lane = tid % 32, warp = tid / 32;
  s.amax_bits = __reduce_max_sync(0xffffffffu, s.amax_bits);
  s.saturated = __reduce_add_sync(0xffffffffu, s.saturated);
  if (lane == 0) {
    s_amax[warp] = s.amax_bits;
    s_sat[warp] = s.saturated;
  }
  __syncthreads();
  if (tid == 0) {
    unsigned a = 0, n = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      a = max(a, s_amax[w]);
      n += s_sat[w];
    }
    if (out.amax && a) atomicMax(reinterpret_cast<unsigned*>(out.amax), a);
    if (out.saturated && n) atomicAdd(out.saturated, static_cast<unsigned long long>(n));
  }
}

// VEC consecutive elements per thread, grid-stride; VEC = 8 needs 16-byte aligned input, 8-byte
// aligned output and n % 8 == 0.
template <Fp8Format F, typename T, int VEC>
__global__ void __launch_bounds__(kThreads) cast_kernel(const T* in, uint8_t* out, int64_t n, const float* scale_ptr,
                                                        Fp8CastOutputs stats) {
  const float scale = *scale_ptr, fmax = fp8_max(F);
  ThreadStats st;
  for (int64_t i = (int64_t{blockIdx.x} * kThreads + threadIdx.x) * VEC; i < n; i += int64_t{gridDim.x} * kThreads * VEC) {
    uint8_t codes[VEC];
    float x[VEC];
    if constexpr (VEC == 8) {
      if constexpr (sizeof(T) == 2) {
        const auto v = Vec16<T>::load(in + i);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = to_float(v.v[j]);
      } else {
        const auto v0 = Vec16<T>::load(in + i), v1 = Vec16<T>::load(in + i + 4);
#pragma unroll
        for (int j = 0; j < 4; ++j) x[j] = v0.v[j], x[j + 4] = v1.v[j];
      }
    } else {
      x[0] = to_float(in[i]);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float v = __fmul_rn(x[j], scale);  // the f32 product, as the host codec takes it
      st.add(x[j], v, fmax);
      codes[j] = to_fp8<F>(v);
    }
    if constexpr (VEC == 8) {
      uint2 packed;
      memcpy(&packed, codes, 8);
      *reinterpret_cast<uint2*>(out + i) = packed;
    } else {
      out[i] = codes[0];
    }
  }
  flush_stats(st, stats);
}

constexpr int kTile = 32;  // tile (kTile, kTile), block (kTile, kThreads / kTile)

// One tile per block: in (rows, cols) -> out (rows, cols) [optional] and out_t (cols, rows).
template <Fp8Format F, typename T>
__global__ void __launch_bounds__(kThreads) cast_transpose_kernel(const T* in, uint8_t* out, uint8_t* out_t,
                                                                  int64_t rows, int64_t cols, const float* scale_ptr,
                                                                  Fp8CastOutputs stats) {
  __shared__ uint8_t s_tile[kTile][kTile + 4];  // (tile rows, tile cols)
  const float scale = *scale_ptr, fmax = fp8_max(F);
  const int64_t r0 = int64_t{blockIdx.y} * kTile, c0 = int64_t{blockIdx.x} * kTile;
  constexpr int kRowsPerPass = kThreads / kTile;
  ThreadStats st;
#pragma unroll
  for (int p = 0; p < kTile / kRowsPerPass; ++p) {
    const int tr = threadIdx.y + p * kRowsPerPass;
    const int64_t r = r0 + tr, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float x = to_float(in[r * cols + c]);
      const float v = __fmul_rn(x, scale);
      st.add(x, v, fmax);
      const uint8_t code = to_fp8<F>(v);
      s_tile[tr][threadIdx.x] = code;
      if (out) out[r * cols + c] = code;
    }
  }
  __syncthreads();
#pragma unroll
  for (int p = 0; p < kTile / kRowsPerPass; ++p) {
    const int tc = threadIdx.y + p * kRowsPerPass;  // a column of the input = a row of out_t
    const int64_t c = c0 + tc, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out_t[c * rows + r] = s_tile[threadIdx.x][tc];
  }
  flush_stats(st, stats);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) amax_kernel(const T* in, int64_t n, float* amax) {
  ThreadStats st;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    const float x = to_float(in[i]);
    st.add(x, 0.0f, 0.0f);
  }
  flush_stats(st, Fp8CastOutputs{amax, nullptr});
}

// Mirrors fp8_scale_from_amax() in src/fp8/scaling.cpp operation for operation (IEEE f32 division).
__global__ void scale_from_amax_kernel(const float* amax_ptr, float fmax, int margin, float* scale, float* scale_inv) {
  const float amax = *amax_ptr;
  float s = *scale;
  if (amax > 0.0f && isfinite(amax)) {
    const float t = __fdiv_rn(__fdiv_rn(fmax, amax), ldexpf(1.0f, margin));
    if (isfinite(t) && t > 0.0f) s = t;
  }
  *scale = s;
  *scale_inv = __fdiv_rn(1.0f, s);
}

int grid_for(int64_t work_items) { return static_cast<int>(std::clamp<int64_t>(ceil_div(work_items, kThreads), 1, 4096)); }

template <Fp8Format F, typename T>
void launch_cast(const T* in, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t, const float* scale,
                 Fp8CastOutputs stats, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (out_t) {
    FP8T_CHECK(ceil_div(rows, kTile) <= 65535, "fp8_cast: {} rows exceed the transpose grid (max {})", rows,
               int64_t{65535} * kTile);
    const dim3 grid(ceil_div(cols, kTile), ceil_div(rows, kTile));
    cast_transpose_kernel<F, T><<<grid, dim3(kTile, kThreads / kTile), 0, stream>>>(in, out, out_t, rows, cols, scale,
                                                                                     stats);
  } else if (n % 8 == 0 && aligned16(in) && (reinterpret_cast<uintptr_t>(out) & 7u) == 0) {
    cast_kernel<F, T, 8><<<grid_for(n / 8), kThreads, 0, stream>>>(in, out, n, scale, stats);
  } else {
    cast_kernel<F, T, 1><<<grid_for(n), kThreads, 0, stream>>>(in, out, n, scale, stats);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void dispatch_format(const T* in, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t, Fp8Format format,
                     const float* scale, Fp8CastOutputs stats, cudaStream_t stream) {
  if (format == Fp8Format::e4m3) launch_cast<Fp8Format::e4m3>(in, rows, cols, out, out_t, scale, stats, stream);
  else launch_cast<Fp8Format::e5m2>(in, rows, cols, out, out_t, scale, stats, stream);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void fp8_cast(const void* in, DType in_dtype, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t,
              Fp8Format format, const float* scale, Fp8CastOutputs stats, cudaStream_t stream) {
  FP8T_CHECK(rows > 0 && cols > 0, "fp8_cast: bad sizes rows={} cols={}", rows, cols);
  FP8T_CHECK(out || out_t, "fp8_cast: neither an output nor a transposed output");
  FP8T_CHECK(scale != nullptr, "fp8_cast: the scale pointer is null");
  if (in_dtype == DType::bf16)
    dispatch_format(static_cast<const bf16*>(in), rows, cols, out, out_t, format, scale, stats, stream);
  else if (in_dtype == DType::f32)
    dispatch_format(static_cast<const float*>(in), rows, cols, out, out_t, format, scale, stats, stream);
  else
    FP8T_FAIL("fp8_cast: input must be bf16 or f32, got {}", dtype_name(in_dtype));
}

void fp8_amax(const void* in, DType in_dtype, int64_t n, float* amax, cudaStream_t stream) {
  FP8T_CHECK(n > 0 && amax, "fp8_amax: bad arguments n={}", n);
  if (in_dtype == DType::bf16)
    amax_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const bf16*>(in), n, amax);
  else if (in_dtype == DType::f32)
    amax_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<const float*>(in), n, amax);
  else
    FP8T_FAIL("fp8_amax: input must be bf16 or f32, got {}", dtype_name(in_dtype));
  CUDA_CHECK_LAUNCH();
}

void fp8_scale_from_amax(const float* amax, float fmax, int margin, float* scale, float* scale_inv,
                         cudaStream_t stream) {
  scale_from_amax_kernel<<<1, 1, 0, stream>>>(amax, fmax, margin, scale, scale_inv);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
