// fp8_all's two backward casts over the MLP's saved GELU input in one pass (fp8_cast_saved_gelu_pair,
// kernels/fp8_cast.cuh): the tiled cast of kernels/fp8_cast.cu with a second, transposed output.
#include "core/launch_limits.h"
#include "kernels/fp8_cast_tile.cuh"

namespace fp8t::kernels {
namespace {

// fp8_all's two backward casts over the MLP's saved GELU input in one pass over pre's codes (fp8_cast_saved_gelu_pair):
// the saved_dgelu cast of in (F, out and out_t, statistics, column sums) and the saved_gelu cast's transposed codes
// (E4M3, gelu_t, scale *gelu_scale_ptr, no statistics), each value computed as those casts compute it, so each
// output is theirs bit for bit; gelu and gelu' share their exp. The 16-byte path only (kVec's conditions, out_t and
// gelu_t 16-byte aligned).
template <Fp8Format F, bool kColsum>
__global__ void __launch_bounds__(kThreads, 4)
    saved_gelu_pair_kernel(const bf16* __restrict__ in, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                           uint8_t* __restrict__ gelu_t, int64_t rows, int64_t cols,
                           const float* __restrict__ scale_ptr, const float* __restrict__ gelu_scale_ptr,
                           Fp8CastOutputs stats, Fp8CastOperands ops) {
  __shared__ uint4 s_t[kTileCols * kChunks], s_g[kTileCols * kChunks];
  __shared__ float s_colsum[kThreads / 32][kTileCols];
  const float scale = *scale_ptr, gelu_scale = *gelu_scale_ptr;
  const int64_t r0 = int64_t{blockIdx.y} * kTileRows, c0 = int64_t{blockIdx.x} * kTileCols;
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int64_t c = c0 + 8 * tx;

  ThreadStats st, gelu_st;  // gelu_st is not flushed: the forward's cast recorded those statistics
  uint2 codes[4], gelu_codes[4];
  float col_sum[8] = {};
  uint4 dq[4];
  SavedPre pre;
  load_dy_and_pre(dq, pre, in, r0, ty, c, rows, cols, ops);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float p[8], x[8], g[8];
    pre.values(j, p);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {  // the bf16 roundings in pairs
      const float2 xd = dgelu_values_bf16(bf16_at(dq[j], e), p[e], bf16_at(dq[j], e + 1), p[e + 1]);
      const float2 gv = bf16_round2(gelu(p[e]), gelu(p[e + 1]));
      x[e] = xd.x, x[e + 1] = xd.y, g[e] = gv.x, g[e + 1] = gv.y;
    }
    codes[j] = convert8<F>(x, scale, st);
    gelu_codes[j] = convert8<Fp8Format::e4m3>(g, gelu_scale, gelu_st);
    if constexpr (kColsum) {
#pragma unroll
      for (int e = 0; e < 8; ++e) col_sum[e] += x[e];
    }
  }
  if (kColsum) stage_colsum(s_colsum, col_sum, tx);
  if (out) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + 4 * ty + j;
      if (r < rows && c < cols) *reinterpret_cast<uint2*>(out + r * cols + c) = codes[j];
    }
  }
  if (out_t) stage_transposed(s_t, codes, tx, ty);
  stage_transposed(s_g, gelu_codes, tx, ty);
  __syncthreads();
  if (kColsum) add_colsum(s_colsum, stats.colsum, c0, cols);
  if (out_t) store_transposed(s_t, out_t, r0, c0, rows, cols, true);
  store_transposed(s_g, gelu_t, r0, c0, rows, cols, true);
  flush_stats(st, stats);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

bool fp8_saved_gelu_pair_supported(const bf16* in, int64_t rows, int64_t cols, const uint8_t* out,
                                   const uint8_t* out_t, const uint8_t* gelu_t, const Fp8CastOperands& ops) {
  return rows > 0 && cols > 0 && cols % 8 == 0 && rows % 16 == 0 && aligned16(in) && (!out || aligned8(out)) &&
         (!out_t || aligned16(out_t)) && aligned16(gelu_t) && aligned8(ops.pre_codes);
}

void fp8_cast_saved_gelu_pair(const bf16* in, int64_t rows, int64_t cols, uint8_t* out, uint8_t* out_t,
                              uint8_t* gelu_t, Fp8Format format, const float* scale, const float* gelu_scale,
                              Fp8CastOutputs stats, const Fp8CastOperands& ops, cudaStream_t stream) {
  FP8T_CHECK(scale && gelu_scale && gelu_t && ops.pre_codes && ops.row_scale_inv,
             "fp8_cast_saved_gelu_pair: needs both scales, gelu_t, pre_codes and row_scale_inv");
  FP8T_CHECK(fp8_saved_gelu_pair_supported(in, rows, cols, out, out_t, gelu_t, ops),
             "fp8_cast_saved_gelu_pair: needs rows ({}) % 16 == 0, cols ({}) % 8 == 0 and aligned buffers "
             "(fp8_saved_gelu_pair_supported)", rows, cols);
  const char* op = "fp8_cast_saved_gelu_pair";
  const dim3 grid(checked_grid(ceil_div64(cols, kTileCols), kMaxGridX, op, "cols (64 per tile)"),
                  checked_grid(ceil_div64(rows, kTileRows), kMaxGridYZ, op, "rows (128 per tile)"));
  auto kernel = format == Fp8Format::e4m3
                    ? (stats.colsum ? saved_gelu_pair_kernel<Fp8Format::e4m3, true>
                                    : saved_gelu_pair_kernel<Fp8Format::e4m3, false>)
                    : (stats.colsum ? saved_gelu_pair_kernel<Fp8Format::e5m2, true>
                                    : saved_gelu_pair_kernel<Fp8Format::e5m2, false>);
  kernel<<<grid, kThreads, 0, stream>>>(in, out, out_t, gelu_t, rows, cols, scale, gelu_scale, stats, ops);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
