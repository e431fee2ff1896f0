// LayerNorm: one warp per row for the forward pass and for dinp, 16-byte loads where rows allow. On the 16-byte
// path with C <= 4096 the backward is one kernel (dinp and the dw/db column sums); otherwise dw/db are column
// sums over row chunks, reduced in shared memory and added with one atomic per column per chunk. The
// statistics alone (layernorm_stats) for the FP8 cast that applies the normalization itself
// (kernels/fp8_cast.cuh).

#include "core/launch_limits.h"
#include "kernels/cuda_common.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/fp8_cast_common.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/layernorm_math.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr int kRowsPerBlock = 8;  // one warp each

// Row access in chunks of 8 elements: 16-byte vectors when the rows allow it (kVec), else scalars
// with the tail masked. Each lane owns chunks lane, lane + 32, ... of its row.
template <bool kVec>
__device__ __forceinline__ void load8(const bf16* p, int c0, int C, float (&v)[8]) {
  if constexpr (kVec) {
    const auto q = Vec16<bf16>::load(p + c0);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(q.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = c0 + i < C ? __bfloat162float(p[c0 + i]) : 0.0f;
  }
}
template <bool kVec>
__device__ __forceinline__ void store8(bf16* p, int c0, int C, const float (&v)[8]) {
  if constexpr (kVec) {
    Vec16<bf16> q;
#pragma unroll
    for (int i = 0; i < 8; ++i) q.v[i] = __float2bfloat16_rn(v[i]);
    q.store(p + c0);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (c0 + i < C) p[c0 + i] = __float2bfloat16_rn(v[i]);
  }
}

// The row's mean and rstd (as .x, .y) in every lane of the warp: two passes (mean, then the mean
// square deviation), with explicit _rn arithmetic so that layernorm_forward_kernel and
// layernorm_stats_kernel, which both inline it, produce the same bits.
template <bool kVec>
__device__ __forceinline__ float2 row_stats(const bf16* x, int C, int lane) {
  float sum = 0.0f;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float v[8];
    load8<kVec>(x, c0, C, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum = __fadd_rn(sum, v[i]);
  }
  const float m = __fdiv_rn(warp_sum(sum), static_cast<float>(C));
  float var = 0.0f;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float v[8];
    load8<kVec>(x, c0, C, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float d = c0 + i < C ? __fsub_rn(v[i], m) : 0.0f;
      var = __fmaf_rn(d, d, var);
    }
  }
  return make_float2(m, rsqrtf(__fadd_rn(__fdiv_rn(warp_sum(var), static_cast<float>(C)), kLayerNormEps)));
}

template <bool kVec>
__global__ void layernorm_forward_kernel(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                                         const bf16* b, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const bf16* x = inp + row * C;
  const float2 stats = row_stats<kVec>(x, C, lane);
  const float m = stats.x, s = stats.y;
  bf16* y = out + row * C;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float v[8], wv[8], bv[8];
    load8<kVec>(x, c0, C, v);
    load8<kVec>(w, c0, C, wv);
    load8<kVec>(b, c0, C, bv);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = layernorm_value(v[i], m, s, wv[i], bv[i]);
    store8<kVec>(y, c0, C, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// layernorm_forward_kernel without the output: the same mean and rstd, bit for bit.
template <bool kVec>
__global__ void layernorm_stats_kernel(float* mean, float* rstd, const bf16* inp, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const float2 stats = row_stats<kVec>(inp + row * C, C, lane);
  if (lane == 0) {
    mean[row] = stats.x;
    rstd[row] = stats.y;
  }
}

// out = a + b (rounded to bf16 as the add op's kernel rounds), then out's mean and rstd: a lane re-reads the chunks it
// has just written (its own stores: no other lane's), so the statistics are row_stats of the stored row, the bits of
// layernorm_stats(out).
template <bool kVec>
__device__ __forceinline__ float2 add_row_with_stats(bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                                     int64_t row, int C, int lane) {
  const bf16 *ar = a + row * C, *br = b + row * C;
  bf16* orow = out + row * C;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float va[8], vb[8];
    load8<kVec>(ar, c0, C, va);
    load8<kVec>(br, c0, C, vb);
#pragma unroll
    for (int i = 0; i < 8; ++i) va[i] = __fadd_rn(va[i], vb[i]);
    store8<kVec>(orow, c0, C, va);
  }
  const float2 stats = row_stats<kVec>(orow, C, lane);
  if (lane == 0) {
    mean[row] = stats.x;
    rstd[row] = stats.y;
  }
  return stats;
}

template <bool kVec>
__global__ void add_layernorm_stats_kernel(bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                           int64_t N, int C) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row < N) add_row_with_stats<kVec>(out, mean, rstd, a, b, row, C, threadIdx.x % 32);
}

// The backward's two row sums over one 8-column chunk: sum dnorm and sum dnorm * norm, dnorm = dy * w (zero past
// the row's end on the scalar path), norm = (x - m) * s.
__device__ __forceinline__ void add_dnorm_sums(const float (&xv)[8], const float (&dv)[8], const float (&wv)[8],
                                               float m, float s, float& dnorm_sum, float& dnorm_norm_sum) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float dnorm = dv[i] * wv[i];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (xv[i] - m) * s;
  }
}

// dinp's update for one 8-column chunk, from the row means of the two sums above.
__device__ __forceinline__ void add_dinp(float (&acc)[8], const float (&xv)[8], const float (&dv)[8],
                                         const float (&wv)[8], float m, float s, float dnorm_mean,
                                         float dnorm_norm_mean) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float norm = (xv[i] - m) * s;
    acc[i] += (dv[i] * wv[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

template <bool kVec>
__global__ void layernorm_backward_dinp_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w,
                                               const float* mean, const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const bf16* x = inp + row * C;
  const bf16* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float xv[8], dv[8], wv[8];
    load8<kVec>(x, c0, C, xv);
    load8<kVec>(dy, c0, C, dv);
    load8<kVec>(w, c0, C, wv);
    add_dnorm_sums(xv, dv, wv, m, s, dnorm_sum, dnorm_norm_sum);
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
  bf16* dx = dinp + row * C;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float xv[8], dv[8], wv[8], acc[8];
    load8<kVec>(x, c0, C, xv);
    load8<kVec>(dy, c0, C, dv);
    load8<kVec>(w, c0, C, wv);
    load8<kVec>(dx, c0, C, acc);
    add_dinp(acc, xv, dv, wv, m, s, dnorm_mean, dnorm_norm_mean);
    store8<kVec>(dx, c0, C, acc);
  }
}

// block (32 column lanes, 8 row lanes); grid (column tiles, row chunks). Each column lane owns 8
// adjacent columns (kVec: one 16-byte load of dout and of inp per row) or 1 column (scalar path).
template <bool kVec>
__global__ void layernorm_backward_dwdb_kernel(float* dw, float* db, const bf16* dout, const bf16* inp,
                                               const float* mean, const float* rstd, int64_t N, int C) {
  constexpr int kCols = kVec ? 8 : 1;
  __shared__ float s_dw[8][32 * kCols + 1], s_db[8][32 * kCols + 1];
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * kCols;
  float acc_w[kCols] = {}, acc_b[kCols] = {};
  if (c0 < C) {
    for (int64_t r = blockIdx.y * int64_t{8} + threadIdx.y; r < N; r += int64_t{gridDim.y} * 8) {
      const float m = mean[r], s = rstd[r];
      float d[kCols], x[kCols];
      if constexpr (kVec) {
        const auto qd = Vec16<bf16>::load(dout + r * C + c0), qx = Vec16<bf16>::load(inp + r * C + c0);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          d[i] = __bfloat162float(qd.v[i]);
          x[i] = __bfloat162float(qx.v[i]);
        }
      } else {
        d[0] = __bfloat162float(dout[r * C + c0]);
        x[0] = __bfloat162float(inp[r * C + c0]);
      }
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        acc_b[i] += d[i];
        acc_w[i] += d[i] * (x[i] - m) * s;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    s_dw[threadIdx.y][threadIdx.x * kCols + i] = acc_w[i];
    s_db[threadIdx.y][threadIdx.x * kCols + i] = acc_b[i];
  }
  __syncthreads();
  // Thread (x, y) finishes columns x + 32 * j of the tile for j = y, y + 8, ...
  for (int j = threadIdx.y; j < kCols; j += 8) {
    const int t = threadIdx.x + 32 * j, c = blockIdx.x * 32 * kCols + t;
    if (c >= C) continue;
    float sw = 0.0f, sb = 0.0f;
    for (int k = 0; k < 8; ++k) {
      sw += s_dw[k][t];
      sb += s_db[k][t];
    }
    atomicAdd(&dw[c], sw);
    atomicAdd(&db[c], sb);
  }
}

// dinp += the LayerNorm backward, and dw, db += its column sums, in one pass over the rows (the 16-byte path, C <=
// 256 kChunks). Block: 8 warps; row group g (rows 8 g .. 8 g + 7, one per warp) for g = blockIdx.x, + gridDim.x,
// ...; every warp runs every group (a row past N adds zeros), so the block's barriers line up. Per 256-column
// chunk, each warp's dw, db terms go through shared memory and thread t adds column 256 k + t over the 8 rows
// into registers; one atomic per column per block at the end.
template <int kChunks>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    layernorm_backward_fused_kernel(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                                    const float* mean, const float* rstd, int64_t N, int C) {
  __shared__ __align__(16) float s_w[kRowsPerBlock][256], s_b[kRowsPerBlock][256];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc_w[kChunks] = {}, acc_b[kChunks] = {};  // columns 256 k + threadIdx.x
  const int64_t groups = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
    const int64_t row = grp * kRowsPerBlock + warp;
    const bool live = row < N;  // warp-uniform
    const bf16* x = inp + (live ? row : 0) * C;
    const bf16* dy = dout + (live ? row : 0) * C;
    bf16* dx = dinp + (live ? row : 0) * C;
    float m = 0.0f, s = 0.0f, dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    if (live) {
      m = mean[row];
      s = rstd[row];
      float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        const int c0 = k * 256 + lane * 8;
        if (c0 >= C) break;
        float xv[8], dv[8], wv[8];
        load8<true>(x, c0, C, xv);
        load8<true>(dy, c0, C, dv);
        load8<true>(w, c0, C, wv);
        add_dnorm_sums(xv, dv, wv, m, s, dnorm_sum, dnorm_norm_sum);
      }
      dnorm_mean = warp_sum(dnorm_sum) / C;
      dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
    }
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      if (k * 256 >= C) break;  // block-uniform
      const int c0 = k * 256 + lane * 8;
      float cw[8] = {}, cb[8] = {};
      if (live && c0 < C) {
        float xv[8], dv[8], wv[8], acc[8];
        load8<true>(x, c0, C, xv);
        load8<true>(dy, c0, C, dv);
        load8<true>(w, c0, C, wv);
        load8<true>(dx, c0, C, acc);
        add_dinp(acc, xv, dv, wv, m, s, dnorm_mean, dnorm_norm_mean);
        store8<true>(dx, c0, C, acc);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          cw[i] = dv[i] * ((xv[i] - m) * s);  // dy * norm
          cb[i] = dv[i];
        }
      }
      float4* sw = reinterpret_cast<float4*>(&s_w[warp][lane * 8]);
      float4* sb = reinterpret_cast<float4*>(&s_b[warp][lane * 8]);
      sw[0] = make_float4(cw[0], cw[1], cw[2], cw[3]);
      sw[1] = make_float4(cw[4], cw[5], cw[6], cw[7]);
      sb[0] = make_float4(cb[0], cb[1], cb[2], cb[3]);
      sb[1] = make_float4(cb[4], cb[5], cb[6], cb[7]);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
        acc_w[k] += s_w[r][threadIdx.x];
        acc_b[k] += s_b[r][threadIdx.x];
      }
      __syncthreads();  // the chunk's terms are read before the next chunk's overwrite them
    }
  }
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = k * 256 + threadIdx.x;
    if (c >= C) break;
    atomicAdd(&dw[c], acc_w[k]);
    atomicAdd(&db[c], acc_b[k]);
  }
}

// add_layernorm_stats_kernel, then the sum's LayerNorm cast to FP8 in the same pass: codes (N, C) row-major, bit for
// bit what fp8_cast with the layernorm prologue writes from out and these statistics (layernorm_value rounded to bf16,
// times scale, to_fp8), with the same amax and saturation count. A lane re-reads its own chunks of out a third time
// (from cache). kVec also needs codes 8-byte aligned. No early return: flush_stats meets the block at a barrier.
template <Fp8Format F, bool kVec>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    add_layernorm_cast_kernel(bf16* out, float* mean, float* rstd, uint8_t* codes, const bf16* a, const bf16* b,
                              const bf16* w, const bf16* lb, int64_t N, int C, const float* scale_ptr,
                              Fp8CastOutputs cast_stats) {
  static_assert(32 * kRowsPerBlock == kThreads, "flush_stats reduces over kThreads threads");
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  ThreadStats st;
  if (row < N) {
    const float2 stats = add_row_with_stats<kVec>(out, mean, rstd, a, b, row, C, lane);
    const float m = stats.x, s = stats.y;
    const bf16* orow = out + row * C;
    const float scale = *scale_ptr;
    uint8_t* crow = codes + row * C;
#pragma unroll 2
    for (int c0 = lane * 8; c0 < C; c0 += 256) {
      float x[8], wv[8], bv[8];
      load8<kVec>(orow, c0, C, x);
      load8<kVec>(w, c0, C, wv);
      load8<kVec>(lb, c0, C, bv);
#pragma unroll
      for (int i = 0; i < 8; i += 2) {  // layernorm_value_bf16, the bf16 roundings in pairs; padding stays zero
        const float2 v = bf16_round2(layernorm_value(x[i], m, s, wv[i], bv[i]),
                                     layernorm_value(x[i + 1], m, s, wv[i + 1], bv[i + 1]));
        x[i] = kVec || c0 + i < C ? v.x : 0.0f;
        x[i + 1] = kVec || c0 + i + 1 < C ? v.y : 0.0f;
      }
      const uint2 q = convert8<F>(x, scale, st);
      if constexpr (kVec) {
        *reinterpret_cast<uint2*>(crow + c0) = q;
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (c0 + i < C) crow[c0 + i] = byte_of(i < 4 ? q.x : q.y, i % 4);
      }
    }
  }
  flush_stats(st, cast_stats);
}

// The grid for N rows, kRowsPerBlock per block: the kernels index rows in 64 bits, the grid must fit.
unsigned row_blocks(int64_t N, const char* op) {
  return checked_grid(ceil_div64(N, kRowsPerBlock), kMaxGridX, op, "N rows (8 per block)");
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int64_t N,
                       int C, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "layernorm_forward: bad sizes N={} C={}", N, C);
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(w) && aligned16(b);
  const unsigned blocks = row_blocks(N, "layernorm_forward");
  const int threads = 32 * kRowsPerBlock;
  if (vec)
    layernorm_forward_kernel<true><<<blocks, threads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
  else
    layernorm_forward_kernel<false><<<blocks, threads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
  CUDA_CHECK_LAUNCH();
}

void layernorm_stats(float* mean, float* rstd, const bf16* inp, int64_t N, int C, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "layernorm_stats: bad sizes N={} C={}", N, C);
  // The vector path reads a row exactly as layernorm_forward's does (same chunks, same order), so
  // choosing it by inp's alignment alone gives the same statistics as the forward's choice.
  const bool vec = C % 8 == 0 && aligned16(inp);
  const unsigned blocks = row_blocks(N, "layernorm_stats");
  const int threads = 32 * kRowsPerBlock;
  if (vec)
    layernorm_stats_kernel<true><<<blocks, threads, 0, stream>>>(mean, rstd, inp, N, C);
  else
    layernorm_stats_kernel<false><<<blocks, threads, 0, stream>>>(mean, rstd, inp, N, C);
  CUDA_CHECK_LAUNCH();
}

void add_layernorm_stats(bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b, int64_t N, int C,
                         cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "add_layernorm_stats: bad sizes N={} C={}", N, C);
  // Both paths give the same bits where C % 8 == 0 (the same chunks in the same order), as layernorm_stats's do.
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(b);
  const unsigned blocks = row_blocks(N, "add_layernorm_stats");
  const int threads = 32 * kRowsPerBlock;
  if (vec)
    add_layernorm_stats_kernel<true><<<blocks, threads, 0, stream>>>(out, mean, rstd, a, b, N, C);
  else
    add_layernorm_stats_kernel<false><<<blocks, threads, 0, stream>>>(out, mean, rstd, a, b, N, C);
  CUDA_CHECK_LAUNCH();
}

void add_layernorm_cast(bf16* out, float* mean, float* rstd, uint8_t* codes, const bf16* a, const bf16* b,
                        const bf16* w, const bf16* lb, int64_t N, int C, Fp8Format format, const float* scale,
                        Fp8CastOutputs stats, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "add_layernorm_cast: bad sizes N={} C={}", N, C);
  FP8T_CHECK(scale != nullptr && codes != nullptr, "add_layernorm_cast: the scale or the codes pointer is null");
  FP8T_CHECK(stats.colsum == nullptr, "add_layernorm_cast: no column sums");
  // The same chunks as add_layernorm_stats's either way, so the same statistics; the codes do not depend on the path.
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(b) && aligned16(w) && aligned16(lb) &&
                   aligned8(codes);
  const unsigned blocks = row_blocks(N, "add_layernorm_cast");
  const int threads = 32 * kRowsPerBlock;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, threads, 0, stream>>>(out, mean, rstd, codes, a, b, w, lb, N, C, scale, stats);
    CUDA_CHECK_LAUNCH();
  };
  if (format == Fp8Format::e4m3)
    vec ? launch(add_layernorm_cast_kernel<Fp8Format::e4m3, true>) : launch(add_layernorm_cast_kernel<Fp8Format::e4m3, false>);
  else
    vec ? launch(add_layernorm_cast_kernel<Fp8Format::e5m2, true>) : launch(add_layernorm_cast_kernel<Fp8Format::e5m2, false>);
}

void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                        const float* mean, const float* rstd, int64_t N, int C, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "layernorm_backward: bad sizes N={} C={}", N, C);
  const bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
  const unsigned blocks = row_blocks(N, "layernorm_backward");
  const int threads = 32 * kRowsPerBlock;
  // One pass, dinp and the column sums together; the two-kernel backward below takes the other shapes.
  if (vec && C <= 256 * 16) {
    const int slots = 3 * sm_count();  // a few blocks per SM: row groups loop, and the column atomics stay few
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, slots));
    auto launch = [&](auto kernel) {
      kernel<<<grid, threads, 0, stream>>>(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
      CUDA_CHECK_LAUNCH();
    };
    if (C <= 256)
      launch(layernorm_backward_fused_kernel<1>);
    else if (C <= 512)
      launch(layernorm_backward_fused_kernel<2>);
    else if (C <= 1024)
      launch(layernorm_backward_fused_kernel<4>);
    else if (C <= 2048)
      launch(layernorm_backward_fused_kernel<8>);
    else
      launch(layernorm_backward_fused_kernel<16>);
    return;
  }
  if (vec)
    layernorm_backward_dinp_kernel<true><<<blocks, threads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  else
    layernorm_backward_dinp_kernel<false><<<blocks, threads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  const int row_chunks = static_cast<int>(std::clamp<int64_t>(ceil_div64(N, 64), 1, 512));
  if (C % 8 == 0 && aligned16(dout) && aligned16(inp))
    layernorm_backward_dwdb_kernel<true>
        <<<dim3(ceil_div(C, 256), row_chunks), dim3(32, 8), 0, stream>>>(dw, db, dout, inp, mean, rstd, N, C);
  else
    layernorm_backward_dwdb_kernel<false>
        <<<dim3(ceil_div(C, 32), row_chunks), dim3(32, 8), 0, stream>>>(dw, db, dout, inp, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
