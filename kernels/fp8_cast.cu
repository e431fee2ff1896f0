// FP8 cast kernels (plain and with transpose). The casts are memory-bound (2 or 4 bytes read and 1 or 2
// written per element): 16-byte loads, codes packed into 8- and 16-byte stores, the transpose staged through
// shared memory. The amax pass, the device scale update and the dequantize are in kernels/fp8_amax.cu; the pair
// cast (two transposed outputs from one pass) in kernels/fp8_cast_pair.cu; the shared tile code in fp8_cast_tile.cuh.
#include <cstring>
#include <type_traits>

#include "core/launch_limits.h"
#include "kernels/fp8_cast_tile.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

// in (n) -> out (n). kVec (16-byte aligned in, 8-byte aligned out): groups of 8 elements, two per
// thread in flight, 8-byte stores; the last n % 8 elements one at a time. Otherwise all one at a time.
constexpr int kGroupsPerBlock = 2 * kThreads;

template <Fp8Format F, typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) cast_kernel(const T* __restrict__ in, uint8_t* __restrict__ out, int64_t n,
                                                        const float* __restrict__ scale_ptr, Fp8CastOutputs stats) {
  const float scale = *scale_ptr;
  ThreadStats st;
  const int64_t groups = kVec ? n / 8 : 0;
  for (int64_t g0 = int64_t{blockIdx.x} * kGroupsPerBlock; g0 < groups; g0 += int64_t{gridDim.x} * kGroupsPerBlock) {
    float x[2][8];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t g = g0 + k * kThreads + threadIdx.x;
      if (g < groups) load8(in + 8 * g, x[k]);
      else for (float& e : x[k]) e = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t g = g0 + k * kThreads + threadIdx.x;
      const uint2 codes = convert8<F>(x[k], scale, st);
      if (g < groups) *reinterpret_cast<uint2*>(out + 8 * g) = codes;
    }
  }
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = groups * 8 + int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride) {
    const float x = to_float(in[i]);
    const float v = __fmul_rn(x, scale);
    st.add(x, v, fp8_max(F));
    out[i] = to_fp8<F>(v);
  }
  flush_stats(st, stats);
}

// kVec: cols % 8 == 0, in (and ops.pre, ops.w, ops.b where read) 16-byte aligned, out (if any) 8-byte aligned. vec_t:
// rows % 16 == 0 and out_t 16-byte aligned. out and out_t may each be null. kColsum: stats.colsum is set (a template
// argument so that the casts without it keep their registers: the 16-byte path needs 48 without and 64 with on sm_90a,
// 5 and 4 blocks per SM). Elements outside the matrix read as zero (adding nothing to any statistic) and are never
// stored. kIn gelu: every element read is replaced by cast_input (the zero padding too: gelu(+0) = +0); the colsum, if
// any, would sum those values. kIn layernorm: every element inside the matrix is replaced by its LayerNorm value (the
// padding stays zero: LayerNorm would turn it into b[c]); the thread's 8 columns of ops.w and ops.b and its 4 rows'
// statistics are read once. kIn dgelu: ops.pre is read beside in (16-byte loads too: kVec also needs it 16-byte
// aligned), its padding zero as well, and every element read is replaced by dgelu_value_bf16 (padding stays zero); the
// colsum sums those values. kIn saved_gelu and saved_dgelu read pre from ops.pre_codes (8-byte loads: kVec needs them
// 8-byte aligned) and ops.row_scale_inv instead (saved_gelu does not read in).
template <Fp8Format F, typename T, bool kVec, bool kColsum, Fp8CastInput kIn>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_kernel(const T* __restrict__ in, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                          int64_t rows, int64_t cols, bool vec_t, const float* __restrict__ scale_ptr,
                          Fp8CastOutputs stats, Fp8CastOperands ops) {
  __shared__ uint4 s_t[kTileCols * kChunks];              // (tile cols, kChunks) chunks, swizzled
  __shared__ float s_colsum[kThreads / 32][kTileCols];    // (warps, tile cols) partial column sums
  const float scale = *scale_ptr;
  const int64_t r0 = int64_t{blockIdx.y} * kTileRows, c0 = int64_t{blockIdx.x} * kTileCols;
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int64_t c = c0 + 8 * tx;  // the thread's first column

  ThreadStats st;
  uint2 codes[4];       // (4, 8): row j's columns 0-3 in .x, 4-7 in .y
  float col_sum[8] = {};  // (8): the thread's columns summed over its 4 rows
  if constexpr (kVec) {
    float x[4][8];
    if constexpr (kIn == Fp8CastInput::dgelu) {
      // All eight 16-byte loads (4 rows of gradients, 4 of the GELU's input) issued before any use, kept
      // packed (32 registers) until then.
      uint4 dq[4], pq[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = r0 + 4 * ty + j;
        const bool inside = r < rows && c < cols;  // cols % 8 == 0: all 8 or none inside
        dq[j] = inside ? *reinterpret_cast<const uint4*>(in + r * cols + c) : make_uint4(0, 0, 0, 0);
        pq[j] = inside ? *reinterpret_cast<const uint4*>(ops.pre + r * cols + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 8; e += 2) {  // the bf16 roundings in pairs
          const float2 v = dgelu_values_bf16(bf16_at(dq[j], e), bf16_at(pq[j], e), bf16_at(dq[j], e + 1),
                                             bf16_at(pq[j], e + 1));
          x[j][e] = v.x, x[j][e + 1] = v.y;
        }
    } else if constexpr (kIn == Fp8CastInput::saved_dgelu) {
      // Four 16-byte loads of gradients and four 8-byte loads of pre's codes issued before any use.
      uint4 dq[4];
      SavedPre pre;
      load_dy_and_pre(dq, pre, in, r0, ty, c, rows, cols, ops);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float p[8];
        pre.values(j, p);
#pragma unroll
        for (int e = 0; e < 8; e += 2) {  // the bf16 roundings in pairs
          const float2 v = dgelu_values_bf16(bf16_at(dq[j], e), p[e], bf16_at(dq[j], e + 1), p[e + 1]);
          x[j][e] = v.x, x[j][e + 1] = v.y;
        }
      }
    } else if constexpr (kIn == Fp8CastInput::saved_gelu) {
      // Four 8-byte loads of codes (and the rows' scales) issued before any use; the padding stays zero.
      SavedPre pre;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = r0 + 4 * ty + j;
        pre.load(j, r < rows && c < cols, r, c, cols, ops);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float p[8];
        pre.values(j, p);
#pragma unroll
        for (int e = 0; e < 8; e += 2) {  // the bf16 roundings in pairs
          const float2 v = bf16_round2(gelu(p[e]), gelu(p[e + 1]));
          x[j][e] = v.x, x[j][e + 1] = v.y;
        }
      }
    } else {  // the four 16-byte loads are all issued before any use
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t r = r0 + 4 * ty + j;
        if (r < rows && c < cols) load8(in + r * cols + c, x[j]);  // cols % 8 == 0: all 8 or none inside
        else for (float& e : x[j]) e = 0.0f;
      }
    }
    if constexpr (kIn == Fp8CastInput::layernorm) {
      if (c < cols) {
        float lw[8], lb[8];  // (8) the LayerNorm weight and bias of the thread's columns (kVec: 16-byte aligned)
        load8(ops.w + c, lw);
        load8(ops.b + c, lb);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t r = r0 + 4 * ty + j;
          if (r < rows) {
            const float m = ops.mean[r], s = ops.rstd[r];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {  // layernorm_value_bf16, the bf16 roundings in pairs
              const float2 v = bf16_round2(layernorm_value(x[j][e], m, s, lw[e], lb[e]),
                                           layernorm_value(x[j][e + 1], m, s, lw[e + 1], lb[e + 1]));
              x[j][e] = v.x, x[j][e + 1] = v.y;
            }
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (kIn == Fp8CastInput::gelu) {
#pragma unroll
        for (int e = 0; e < 8; e += 2) {  // cast_input<gelu>, the bf16 roundings in pairs
          const float2 v = bf16_round2(gelu(x[j][e]), gelu(x[j][e + 1]));
          x[j][e] = v.x, x[j][e + 1] = v.y;
        }
      }
      codes[j] = convert8<F>(x[j], scale, st);
      if constexpr (kColsum) {
#pragma unroll
        for (int e = 0; e < 8; ++e) col_sum[e] += x[j][e];
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + 4 * ty + j;
      float x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int64_t i = r * cols + c + e;
        if constexpr (kIn == Fp8CastInput::saved_gelu)  // `in` is not read
          x[e] = r < rows && c + e < cols ? cast_input<kIn>(0.0f, i, r, c + e, ops) : 0.0f;
        else
          x[e] = r < rows && c + e < cols ? cast_input<kIn>(to_float(in[i]), i, r, c + e, ops) : 0.0f;
      }
      codes[j] = convert8<F>(x, scale, st);
      if constexpr (kColsum) {
#pragma unroll
        for (int e = 0; e < 8; ++e) col_sum[e] += x[e];
      }
    }
  }

  if (kColsum) stage_colsum(s_colsum, col_sum, tx);

  if (out) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + 4 * ty + j;
      if constexpr (kVec) {
        if (r < rows && c < cols) *reinterpret_cast<uint2*>(out + r * cols + c) = codes[j];
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (r < rows && c + e < cols) out[r * cols + c + e] = byte_of(e < 4 ? codes[j].x : codes[j].y, e % 4);
      }
    }
  }

  if (out_t) stage_transposed(s_t, codes, tx, ty);
  __syncthreads();

  if (kColsum) add_colsum(s_colsum, stats.colsum, c0, cols);

  if (out_t) store_transposed(s_t, out_t, r0, c0, rows, cols, vec_t);
  flush_stats(st, stats);
}

int blocks_for(int64_t items, int64_t per_block) {
  return static_cast<int>(std::clamp<int64_t>((items + per_block - 1) / per_block, 1, int64_t{1} << 20));
}

// The flat cast does not know columns, so a cast that sums them takes the tiled kernel even without
// out_t; so does a cast with a prologue (the layernorm one needs columns too; one kernel variant fewer
// per format for gelu and dgelu).
template <Fp8Format F, typename T>
void launch_cast(const T* in, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t, const float* scale,
                 Fp8CastOutputs stats, Fp8CastInput input, const Fp8CastOperands& ops, cudaStream_t stream) {
  constexpr auto as_is = Fp8CastInput::as_is, gelu = Fp8CastInput::gelu, layernorm = Fp8CastInput::layernorm,
                 dgelu = Fp8CastInput::dgelu, saved_gelu = Fp8CastInput::saved_gelu,
                 saved_dgelu = Fp8CastInput::saved_dgelu;
  if (out_t || stats.colsum || input != as_is) {
    // (column tiles, row tiles): gridDim.y caps rows at 65535 * 128 = 8388480.
    const dim3 grid(checked_grid(ceil_div64(cols, kTileCols), kMaxGridX, "fp8_cast (tiled)", "cols (64 per tile)"),
                    checked_grid(ceil_div64(rows, kTileRows), kMaxGridYZ, "fp8_cast (tiled)", "rows (128 per tile)"));
    const bool vec = cols % 8 == 0 && aligned16(in) && (!out || aligned8(out)) &&
                     (input != dgelu || aligned16(ops.pre)) &&
                     ((input != saved_gelu && input != saved_dgelu) || aligned8(ops.pre_codes)) &&
                     (input != layernorm || (aligned16(ops.w) && aligned16(ops.b)));
    const bool vec_t = rows % 16 == 0 && aligned16(out_t);
    auto kernel = stats.colsum ? (vec ? cast_transpose_kernel<F, T, true, true, as_is>
                                      : cast_transpose_kernel<F, T, false, true, as_is>)
                               : (vec ? cast_transpose_kernel<F, T, true, false, as_is>
                                      : cast_transpose_kernel<F, T, false, false, as_is>);
    if constexpr (std::is_same_v<T, bf16>) {  // the prologues: bf16 only, colsum only with dgelu (checked by fp8_cast)
      if (input == gelu)
        kernel = vec ? cast_transpose_kernel<F, T, true, false, gelu> : cast_transpose_kernel<F, T, false, false, gelu>;
      else if (input == saved_dgelu)
        kernel = stats.colsum ? (vec ? cast_transpose_kernel<F, T, true, true, saved_dgelu>
                                     : cast_transpose_kernel<F, T, false, true, saved_dgelu>)
                              : (vec ? cast_transpose_kernel<F, T, true, false, saved_dgelu>
                                     : cast_transpose_kernel<F, T, false, false, saved_dgelu>);
      else if (input == saved_gelu)
        kernel = vec ? cast_transpose_kernel<F, T, true, false, saved_gelu>
                     : cast_transpose_kernel<F, T, false, false, saved_gelu>;
      else if (input == layernorm)
        kernel = vec ? cast_transpose_kernel<F, T, true, false, layernorm>
                     : cast_transpose_kernel<F, T, false, false, layernorm>;
      else if (input == dgelu)
        kernel = stats.colsum ? (vec ? cast_transpose_kernel<F, T, true, true, dgelu>
                                     : cast_transpose_kernel<F, T, false, true, dgelu>)
                              : (vec ? cast_transpose_kernel<F, T, true, false, dgelu>
                                     : cast_transpose_kernel<F, T, false, false, dgelu>);
    }
    kernel<<<grid, kThreads, 0, stream>>>(in, out, out_t, rows, cols, vec_t, scale, stats, ops);
  } else {
    const int64_t n = rows * cols;
    if (aligned16(in) && aligned8(out))
      cast_kernel<F, T, true><<<blocks_for(n, 8 * kGroupsPerBlock), kThreads, 0, stream>>>(in, out, n, scale, stats);
    else
      cast_kernel<F, T, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(in, out, n, scale, stats);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void dispatch_format(const T* in, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t, Fp8Format format,
                     const float* scale, Fp8CastOutputs stats, Fp8CastInput input, const Fp8CastOperands& ops,
                     cudaStream_t stream) {
  if (format == Fp8Format::e4m3)
    launch_cast<Fp8Format::e4m3>(in, rows, cols, out, out_t, scale, stats, input, ops, stream);
  else
    launch_cast<Fp8Format::e5m2>(in, rows, cols, out, out_t, scale, stats, input, ops, stream);
}
}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void fp8_cast(const void* in, DType in_dtype, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t,
              Fp8Format format, const float* scale, Fp8CastOutputs stats, cudaStream_t stream,
              Fp8CastInput input, Fp8CastOperands ops) {
  FP8T_CHECK(rows > 0 && cols > 0, "fp8_cast: bad sizes rows={} cols={}", rows, cols);
  FP8T_CHECK(out || out_t, "fp8_cast: neither an output nor a transposed output");
  FP8T_CHECK(scale != nullptr, "fp8_cast: the scale pointer is null");
  FP8T_CHECK(input == Fp8CastInput::as_is || in_dtype == DType::bf16,
             "fp8_cast: a prologue (GELU, LayerNorm, GELU backward) takes bf16 input (its kernel's dtype), got {}",
             dtype_name(in_dtype));
  FP8T_CHECK(!stats.colsum || input == Fp8CastInput::as_is || input == Fp8CastInput::dgelu ||
                 input == Fp8CastInput::saved_dgelu,
             "fp8_cast: column sums go with the plain cast or the GELU backward prologue only");
  FP8T_CHECK(input != Fp8CastInput::layernorm || (ops.mean && ops.rstd && ops.w && ops.b),
             "fp8_cast: the LayerNorm prologue needs mean, rstd, w and b");
  FP8T_CHECK(input != Fp8CastInput::dgelu || ops.pre, "fp8_cast: the GELU backward prologue needs pre");
  FP8T_CHECK((input != Fp8CastInput::saved_gelu && input != Fp8CastInput::saved_dgelu) ||
                 (ops.pre_codes && ops.row_scale_inv),
             "fp8_cast: the saved-GELU prologues need pre_codes and row_scale_inv");
  if (in_dtype == DType::bf16)
    dispatch_format(static_cast<const bf16*>(in), rows, cols, out, out_t, format, scale, stats, input, ops, stream);
  else if (in_dtype == DType::f32)
    dispatch_format(static_cast<const float*>(in), rows, cols, out, out_t, format, scale, stats, input, ops, stream);
  else
    FP8T_FAIL("fp8_cast: input must be bf16 or f32, got {}", dtype_name(in_dtype));
}

}  // namespace fp8t::kernels
