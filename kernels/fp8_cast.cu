// FP8 cast kernels (plain and with transpose). The casts are memory-bound (2 or 4 bytes read and 1 or 2
// written per element): 16-byte loads, codes packed into 8- and 16-byte stores, the transpose staged through
// shared memory. The amax pass, the device scale update and the dequantize are in kernels/fp8_amax.cu; the pair
// cast (two transposed outputs from one pass) in kernels/fp8_cast_pair.cu; the shared tile code in fp8_cast_tile.cuh.
#include <cstring>
#include <type_traits>

#include "core/launch_limits.h"
#include "kernels/device_facts.cuh"
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

// Cast + transpose over (kTileRows, kTileCols) tiles: block (x, y) takes column tile x and row tiles y, y + gridDim.y,
// ... With kRuns (the 16-byte path of the plain and LayerNorm casts, which are memory-bound) a block streams its row
// tiles, the next tile's loads (BlockLoads) issued before this one converts, its column sums kept in registers and
// its statistics flushed once; the launcher gives it about one wave of blocks where the column tiles leave room for
// two or more per column. Otherwise, and for the other casts (the GELU ones are bound by their arithmetic and need
// their registers for occupancy), one block per tile (gridDim.y = row tiles). At any time the blocks
// running hold neighbouring column tiles of the same rows, as a one-tile-per-block grid would. kVec: cols % 8 == 0,
// in (and ops.pre, ops.w, ops.b where read) 16-byte aligned, out (if any) 8-byte aligned. vec_t: rows % 16 == 0 and
// out_t 16-byte aligned. out and out_t may each be null. kColsum: stats.colsum is set (a template argument so that the
// casts without it keep their registers). Elements outside the matrix read as zero (adding nothing to any statistic)
// and are never stored. kIn gelu: every element read is replaced by cast_input (the zero padding too: gelu(+0) = +0).
// kIn layernorm: every element inside the matrix is replaced by its LayerNorm value (the padding stays zero:
// LayerNorm would turn it into b[c]). kIn dgelu: ops.pre is read beside in (16-byte loads too: kVec also needs it
// 16-byte aligned), its padding zero as well, and every element read is replaced by dgelu_value_bf16 (padding stays
// zero); the colsum sums those values. kIn saved_gelu and saved_dgelu read pre from ops.pre_codes (8-byte loads: kVec
// needs them 8-byte aligned) and ops.row_scale_inv instead (saved_gelu does not read in).
template <Fp8CastInput kIn>
constexpr bool streams_runs(bool vec) {
  return vec && (kIn == Fp8CastInput::as_is || kIn == Fp8CastInput::layernorm);
}

// Blocks per SM the registers must allow: one tile per block on the 16-byte path, 6 (40 registers, no spills) for the
// plain and GELU casts (tokens/s within the spread of 5's: docs/perf-notes.md, twenty-fourth session), 5 (51) for the
// dgelu casts without column sums (they spill at 40), or 4 (64) with column sums, the LayerNorm prologue or f32 input
// (f32 spills at 51); runs, 3 (85), or 2 for the LayerNorm cast and f32 input (two tiles' operands held at once would
// spill at 85). The scalar path (unaligned or ragged) keeps the compiler's choice (56-96 registers): bounded, it would
// spill.
template <typename T, Fp8CastInput kIn>
constexpr int min_blocks(bool vec, bool runs, bool colsum) {
  if (!vec) return 1;
  if (!runs) {
    if (colsum || kIn == Fp8CastInput::layernorm || sizeof(T) == 4) return 4;
    return kIn == Fp8CastInput::dgelu || kIn == Fp8CastInput::saved_dgelu ? 5 : 6;
  }
  return kIn == Fp8CastInput::layernorm || sizeof(T) == 4 ? 2 : 3;
}

template <Fp8Format F, typename T, bool kVec, bool kColsum, Fp8CastInput kIn, bool kRuns = false>
__global__ void __launch_bounds__(kThreads, min_blocks<T, kIn>(kVec, kRuns, kColsum))
    cast_transpose_kernel(const T* __restrict__ in, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                          int64_t rows, int64_t cols, bool vec_t, const float* __restrict__ scale_ptr,
                          Fp8CastOutputs stats, Fp8CastOperands ops) {
  static_assert(!kRuns || streams_runs<kIn>(kVec), "runs: the 16-byte plain and LayerNorm casts only");
  __shared__ uint4 s_t[kTileCols * kChunks];              // (tile cols, kChunks) chunks, swizzled
  __shared__ float s_colsum[kThreads / 32][kTileCols];    // (warps, tile cols) partial column sums
  const float scale = *scale_ptr;
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int64_t c0 = int64_t{blockIdx.x} * kTileCols, c = c0 + 8 * tx;  // c: the thread's first column
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows, step = gridDim.y;

  ThreadStats st;
  float col_sum[8] = {};  // (8): the thread's columns summed over its rows
  BlockLoads<T, kIn> next;  // kRuns: the next tile's loads
  if constexpr (kRuns) next.load(true, in, int64_t{blockIdx.y} * kTileRows, ty, c, rows, cols, ops);
  for (int64_t tile = blockIdx.y; tile < row_tiles; tile += step) {
    const int64_t r0 = tile * kTileRows;
    const bool more = tile + step < row_tiles;  // block-uniform
    uint2 codes[4];  // (4, 8): row j's columns 0-3 in .x, 4-7 in .y
    if constexpr (kVec) {
      BlockLoads<T, kIn> cur;
      if constexpr (kRuns) {
        cur = next;
        next.load(more, in, r0 + step * kTileRows, ty, c, rows, cols, ops);
      } else {
        cur.load(true, in, r0, ty, c, rows, cols, ops);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float x[8];
        cur.values(j, r0 + 4 * ty + j, c, rows, cols, x);
        codes[j] = convert8<F>(x, scale, st);
        if constexpr (kColsum) {
#pragma unroll
          for (int e = 0; e < 8; ++e) col_sum[e] += x[e];
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
    if (out_t) {
      stage_transposed(s_t, codes, tx, ty);
      __syncthreads();
      store_transposed(s_t, out_t, r0, c0, rows, cols, vec_t);
      if (more) __syncthreads();  // the next tile stages into s_t again
    }
    if constexpr (!kRuns) break;  // one tile per block: straight-line code
  }
  if constexpr (kColsum) {
    stage_colsum(s_colsum, col_sum, tx);
    __syncthreads();
    add_colsum(s_colsum, stats.colsum, c0, cols);
  }
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
    // (column tiles, row groups): gridDim.y caps rows at 65535 * 128 = 8388480.
    const int64_t col_tiles = checked_grid(ceil_div64(cols, kTileCols), kMaxGridX, "fp8_cast (tiled)",
                                           "cols (64 per tile)");
    const int64_t row_tiles = checked_grid(ceil_div64(rows, kTileRows), kMaxGridYZ, "fp8_cast (tiled)",
                                           "rows (128 per tile)");
    int64_t groups = row_tiles;  // one tile per block
    if (vec && (input == as_is || input == layernorm)) {
      // Runs: as many row groups as fill one wave of the runs kernel's blocks, where the column tiles leave room for
      // at least two per column (else one tile per block, at the one-tile kernel's higher occupancy).
      auto runs = stats.colsum ? cast_transpose_kernel<F, T, true, true, as_is, true>
                               : cast_transpose_kernel<F, T, true, false, as_is, true>;
      if constexpr (std::is_same_v<T, bf16>)
        if (input == layernorm) runs = cast_transpose_kernel<F, T, true, false, layernorm, true>;
      const int slots = resident_blocks_of(reinterpret_cast<const void*>(runs), kThreads);
      if (col_tiles * 2 <= slots) {
        kernel = runs;
        groups = std::min(row_tiles, slots / col_tiles);
      }
    }
    const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(groups));
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
