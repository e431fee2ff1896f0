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

// out = a + b (rounded to bf16 as the add op's kernel rounds; with bias, a + (b + bias[c]) in f32, the bias of the
// linear that wrote b and left it out, as add_forward with b_bias), then out's mean and rstd as row_stats computes them
// from the stored row, so the bits of layernorm_stats(out). kRegChunks > 0 (the 16-byte path, C <= 256 kRegChunks:
// by_row_path) keeps the lane's sums in registers: every load of the row is issued before the first store (which
// the compiler could not move loads past: bf16 pointers may alias) and the statistics need no re-read. Otherwise a
// lane re-reads the chunks it has just written (its own stores: no other lane's).
template <bool kVec, int kRegChunks>
__device__ __forceinline__ float2 add_row_with_stats(bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                                     const bf16* bias, int64_t row, int C, int lane) {
  constexpr int kMaxChunks = kRegChunks > 0 ? kRegChunks : 1;
  static_assert(kRegChunks == 0 || kVec, "the register path reads 16-byte chunks");
  const bf16 *ar = a + row * C, *br = b + row * C;
  bf16* orow = out + row * C;
  float2 stats;
  if constexpr (kRegChunks > 0) {
    uint4 va[kMaxChunks], vb[kMaxChunks];  // 8 bf16 each, element 2 q in the low half of word q
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
      const int c0 = lane * 8 + 256 * k;
      if (c0 < C) {
        va[k] = *reinterpret_cast<const uint4*>(ar + c0);
        vb[k] = *reinterpret_cast<const uint4*>(br + c0);
      }
    }
    float sum = 0.0f;  // row_stats's two passes over the same values in the same order
    auto pair = [](uint32_t w) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w)); };
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
      const int c0 = lane * 8 + 256 * k;
      if (c0 >= C) break;
      uint32_t* wa = &va[k].x;
      const uint32_t* wb = &vb[k].x;
      // The bias's chunk (one row for every row, from L1), added to b first; none: b as it is, the old bits.
      const uint4 vc = bias ? *reinterpret_cast<const uint4*>(bias + c0) : uint4{};
      const uint32_t* wc = &vc.x;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 x = pair(wa[q]);
        float2 y = pair(wb[q]);
        if (bias) {
          const float2 c = pair(wc[q]);
          y = make_float2(__fadd_rn(y.x, c.x), __fadd_rn(y.y, c.y));
        }
        const __nv_bfloat162 r = __floats2bfloat162_rn(__fadd_rn(x.x, y.x), __fadd_rn(x.y, y.y));
        wa[q] = *reinterpret_cast<const uint32_t*>(&r);
        const float2 f = pair(wa[q]);
        sum = __fadd_rn(__fadd_rn(sum, f.x), f.y);
      }
      *reinterpret_cast<uint4*>(orow + c0) = va[k];
    }
    const float m = row_mean(sum, C);
    float var = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
      if (lane * 8 + 256 * k >= C) break;
      const uint32_t* wa = &va[k].x;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = pair(wa[q]);
        const float d0 = __fsub_rn(f.x, m), d1 = __fsub_rn(f.y, m);
        var = __fmaf_rn(d1, d1, __fmaf_rn(d0, d0, var));
      }
    }
    stats = make_float2(m, row_rstd(var, C));
  } else {
#pragma unroll 4
    for (int c0 = lane * 8; c0 < C; c0 += 256) {
      float va[8], vb[8];
      load8<kVec>(ar, c0, C, va);
      load8<kVec>(br, c0, C, vb);
      if (bias) {
        float vc[8];
        load8<kVec>(bias, c0, C, vc);
#pragma unroll
        for (int i = 0; i < 8; ++i) vb[i] = __fadd_rn(vb[i], vc[i]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) va[i] = __fadd_rn(va[i], vb[i]);
      store8<kVec>(orow, c0, C, va);
    }
    stats = row_stats<kVec>(orow, C, lane);
  }
  if (lane == 0) {
    mean[row] = stats.x;
    rstd[row] = stats.y;
  }
  return stats;
}

template <bool kVec, int kRegChunks>
__global__ void add_layernorm_stats_kernel(bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                           const bf16* bias, int64_t N, int C) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row < N) add_row_with_stats<kVec, kRegChunks>(out, mean, rstd, a, b, bias, row, C, threadIdx.x % 32);
}

// add_layernorm_stats_kernel, then the sum's LayerNorm into normed in the same pass: the chunks and arithmetic of
// layernorm_forward_kernel over the stored sum, so its bits. A lane re-reads its own chunks of out (from cache).
template <bool kVec, int kRegChunks>
__global__ void add_layernorm_forward_kernel(bf16* out, bf16* normed, float* mean, float* rstd, const bf16* a,
                                             const bf16* b, const bf16* bias, const bf16* w, const bf16* lb, int64_t N,
                                             int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  if (row >= N) return;
  const float2 stats = add_row_with_stats<kVec, kRegChunks>(out, mean, rstd, a, b, bias, row, C, lane);
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
template <Fp8Format F, bool kVec, int kRegChunks>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    add_layernorm_cast_kernel(bf16* out, float* mean, float* rstd, uint8_t* codes, const bf16* a, const bf16* b,
                              const bf16* bias, const bf16* w, const bf16* lb, int64_t N, int C, const float* scale_ptr,
                              Fp8CastOutputs cast_stats) {
  static_assert(32 * kRowsPerBlock == kThreads, "flush_stats reduces over kThreads threads");
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / 32;
  ThreadStats st;
  if (row < N) {
    const float2 stats = add_row_with_stats<kVec, kRegChunks>(out, mean, rstd, a, b, bias, row, C, lane);
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

// f.template operator()<kVec, kRegChunks>() with the row path for vec (16-byte chunks allowed) and C: the register
// path with 4 or 8 chunks per lane where the rows fit, else the re-reading one.
template <class F>
void by_row_path(bool vec, int C, F&& f) {
  if (!vec)
    f.template operator()<false, 0>();
  else if (C <= 1024)
    f.template operator()<true, 4>();
  else if (C <= 2048)
    f.template operator()<true, 8>();
  else
    f.template operator()<true, 0>();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void add_layernorm_stats(bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b, int64_t N, int C,
                         cudaStream_t stream, const bf16* b_bias) {
  FP8T_CHECK(N > 0 && C > 0, "add_layernorm_stats: bad sizes N={} C={}", N, C);
  // Both paths give the same bits where C % 8 == 0 (the same chunks in the same order), as layernorm_stats's do.
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(b) && aligned16(b_bias);
  const unsigned blocks = row_blocks(N, "add_layernorm_stats");
  const int threads = 32 * kRowsPerBlock;
  by_row_path(vec, C, [&]<bool kVec, int kRegChunks>() {
    add_layernorm_stats_kernel<kVec, kRegChunks><<<blocks, threads, 0, stream>>>(out, mean, rstd, a, b, b_bias, N, C);
  });
  CUDA_CHECK_LAUNCH();
}

void add_layernorm_forward(bf16* out, bf16* normed, float* mean, float* rstd, const bf16* a, const bf16* b,
                           const bf16* w, const bf16* lb, int64_t N, int C, cudaStream_t stream, const bf16* b_bias) {
  FP8T_CHECK(N > 0 && C > 0, "add_layernorm_forward: bad sizes N={} C={}", N, C);
  // The statistics and the output do not depend on the path (layernorm_forward's choice may differ, its bits not).
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(normed) && aligned16(a) && aligned16(b) && aligned16(w) &&
                   aligned16(lb) && aligned16(b_bias);
  const unsigned blocks = row_blocks(N, "add_layernorm_forward");
  const int threads = 32 * kRowsPerBlock;
  by_row_path(vec, C, [&]<bool kVec, int kRegChunks>() {
    add_layernorm_forward_kernel<kVec, kRegChunks>
        <<<blocks, threads, 0, stream>>>(out, normed, mean, rstd, a, b, b_bias, w, lb, N, C);
  });
  CUDA_CHECK_LAUNCH();
}

void add_layernorm_cast(bf16* out, float* mean, float* rstd, uint8_t* codes, const bf16* a, const bf16* b,
                        const bf16* w, const bf16* lb, int64_t N, int C, Fp8Format format, const float* scale,
                        Fp8CastOutputs stats, cudaStream_t stream, const bf16* b_bias) {
  FP8T_CHECK(N > 0 && C > 0, "add_layernorm_cast: bad sizes N={} C={}", N, C);
  FP8T_CHECK(scale != nullptr && codes != nullptr, "add_layernorm_cast: the scale or the codes pointer is null");
  FP8T_CHECK(stats.colsum == nullptr, "add_layernorm_cast: no column sums");
  // The same chunks as add_layernorm_stats's either way, so the same statistics; the codes do not depend on the path.
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(b) && aligned16(w) && aligned16(lb) &&
                   aligned8(codes) && aligned16(b_bias);
  const unsigned blocks = row_blocks(N, "add_layernorm_cast");
  const int threads = 32 * kRowsPerBlock;
  by_row_path(vec, C, [&]<bool kVec, int kRegChunks>() {
    auto* kernel = format == Fp8Format::e4m3 ? add_layernorm_cast_kernel<Fp8Format::e4m3, kVec, kRegChunks>
                                             : add_layernorm_cast_kernel<Fp8Format::e5m2, kVec, kRegChunks>;
    kernel<<<blocks, threads, 0, stream>>>(out, mean, rstd, codes, a, b, b_bias, w, lb, N, C, scale, stats);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
