// LayerNorm: one warp per row for the forward pass and for dinp, 16-byte loads where rows allow. On the 16-byte
// path with C <= 4096 the backward is one kernel (dinp and the dw/db column sums); otherwise dw/db are column
// sums over row chunks, reduced in shared memory and added with one atomic per column per chunk. The
// statistics alone (layernorm_stats) for the FP8 cast that applies the normalization itself
// (kernels/fp8_cast.cuh); the residual add with the statistics (and the FP8 codes) is in add_layernorm.cu.

#include "kernels/device_facts.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_convert8.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/layernorm_rows.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

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
    float v[8];
    layernorm_chunk<kVec>(x, w, b, c0, C, m, s, v);
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

// Eight floats into shared memory at p (16-byte aligned), as two 16-byte stores.
__device__ __forceinline__ void store_row8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// dinp += the LayerNorm backward, and dw, db += its column sums, in one pass over the rows (the 16-byte path, C <=
// 256 kChunks). Block: 8 warps; row group g (rows 8 g .. 8 g + 7, one per warp) for g = blockIdx.x, + gridDim.x,
// ...; every warp runs every group (a row past N adds zeros), so the block's barriers line up. Per 256-column
// chunk, each warp's dw, db terms go through shared memory and thread t adds column 256 k + t over the 8 rows
// into registers; one atomic per column per block at the end. kOut codes: dinp's new bf16 values are also encoded as
// dy's E5M2 codes (LayerNormDyCodes; convert8, the cast's bit for bit): a lane's 8 codes of its row go to dy.codes in
// one 8-byte store (the launcher transposes them for dy.codes_t); their column sums ride with dw's and db's, the
// statistics are flushed once per block. kOut colsum: those column sums alone (a BF16 linear's bias gradient).
// The first pass asks L2 for the row's dinp (first touched in the second pass): its DRAM wait then overlaps the first
// pass instead of stalling each chunk of the second (one H100: -5% at C 768, -7% with the codes; unchanged at C 1600;
// holding dinp in registers lost occupancy and was slower: docs/perf-notes.md, fortieth session). The column-sum
// variant at C <= 1024 is held to 64 registers, 4 blocks per SM as the plain one gets (-5% more at C 768; at C 1600
// that spills and is slower).
enum class DyOut { none, codes, colsum };
template <int kChunks, DyOut kOut>
__global__ void __launch_bounds__(32 * kRowsPerBlock,
                                  kOut == DyOut::codes ? 3 : (kOut == DyOut::colsum && kChunks <= 4 ? 4 : 0))
    layernorm_backward_fused_kernel(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                                    const float* mean, const float* rstd, int64_t N, int C, LayerNormDyCodes dy) {
  constexpr bool kCodes = kOut == DyOut::codes, kSums = kOut != DyOut::none;
  constexpr int kSumRows = kSums ? kRowsPerBlock : 1;
  __shared__ __align__(16) float s_w[kRowsPerBlock][256], s_b[kRowsPerBlock][256], s_c[kSumRows][256];
  __shared__ float s_colsum[kSums ? 256 * kChunks : 1];     // dinp's column sums: thread t's columns only
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc_w[kChunks] = {}, acc_b[kChunks] = {};  // columns 256 k + threadIdx.x
  if constexpr (kSums)
#pragma unroll
    for (int k = 0; k < kChunks; ++k) s_colsum[256 * k + threadIdx.x] = 0.0f;
  ThreadStats st;
  const float scale = kCodes ? *dy.scale : 0.0f;
  const int64_t groups = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int64_t grp = blockIdx.x; grp < groups; grp += gridDim.x) {
    const int64_t row = grp * kRowsPerBlock + warp;
    const bool live = row < N;  // warp-uniform
    const bf16* x = inp + (live ? row : 0) * C;
    const bf16* dy_row = dout + (live ? row : 0) * C;
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
        asm volatile("prefetch.global.L2 [%0];" ::"l"(dx + c0));
        load8<true>(x, c0, C, xv);
        load8<true>(dy_row, c0, C, dv);
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
      float cw[8] = {}, cb[8] = {}, cc[8] = {};
      if (live && c0 < C) {
        float xv[8], dv[8], wv[8], acc[8];
        load8<true>(x, c0, C, xv);
        load8<true>(dy_row, c0, C, dv);
        load8<true>(w, c0, C, wv);
        load8<true>(dx, c0, C, acc);
        add_dinp(acc, xv, dv, wv, m, s, dnorm_mean, dnorm_norm_mean);
        store8<true>(dx, c0, C, acc);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          cw[i] = dv[i] * ((xv[i] - m) * s);  // dy * norm
          cb[i] = dv[i];
        }
        if constexpr (kSums) {
#pragma unroll
          for (int i = 0; i < 8; ++i) cc[i] = __bfloat162float(__float2bfloat16_rn(acc[i]));  // what dinp holds
        }
        if constexpr (kCodes)
          *reinterpret_cast<uint2*>(dy.codes + row * C + c0) = convert8<Fp8Format::e5m2>(cc, scale, st);
      }
      store_row8(&s_w[warp][lane * 8], cw);
      store_row8(&s_b[warp][lane * 8], cb);
      if constexpr (kSums) store_row8(&s_c[warp][lane * 8], cc);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
        acc_w[k] += s_w[r][threadIdx.x];
        acc_b[k] += s_b[r][threadIdx.x];
      }
      if constexpr (kSums) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r) sum += s_c[r][threadIdx.x];
        s_colsum[256 * k + threadIdx.x] += sum;
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
    if (kSums && dy.stats.colsum) atomicAdd(&dy.stats.colsum[c], s_colsum[c]);
  }
  if constexpr (kCodes) flush_block_stats<32 * kRowsPerBlock>(st, dy.stats);
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

bool layernorm_backward_writes_dy_codes(int64_t N, int C) { return N > 0 && C > 0 && C % 8 == 0 && C <= 4096; }

void layernorm_backward(bf16* dinp, float* dw, float* db, const bf16* dout, const bf16* inp, const bf16* w,
                        const float* mean, const float* rstd, int64_t N, int C, cudaStream_t stream,
                        const LayerNormDyCodes* dy) {
  FP8T_CHECK(N > 0 && C > 0, "layernorm_backward: bad sizes N={} C={}", N, C);
  const bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
  const unsigned blocks = row_blocks(N, "layernorm_backward");
  const int threads = 32 * kRowsPerBlock;
  if (dy && dy->codes) {
    FP8T_CHECK(vec && layernorm_backward_writes_dy_codes(N, C) && dy->scale &&
                   reinterpret_cast<uintptr_t>(dy->codes) % 8 == 0,
               "layernorm_backward: dy codes need C % 8 == 0 and C <= 4096 (N={}, C={}), 16-byte aligned rows, a "
               "scale and 8-byte aligned row-major codes",
               N, C);
  } else if (dy) {
    FP8T_CHECK(vec && layernorm_backward_writes_dy_codes(N, C) && dy->stats.colsum && !dy->codes_t,
               "layernorm_backward: dy's column sums alone need C % 8 == 0 and C <= 4096 (N={}, C={}), 16-byte "
               "aligned rows and stats.colsum (no codes_t without codes)",
               N, C);
  }
  // One pass, dinp and the column sums together; the two-kernel backward below takes the other shapes.
  if (vec && C <= 256 * 16) {
    static PerDevice<int> resident[15];  // by kernel below
    auto launch = [&](auto kernel, PerDevice<int>& resident) {
      // One wave of blocks (the occupancy calculator's, 4 per SM at 64 registers): row groups loop, and the column
      // atomics stay few. (3 per SM left a quarter of the SMs' slots empty: Nsight Compute, twenty-first session.)
      const int slots = resident.get([&] { return resident_blocks(reinterpret_cast<const void*>(kernel), threads); });
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, slots));
      kernel<<<grid, threads, 0, stream>>>(dinp, dw, db, dout, inp, w, mean, rstd, N, C,
                                           dy ? *dy : LayerNormDyCodes{});
      CUDA_CHECK_LAUNCH();
    };
    auto by_width = [&]<DyOut kOut>() {
      PerDevice<int>* r = resident + 5 * static_cast<int>(kOut);
      if (C <= 256)
        launch(layernorm_backward_fused_kernel<1, kOut>, r[0]);
      else if (C <= 512)
        launch(layernorm_backward_fused_kernel<2, kOut>, r[1]);
      else if (C <= 1024)
        launch(layernorm_backward_fused_kernel<4, kOut>, r[2]);
      else if (C <= 2048)
        launch(layernorm_backward_fused_kernel<8, kOut>, r[3]);
      else
        launch(layernorm_backward_fused_kernel<16, kOut>, r[4]);
    };
    if (!dy || !dy->codes) {
      if (dy) by_width.template operator()<DyOut::colsum>();
      else by_width.template operator()<DyOut::none>();
      return;
    }
    by_width.template operator()<DyOut::codes>();
    // The transposed copy from the row-major codes: the kernel's own transposed stores (8 rows gathered through
    // shared memory per 8-byte store) took 161 us where this pair takes 143 in Nsight Compute (H100, 1.5B widths),
    // though the training step's tokens/s did not tell them apart (docs/perf-notes.md, thirty-first session).
    if (dy->codes_t) fp8_transpose(dy->codes, N, C, dy->codes_t, stream);
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
