// The FP8 amax pass (with the cast prologues), the device scale update from an amax, and the per-tensor
// dequantize (also from transposed codes), beside the casts of kernels/fp8_cast.cu.
#include <algorithm>

#include "core/launch_limits.h"
#include "kernels/fp8_cast_common.cuh"

namespace fp8t::kernels {
namespace {

// out[i] = bf16(decode(codes[i]) * *scale_inv), decode exact (an FP8 value is exact in half). kVec:
// 8 codes per thread (one 8-byte load, one 16-byte store).
template <Fp8Format F, bool kVec>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ codes, int64_t n, const float* scale_inv, bf16* __restrict__ out) {
  const float s = *scale_inv;
  auto decode = [&](uint8_t c) { return dequant_bf16<F>(c, s); };
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if constexpr (kVec) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n / 8; i += stride) {
      const uint2 c = reinterpret_cast<const uint2*>(codes)[i];
      Vec16<bf16> v;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        v.v[b] = decode(byte_of(c.x, b));
        v.v[4 + b] = decode(byte_of(c.y, b));
      }
      v.store(out + 8 * i);
    }
  } else {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) out[i] = decode(codes[i]);
  }
}

// out (cols, rows) = dequant of codes_t (rows, cols) transposed, through a (kTile, kTile) shared tile so
// that both the code reads and the bf16 writes are coalesced. One block per tile; kThreads / kTile rows
// of the tile per pass.
constexpr int kTile = 64;
template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    dequantize_transposed_kernel(const uint8_t* __restrict__ codes_t, int64_t rows, int64_t cols,
                                 const float* scale_inv, bf16* __restrict__ out) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale_inv;
  const int64_t r0 = int64_t{blockIdx.y} * kTile, c0 = int64_t{blockIdx.x} * kTile;
  constexpr int kRowsPerPass = kThreads / kTile;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  for (int i = ty; i < kTile; i += kRowsPerPass) {  // tile[i][j] = codes_t[r0 + i, c0 + j]
    const int64_t r = r0 + i, c = c0 + tx;
    tile[i][tx] = r < rows && c < cols ? codes_t[r * cols + c] : 0;
  }
  __syncthreads();
  for (int j = ty; j < kTile; j += kRowsPerPass) {  // out[c0 + j, r0 + i] = tile[i][j]
    const int64_t c = c0 + j, r = r0 + tx;
    if (c < cols && r < rows) out[c * rows + r] = dequant_bf16<F>(tile[tx][j], s);
  }
}

// in (n) as (n / cols, cols). kIn layernorm: a block takes whole rows (grid-stride over rows), so that a
// row's statistics are read once per block; the others ignore cols and stride over elements.
template <typename T, Fp8CastInput kIn>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* in, int64_t n, int64_t cols, Fp8CastOperands ops, float* amax) {
  ThreadStats st;
  if constexpr (kIn == Fp8CastInput::layernorm) {
    const int64_t rows = n / cols;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
      const float m = ops.mean[r], s = ops.rstd[r];
      for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
        const float x = layernorm_value_bf16(to_float(in[r * cols + c]), m, s, __bfloat162float(ops.w[c]),
                                             __bfloat162float(ops.b[c]));
        st.add(x, 0.0f, 0.0f);
      }
    }
  } else {
    for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
      const float x = cast_input<kIn>(to_float(in[i]), i, 0, 0, ops);
      st.add(x, 0.0f, 0.0f);
    }
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

// The block count in 64 bits before the clamp (ceil_div's int would wrap from 2^39 work items on).
int grid_for(int64_t work_items) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div64(work_items, kThreads), 1, 4096));
}


// fp8_add_cast_stats: a grid-stride loop over the column sums; thread 0 of block 0 adds amax and the count.
__global__ void add_cast_stats_kernel(const float* kept, int64_t cols, Fp8CastOutputs out) {
  if (out.colsum) {
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols; c += int64_t{gridDim.x} * blockDim.x)
      out.colsum[c] += kept[c];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const float* stats = kept + cast_stats_amax_index(cols);
    const unsigned amax = __float_as_uint(stats[0]);
    const unsigned long long saturated = *reinterpret_cast<const unsigned long long*>(stats + 2);
    if (out.amax && amax) atomicMax(reinterpret_cast<unsigned*>(out.amax), amax);
    if (out.saturated && saturated) atomicAdd(out.saturated, saturated);
  }
}

}  // namespace

void fp8_add_cast_stats(const float* kept, int64_t cols, Fp8CastOutputs out, cudaStream_t stream) {
  FP8T_CHECK(kept != nullptr && cols > 0, "fp8_add_cast_stats: no statistics to add ({} columns)", cols);
  const int blocks = static_cast<int>(std::min<int64_t>((cols + 255) / 256, 1024));
  add_cast_stats_kernel<<<blocks, 256, 0, stream>>>(kept, cols, out);
  CUDA_CHECK_LAUNCH();
}

void fp8_amax(const void* in, DType in_dtype, int64_t n, float* amax, cudaStream_t stream, Fp8CastInput input,
              int64_t cols, Fp8CastOperands ops) {
  FP8T_CHECK(n > 0 && amax, "fp8_amax: bad arguments n={}", n);
  FP8T_CHECK(input == Fp8CastInput::as_is || in_dtype == DType::bf16,
             "fp8_amax: a prologue (GELU, LayerNorm, GELU backward) takes bf16 input, got {}", dtype_name(in_dtype));
  FP8T_CHECK(input != Fp8CastInput::layernorm || (cols > 0 && n % cols == 0 && ops.mean && ops.rstd && ops.w && ops.b),
             "fp8_amax: the LayerNorm prologue needs cols dividing n = {} (got {}) and mean, rstd, w and b", n, cols);
  FP8T_CHECK(input != Fp8CastInput::dgelu || ops.pre, "fp8_amax: the GELU backward prologue needs pre");
  FP8T_CHECK(input != Fp8CastInput::saved_gelu && input != Fp8CastInput::saved_dgelu,
             "fp8_amax: no saved-GELU prologues (take the amax of the bf16 prologue over the restored input)");
  constexpr auto as_is = Fp8CastInput::as_is;
  const auto* in_bf16 = static_cast<const bf16*>(in);
  if (input == Fp8CastInput::layernorm) {
    const int blocks = static_cast<int>(std::clamp<int64_t>(n / cols, 1, 4096));
    amax_kernel<bf16, Fp8CastInput::layernorm><<<blocks, kThreads, 0, stream>>>(in_bf16, n, cols, ops, amax);
  } else if (input == Fp8CastInput::gelu) {
    amax_kernel<bf16, Fp8CastInput::gelu><<<grid_for(n), kThreads, 0, stream>>>(in_bf16, n, cols, ops, amax);
  } else if (input == Fp8CastInput::dgelu) {
    amax_kernel<bf16, Fp8CastInput::dgelu><<<grid_for(n), kThreads, 0, stream>>>(in_bf16, n, cols, ops, amax);
  } else if (in_dtype == DType::bf16) {
    amax_kernel<bf16, as_is><<<grid_for(n), kThreads, 0, stream>>>(in_bf16, n, cols, ops, amax);
  } else if (in_dtype == DType::f32) {
    amax_kernel<float, as_is><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const float*>(in), n, cols, ops, amax);
  } else {
    FP8T_FAIL("fp8_amax: input must be bf16 or f32, got {}", dtype_name(in_dtype));
  }
  CUDA_CHECK_LAUNCH();
}

void fp8_scale_from_amax(const float* amax, float fmax, int margin, float* scale, float* scale_inv,
                         cudaStream_t stream) {
  scale_from_amax_kernel<<<1, 1, 0, stream>>>(amax, fmax, margin, scale, scale_inv);
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize(const uint8_t* codes, Fp8Format format, int64_t n, const float* scale_inv, __nv_bfloat16* out,
                    cudaStream_t stream) {
  FP8T_CHECK(n > 0 && codes && scale_inv && out, "fp8_dequantize: bad arguments n={}", n);
  const bool vec = n % 8 == 0 && (reinterpret_cast<uintptr_t>(codes) & 7u) == 0 && aligned16(out);
  const int64_t work = vec ? n / 8 : n;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div64(work, kThreads), 132 * 16));
  auto launch = [&](auto kernel) { kernel<<<blocks, kThreads, 0, stream>>>(codes, n, scale_inv, out); };
  if (format == Fp8Format::e4m3)
    vec ? launch(dequantize_kernel<Fp8Format::e4m3, true>) : launch(dequantize_kernel<Fp8Format::e4m3, false>);
  else
    vec ? launch(dequantize_kernel<Fp8Format::e5m2, true>) : launch(dequantize_kernel<Fp8Format::e5m2, false>);
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize_transposed(const uint8_t* codes_t, Fp8Format format, int64_t rows, int64_t cols,
                               const float* scale_inv, __nv_bfloat16* out, cudaStream_t stream) {
  FP8T_CHECK(rows > 0 && cols > 0 && codes_t && scale_inv && out,
             "fp8_dequantize_transposed: bad arguments rows={} cols={}", rows, cols);
  const int64_t gx = ceil_div64(cols, kTile), gy = ceil_div64(rows, kTile);
  FP8T_CHECK(gx <= kMaxGridX && gy <= kMaxGridYZ, "fp8_dequantize_transposed: ({}, {}) is too large", rows, cols);
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if (format == Fp8Format::e4m3)
    dequantize_transposed_kernel<Fp8Format::e4m3><<<grid, kThreads, 0, stream>>>(codes_t, rows, cols, scale_inv, out);
  else
    dequantize_transposed_kernel<Fp8Format::e5m2><<<grid, kThreads, 0, stream>>>(codes_t, rows, cols, scale_inv, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
