// Packed, register-tiled GEMM (the BLIS loop nest): blocks of A and B are copied into
// micro-panels so the inner kernel streams contiguous memory whatever the operand layout, and an
// MR x NR tile of C stays in vector registers across the whole K block.
#include "ops/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace fp8t::cpu {

namespace {

// Register tile: MR rows x two 32-byte vectors (12 accumulators of the 16 AVX2 registers).
template <typename F>
struct Tile {
  static constexpr int L = 32 / sizeof(F);  // lanes per vector
  static constexpr int MR = 6;
  static constexpr int NR = 2 * L;
};
// Cache blocks: an A block (MC x KC) stays in L2, a B micro-panel (KC x NR) in L1.
constexpr int64_t MC = 96, KC = 256, NC = 512;

#define FP8T_INLINE inline __attribute__((always_inline))

// buf: ceil(mc / MR) panels, each (kc, MR); rows past mc are zero.
template <typename F>
FP8T_INLINE void pack_a(F* buf, StridedMat<F> A, int64_t i0, int64_t mc, int64_t p0, int64_t kc) {
  constexpr int MR = Tile<F>::MR;
  for (int64_t ir = 0; ir < mc; ir += MR) {
    F* dst = buf + ir * kc;
    const int mr = static_cast<int>(std::min<int64_t>(MR, mc - ir));
    for (int i = 0; i < MR; ++i) {
      if (i >= mr) {
        for (int64_t p = 0; p < kc; ++p) dst[p * MR + i] = F(0);
        continue;
      }
      const F* src = A.p + (i0 + ir + i) * A.rs + p0 * A.cs;
      for (int64_t p = 0; p < kc; ++p) dst[p * MR + i] = src[p * A.cs];
    }
  }
}

// buf: ceil(nc / NR) panels, each (kc, NR); columns past nc are zero.
template <typename F>
FP8T_INLINE void pack_b(F* buf, StridedMat<F> B, int64_t p0, int64_t kc, int64_t j0, int64_t nc) {
  constexpr int NR = Tile<F>::NR;
  for (int64_t jr = 0; jr < nc; jr += NR) {
    F* dst = buf + jr * kc;
    const int nr = static_cast<int>(std::min<int64_t>(NR, nc - jr));
    if (B.cs == 1) {  // rows of B are contiguous: copy NR-wide strips
      for (int64_t p = 0; p < kc; ++p) {
        const F* src = B.p + (p0 + p) * B.rs + j0 + jr;
        for (int j = 0; j < NR; ++j) dst[p * NR + j] = j < nr ? src[j] : F(0);
      }
    } else {  // columns of B are contiguous (the weight in forward): walk each column
      for (int j = 0; j < NR; ++j) {
        if (j >= nr) {
          for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = F(0);
          continue;
        }
        const F* src = B.p + p0 * B.rs + (j0 + jr + j) * B.cs;
        for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = src[p * B.rs];
      }
    }
  }
}

// C (mr, nr) += a (kc, MR)^T-panel @ b (kc, NR)-panel, accumulated in registers.
template <typename F>
FP8T_INLINE void micro_kernel(int64_t kc, const F* a, const F* b, F* c, int64_t ldc, int mr, int nr) {
  constexpr int L = Tile<F>::L, MR = Tile<F>::MR, NR = Tile<F>::NR;
  typedef F V __attribute__((vector_size(32)));
  V acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = V{};
  for (int64_t p = 0; p < kc; ++p) {
    V b0, b1;
    std::memcpy(&b0, b + p * NR, sizeof(V));
    std::memcpy(&b1, b + p * NR + L, sizeof(V));
    for (int i = 0; i < MR; ++i) {
      const F ai = a[p * MR + i];
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  if (mr == MR && nr == NR) {
    for (int i = 0; i < MR; ++i) {
      V c0, c1;
      std::memcpy(&c0, c + i * ldc, sizeof(V));
      std::memcpy(&c1, c + i * ldc + L, sizeof(V));
      c0 += acc[i][0];
      c1 += acc[i][1];
      std::memcpy(c + i * ldc, &c0, sizeof(V));
      std::memcpy(c + i * ldc + L, &c1, sizeof(V));
    }
  } else {
    F tmp[MR][NR];
    std::memcpy(tmp, acc, sizeof(tmp));
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) c[i * ldc + j] += tmp[i][j];
  }
}

// One (mc, nc) block of C at (i0, j0), over all of K.
template <typename F>
FP8T_INLINE void gemm_block(F* C, int64_t ldc, StridedMat<F> A, StridedMat<F> B, int64_t i0, int64_t mc,
                            int64_t j0, int64_t nc, int64_t K, F* abuf, F* bbuf) {
  constexpr int MR = Tile<F>::MR, NR = Tile<F>::NR;
  for (int64_t p0 = 0; p0 < K; p0 += KC) {
    const int64_t kc = std::min(KC, K - p0);
    pack_b(bbuf, B, p0, kc, j0, nc);
    pack_a(abuf, A, i0, mc, p0, kc);
    for (int64_t jr = 0; jr < nc; jr += NR) {
      for (int64_t ir = 0; ir < mc; ir += MR) {
        micro_kernel(kc, abuf + ir * kc, bbuf + jr * kc, C + (i0 + ir) * ldc + j0 + jr, ldc,
                     static_cast<int>(std::min<int64_t>(MR, mc - ir)), static_cast<int>(std::min<int64_t>(NR, nc - jr)));
      }
    }
  }
}

// One binary serves AVX2+FMA machines at full speed and still runs on any x86-64 (or elsewhere).
#if defined(__x86_64__) && defined(__GNUC__)
#define FP8T_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FP8T_CLONES
#endif

FP8T_CLONES void gemm_block_f32(float* C, int64_t ldc, StridedMat<float> A, StridedMat<float> B, int64_t i0,
                                int64_t mc, int64_t j0, int64_t nc, int64_t K, float* abuf, float* bbuf) {
  gemm_block<float>(C, ldc, A, B, i0, mc, j0, nc, K, abuf, bbuf);
}
FP8T_CLONES void gemm_block_f64(double* C, int64_t ldc, StridedMat<double> A, StridedMat<double> B, int64_t i0,
                                int64_t mc, int64_t j0, int64_t nc, int64_t K, double* abuf, double* bbuf) {
  gemm_block<double>(C, ldc, A, B, i0, mc, j0, nc, K, abuf, bbuf);
}

FP8T_INLINE void dispatch_block(float* C, int64_t ldc, StridedMat<float> A, StridedMat<float> B, int64_t i0,
                                int64_t mc, int64_t j0, int64_t nc, int64_t K, float* abuf, float* bbuf) {
  gemm_block_f32(C, ldc, A, B, i0, mc, j0, nc, K, abuf, bbuf);
}
FP8T_INLINE void dispatch_block(double* C, int64_t ldc, StridedMat<double> A, StridedMat<double> B, int64_t i0,
                                int64_t mc, int64_t j0, int64_t nc, int64_t K, double* abuf, double* bbuf) {
  gemm_block_f64(C, ldc, A, B, i0, mc, j0, nc, K, abuf, bbuf);
}

}  // namespace

template <typename F>
void gemm_accumulate(F* C, int64_t ldc, StridedMat<F> A, StridedMat<F> B, int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0 || K == 0) return;
  constexpr int MR = Tile<F>::MR, NR = Tile<F>::NR;
  const int64_t tiles_m = (M + MC - 1) / MC, tiles_n = (N + NC - 1) / NC;
#pragma omp parallel
  {
    // Packing buffers, padded up to whole micro-panels; reused across calls by each pool thread.
    thread_local std::vector<F> abuf, bbuf;
    abuf.resize(static_cast<size_t>((MC + MR) * KC));
    bbuf.resize(static_cast<size_t>((NC + NR) * KC));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles_m * tiles_n; ++t) {
      const int64_t i0 = (t / tiles_n) * MC, j0 = (t % tiles_n) * NC;
      dispatch_block(C, ldc, A, B, i0, std::min(MC, M - i0), j0, std::min(NC, N - j0), K, abuf.data(),
                     bbuf.data());
    }
  }
}

template void gemm_accumulate<float>(float*, int64_t, StridedMat<float>, StridedMat<float>, int64_t, int64_t,
                                     int64_t);
template void gemm_accumulate<double>(double*, int64_t, StridedMat<double>, StridedMat<double>, int64_t, int64_t,
                                      int64_t);

}  // namespace fp8t::cpu
