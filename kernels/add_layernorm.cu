// The residual add before a LayerNorm: out = a + b with out's LayerNorm statistics in the same pass
// (add_layernorm_stats, for a LayerNorm that runs inside an FP8 cast), with the LayerNorm's output too
// (add_layernorm_forward), or with its FP8 codes (add_layernorm_cast). One warp per row (kernels/layernorm_rows.cuh),
// the statistics those of layernorm_stats bit for bit.
#include "kernels/fp8_cast_common.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/layernorm_rows.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

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

// add_layernorm_stats_kernel, then the sum's LayerNorm into normed in the same pass: the chunks and arithmetic of
// layernorm_forward_kernel over the stored sum, so its bits. A lane re-reads its own chunks of out (from cache).
template <bool kVec>
__global__ void add_layernorm_forward_kernel(bf16* out, bf16* normed, float* mean, float* rstd, const bf16* a,
                                             const bf16* b, const bf16* w, const bf16* lb, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const float2 stats = add_row_with_stats<kVec>(out, mean, rstd, a, b, row, C, lane);
  const bf16* orow = out + row * C;
  bf16* nrow = normed + row * C;
#pragma unroll 4
  for (int c0 = lane * 8; c0 < C; c0 += 256) {
    float v[8];
    layernorm_chunk<kVec>(orow, w, lb, c0, C, stats.x, stats.y, v);
    store8<kVec>(nrow, c0, C, v);
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
      float x[8];
      layernorm_chunk<kVec>(orow, w, lb, c0, C, m, s, x);
#pragma unroll
      for (int i = 0; i < 8; i += 2) {  // layernorm_value_bf16, the bf16 roundings in pairs; padding stays zero
        const float2 v = bf16_round2(x[i], x[i + 1]);
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

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

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

void add_layernorm_forward(bf16* out, bf16* normed, float* mean, float* rstd, const bf16* a, const bf16* b,
                           const bf16* w, const bf16* lb, int64_t N, int C, cudaStream_t stream) {
  FP8T_CHECK(N > 0 && C > 0, "add_layernorm_forward: bad sizes N={} C={}", N, C);
  // The statistics and the output do not depend on the path (layernorm_forward's choice may differ, its bits not).
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(normed) && aligned16(a) && aligned16(b) && aligned16(w) &&
                   aligned16(lb);
  const unsigned blocks = row_blocks(N, "add_layernorm_forward");
  const int threads = 32 * kRowsPerBlock;
  if (vec)
    add_layernorm_forward_kernel<true><<<blocks, threads, 0, stream>>>(out, normed, mean, rstd, a, b, w, lb, N, C);
  else
    add_layernorm_forward_kernel<false><<<blocks, threads, 0, stream>>>(out, normed, mean, rstd, a, b, w, lb, N, C);
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

}  // namespace fp8t::kernels
