// Shared by the warpgroup-MMA attention kernels (kernels/attention_wgmma.cu, attention_wgmma_backward_kernel.cuh):
// tile sizes, the 128-byte-swizzled tile loads and descriptors, wgmma issue and wait, and the bulk reduction.
// Every tile is 64 rows of 64 bf16 (128 bytes), stored with the 128-byte swizzle (16-byte chunk c of row r at
// chunk c ^ (r % 8)), the layout wgmma reads both K-major and MN-major; cp.async fills the tiles.
#pragma once
#include <cstdint>

#include "kernels/attention_common.cuh"
#include "kernels/attention_dy_codes.cuh"
#include "kernels/fp8_codec.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kKeys = 64, kRows = 64, kHs = 64, kThreads = 128;
constexpr int kTileBytes = 64 * 128;  // one 64 x 64 bf16 tile

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Rows [row0, row0 + 64) of one head (64 channels at `src`, row stride `ld`) into a swizzled tile; rows at or
// beyond T are zero.
template <int THREADS = kThreads>
__device__ __forceinline__ void load_tile_sw128(unsigned char* tile, const bf16* src, int64_t ld, int row0, int T,
                                                int tid = threadIdx.x) {
#pragma unroll
  for (int it = 0; it < 64 * 8 / THREADS; ++it) {
    const int i = tid + it * THREADS, r = i / 8, c = i % 8;
    const bool valid = row0 + r < T;
    cp_async16(tile + r * 128 + ((c ^ (r & 7)) << 4), src + (valid ? row0 + r : 0) * ld + c * 8, valid);
  }
}

// The same tile from E4M3 codes (fp8_all's saved qkv: `src` the head's first code, row stride `ld` bytes, scale_inv
// per row at row_sinv), in two steps so that the global loads are in flight while the block works: fetch() into
// registers, then stage() the dequantized values (the bf16 fp8_dequantize_rows writes) into the swizzled tile.
// Rows at or beyond T are zero. A code chunk is 8 bytes (src 8-byte aligned, ld a multiple of 8).
template <int THREADS = kThreads>
struct CodesTile {
  static constexpr int kIt = 64 * 8 / THREADS;
  uint2 codes[kIt];
  float sinv[kIt];  // 0 for rows at or beyond T: every value dequantizes to +0

  __device__ __forceinline__ void fetch(const uint8_t* src, const float* row_sinv, int64_t ld, int row0, int T,
                                        int tid = threadIdx.x) {
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int i = tid + it * THREADS, r = i / 8, c = i % 8;
      const bool valid = row0 + r < T;
      codes[it] = valid ? *reinterpret_cast<const uint2*>(src + (row0 + r) * ld + c * 8) : make_uint2(0, 0);
      sinv[it] = valid ? row_sinv[row0 + r] : 0.0f;
    }
  }
  __device__ __forceinline__ void stage(unsigned char* tile, int tid = threadIdx.x) const {
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int i = tid + it * THREADS, r = i / 8, c = i % 8;
      uint32_t w[4];  // values 2k and 2k + 1 (codes 2k, 2k + 1 of the chunk)
      dequant_bf16x8<Fp8Format::e4m3>(codes[it], sinv[it], w);
      *reinterpret_cast<uint4*>(tile + r * 128 + ((c ^ (r & 7)) << 4)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
};

// Shared-memory matrix descriptor of a 128-byte-swizzled tile: start address, leading byte offset 16 (unused by
// these shapes), stride byte offset 1024 (between groups of 8 rows), swizzle mode 128B. The tile must be
// 1024-byte aligned. K-major operands step 16 along K by adding 32 bytes to the start (2 in the 16-byte units
// of the field), MN-major ones by 16 rows (2048 bytes, 128 units).
__device__ __forceinline__ uint64_t sw128_desc(const void* tile) {
  return (uint64_t{smem_u32(tile)} & 0x3FFFF) >> 4 | uint64_t{1} << 16 | uint64_t{1024 >> 4} << 32 | uint64_t{1} << 62;
}
constexpr uint64_t kKStep = 2, kMnStep = 128;

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// After a wait: the accumulator registers are read no earlier than here.
template <int N8>
__device__ __forceinline__ void wgmma_settle(float (&d)[N8][4]) {
#pragma unroll
  for (int j = 0; j < N8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// Before an MMA whose register operands other instructions wrote: they are written no later than here.
__device__ __forceinline__ void wgmma_settle(uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

#define FP8T_WGMMA_D32                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define FP8T_WGMMA_D32_OPERANDS(d)                                                                                 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),     \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),      \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),     \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define FP8T_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63}"
#define FP8T_WGMMA_D64_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
  "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
  "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
  "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
  "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
  "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
  "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
  "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (64 x 64 f32) = (accumulate ? d : 0) + A (64 x 16) B (16 x 64), A and B from shared memory; TA / TB: the
// operand is MN-major (1) or K-major (0). Accumulator: thread 32 w + 4 g + t holds rows 16 w + g (+ 8) and
// columns 8 j + 2 t (+ 1) in acc[j][0..1] ([2..3] for row + 8): the m16n8 layout of attention_common.cuh.
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss(float (&acc)[8][4], uint64_t a, uint64_t b, bool accumulate) {
  float(&d)[32] = reinterpret_cast<float(&)[32]>(acc);
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FP8T_WGMMA_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : FP8T_WGMMA_D32_OPERANDS(d)
      : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
}
// The same with A (64 x 16) from registers, in mma.sync's m16n8k16 A layout per warp (warp w: rows 16 w..).
template <int TB>
__device__ __forceinline__ void wgmma_rs(float (&acc)[8][4], const uint32_t (&a)[4], uint64_t b) {
  float(&d)[32] = reinterpret_cast<float(&)[32]>(acc);
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FP8T_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : FP8T_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1), "n"(TB));
}

// d (64 x 128 f32) = (accumulate ? d : 0) + A (64 x 16) B (16 x 128), both K-major from shared memory (B's 128
// rows: two 64-row tiles, one after the other); the accumulator layout as above over 16 column tiles.
__device__ __forceinline__ void wgmma_ss_n128(float (&acc)[16][4], uint64_t a, uint64_t b, bool accumulate) {
  float(&d)[64] = reinterpret_cast<float(&)[64]>(acc);
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FP8T_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : FP8T_WGMMA_D64_OPERANDS(d)
      : "l"(a), "l"(b), "r"(int{accumulate}));
}

// The forwards' step over one 64-key tile for a warpgroup (its warp's rows row_lo + g, + 8; K and V of the tile at
// desc_k, desc_v): S = Q K^T (A = Q at desc_q, B = K, both K-major), the causal mask where the diagonal crosses the
// warp's rows, the online softmax (m, l, o rescaled), then O += P V (A = P from registers, B = V MN-major). Every MMA
// is waited for: the tile's shared memory is free when it returns. turn(0) and turn(1) just before and after S's
// MMAs are issued, turn(2) and turn(3) around P V's (ping-pong scheduling; no-ops by default).
template <typename Turn>
__device__ __forceinline__ void forward_tile_64(float (&o)[8][4], float (&m)[2], float (&l)[2], uint64_t desc_q,
                                                uint64_t desc_k, uint64_t desc_v, int k0, int row_lo, float sl2,
                                                int g, int t, Turn turn) {
  float s[8][4];
  turn(0);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss<0, 0>(s, desc_q + kk * kKStep, desc_k + kk * kKStep, kk > 0);
  wgmma_commit();
  turn(1);
  wgmma_wait<0>();
  wgmma_settle(s);
  if (k0 + kKeys - 1 > row_lo) mask_causal(s, k0, row_lo, g, t);  // the diagonal crosses this warp's rows
  uint32_t pf[4][4];  // P (64, 64) bf16 as A fragments
  online_softmax_step(s, sl2, m, l, o, pf);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_settle(pf[kk]);
  wgmma_settle(o);
  turn(2);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs<1>(o, pf[kk], desc_v + kk * kMnStep);
  wgmma_commit();
  turn(3);
  wgmma_wait<0>();
  wgmma_settle(o);
}
__device__ __forceinline__ void forward_tile_64(float (&o)[8][4], float (&m)[2], float (&l)[2], uint64_t desc_q,
                                                uint64_t desc_k, uint64_t desc_v, int k0, int row_lo, float sl2,
                                                int g, int t) {
  forward_tile_64(o, m, l, desc_q, desc_k, desc_v, k0, row_lo, sl2, g, t, [](int) {});
}

__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// dst (global) += src (shared), `bytes` (a multiple of 16) of f32, by the bulk copy engine; one thread issues it.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const float* src, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(smem_u32(src)), "r"(bytes)
      : "memory");
}
// The issuing thread's bulk reductions have read their shared-memory sources / have completed.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// The 128-key kernels' dS^T fragment j of a warp (warpgroup wg, warp wl of it; rows key 16 wl + g and + 8 of the
// warpgroup's 64, columns 8 j + 2 t): query half j / 8, chunk j % 8 of the row, swizzled, into tile [wg][j / 8] of
// the four at `tiles` ([key half][query half]), where dQ's MMAs read it.
__device__ __forceinline__ void store_ds_sw128(unsigned char* tiles, int wg, int wl, int g, int t, int j, uint32_t lo,
                                               uint32_t hi) {
  unsigned char* tile = tiles + (2 * wg + j / 8) * kTileBytes;
  const int r0 = wl * 16 + g, c = j % 8;
  *reinterpret_cast<uint32_t*>(tile + r0 * 128 + ((c ^ (r0 & 7)) << 4) + 4 * t) = lo;
  *reinterpret_cast<uint32_t*>(tile + (r0 + 8) * 128 + ((c ^ ((r0 + 8) & 7)) << 4) + 4 * t) = hi;
}

// The 128-key kernels' scores of a step, for one warpgroup: S^T = K_w Q^T, then dP^T = V_w dO^T (64 keys x 128
// queries, K = the 64 channels), in two groups; P^T (the diagonal step's masked scores set to -inf first) while
// dP^T's MMAs run, then dS^T, each fragment also given to store_ds for dQ. pa, dsa: P^T and dS^T as A fragments
// (k = queries). kMaskEveryStep (a lab order): the mask's test inside P^T's loop on every step instead.
template <bool kMaskEveryStep = false, typename StoreDs>
__device__ __forceinline__ void backward_sdp_ds(float (&s)[16][4], float (&dp)[16][4], uint32_t (&pa)[8][4],
                                                uint32_t (&dsa)[8][4], uint64_t desc_k, uint64_t desc_q,
                                                uint64_t desc_v, uint64_t desc_do, const float* lse2,
                                                const float* delta_q, float sl2, bool diagonal, int q0, int key_lo,
                                                int g, int t, StoreDs store_ds) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss_n128(s, desc_k + kk * kKStep, desc_q + kk * kKStep, kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss_n128(dp, desc_v + kk * kKStep, desc_do + kk * kKStep, kk > 0);
  wgmma_commit();
  wgmma_wait<1>();
  wgmma_settle(s);
  if constexpr (kMaskEveryStep) {
    backward_p(s, lse2, sl2, diagonal, q0, key_lo, g, t, pa);
  } else {
    if (diagonal) mask_scores(s, q0, key_lo, g, t);
    backward_p(s, lse2, sl2, false, q0, key_lo, g, t, pa);
  }
  wgmma_wait<0>();
  wgmma_settle(dp);
  backward_ds(s, dp, delta_q, t, dsa, store_ds);
}

// The 128-key kernels' dQ MMAs, issued and committed as one group: dQ (queries 64 wg .., 64 channels) = dS K over
// the 128 keys. A = dS read from the dS^T tiles [kh][wg] at ds_tiles (MN-major), B = the K tile of key half kh at
// k_tiles (keys, channels): MN-major.
__device__ __forceinline__ void mma_dq_128keys(float (&dqa)[8][4], const unsigned char* ds_tiles,
                                               const unsigned char* k_tiles, int wg) {
  wgmma_fence();
#pragma unroll
  for (int kh = 0; kh < 2; ++kh) {
    const uint64_t desc_ds = sw128_desc(ds_tiles + (2 * kh + wg) * kTileBytes);
    const uint64_t desc_kh = sw128_desc(k_tiles + kh * kTileBytes);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_ss<1, 1>(dqa, desc_ds + kk * kMnStep, desc_kh + kk * kMnStep, kh > 0 || kk > 0);
  }
  wgmma_commit();
}

// The end of a 128-key main pass (kernels/attention_wgmma_backward128*_kernel.cuh) for warpgroup wg (its warp wl,
// thread tid 0 .. 127 of it), once its last MMAs are done: dK and dV as dy codes (kDy), else into dqkv with their
// column sums where dy.stats.colsum is set (accumulate false), else into dqkv by add_dkv. sQ: the Q stages (2 tiles
// a warpgroup), free once every warpgroup is past its last MMAs, which the block barrier first made here (kSyncThreads:
// as write_dkv_codes's) assures. BH / NH: the batch.
template <bool kDy, int kSyncThreads = 0, int KEYS, int HS>
__device__ __forceinline__ void finish_dkv_128(const float (&dk)[8][4], const float (&dv)[8][4], float scale,
                                               const AttentionDyCodes& dy, __nv_bfloat16* dqkv, bool accumulate,
                                               const BackwardBlock<KEYS, HS>& blk, int wg, int wl, int tid,
                                               uint8_t* sQ, int BH, int NH, int T) {
  auto sync = [] {
    if constexpr (kSyncThreads == 0)
      __syncthreads();
    else
      named_barrier(1, kSyncThreads);
  };
  const int key0 = blk.k0 + 64 * wg;  // the warpgroup's first key
  if constexpr (kDy) {
    sync();
    write_dkv_codes<true, kSyncThreads>(dk, dv, scale, dy, sQ + wg * 2 * kTileBytes, blk.b, blk.h, key0, T, blk.C,
                                        int64_t{BH / NH} * T, wl, blk.g, blk.t, tid);
  } else if (dy.stats.colsum) {
    sync();
    write_dkv_codes<false, kSyncThreads>(dk, dv, scale, dy, sQ + wg * 2 * kTileBytes, blk.b, blk.h, key0, T, blk.C,
                                         int64_t{BH / NH} * T, wl, blk.g, blk.t, tid, dqkv);
  } else {
    add_dkv(dqkv, dk, dv, scale, accumulate, blk, T);  // dK (scaled) and dV into dqkv
  }
}

// A warp's 16 rows of a 64 x 64 dQ tile added into dst (their 4 KB quarter of the tile in dq_accum) by one bulk
// reduction, staged in warp_dq (the warp's 4 KB of shared memory). Fragment order: the pair (row g + 8 r of the
// warp's, columns 8 j + 2 t, + 1) of dqa at (j * 2 + r) * 64 + 2 lane, so each store is 256 contiguous bytes and no
// block barrier is needed. First waits for the warp's previous reduction to have read warp_dq. dst() is called by lane
// 0 only, where the reduction is issued.
template <typename Dst>
__device__ __forceinline__ void reduce_dq_quarter(const float (&dqa)[8][4], float* warp_dq, int lane, Dst dst) {
  if (lane == 0) bulk_wait_read();
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float2*>(warp_dq + (j * 2 + r) * 64 + 2 * lane) = make_float2(dqa[j][2 * r], dqa[j][2 * r + 1]);
  fence_async_shared();  // this thread's stores, visible to the bulk copy engine
  __syncwarp();
  if (lane == 0) bulk_reduce_add(dst(), warp_dq, 64 * 64);
}

// The 128-key kernels' dQ of warpgroup wg (its warp wl) for query tile qb (64 queries) added into dq_accum
// (DqLayout::tiles, head bh's n_qb tiles), one 4 KB quarter a warp through the warpgroup's 16 KB of sdQ. Query tiles
// wholly past T are not in dq_accum (their dS is 0).
__device__ __forceinline__ void reduce_dq_tile_128(const float (&dqa)[8][4], float* sdQ, float* dq_accum, int bh,
                                                   int n_qb, int qb, int wg, int wl, int lane) {
  if (qb < n_qb) {
    reduce_dq_quarter(dqa, sdQ + wg * 4096 + wl * 1024, lane,
                      [&] { return dq_accum + (int64_t{bh} * n_qb + qb) * 4096 + wl * 1024; });
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace
}  // namespace fp8t::kernels
