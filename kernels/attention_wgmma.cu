// Attention backward, head size 64, on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a).
// One block = one warpgroup (4 warps) per (64 keys, b*h), over query blocks of 64 from the diagonal on; the
// block order is that of the mma.sync kernel (kernels/attention_common.cuh). Per query block:
//   S^T = K Q^T and dP^T = V dO^T        (64 keys x 64 queries; A and B from shared memory)
//   P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta)   in registers (the accumulator layout)
//   dV += P^T dO, dK += dS^T Q           (A from registers, B = dO, Q read transposed from shared memory)
//   dQ = dS K                            (dS^T through shared memory, read transposed) -> f32 atomics
// Every tile is 64 rows of 64 bf16 (128 bytes), stored with the 128-byte swizzle (16-byte chunk c of row r at
// chunk c ^ (r % 8)), the layout wgmma reads both K-major and MN-major; cp.async fills the tiles, Q and dO
// double-buffered.
#include <cstdlib>
#include <cstring>

#include "core/launch_limits.h"
#include "kernels/attention_common.cuh"
#include "kernels/attention_wgmma.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kKeys = 64, kRows = 64, kHs = 64, kThreads = 128;
constexpr int kTileBytes = 64 * 128;  // one 64 x 64 bf16 tile
// sK, sV, 2 x sQ, 2 x sdO, sdS^T, then 2 x lse and 2 x delta (f32); +1024 to align the tiles to 1024 bytes;
// with the bulk dQ reduction, a 64 x 64 f32 dQ tile after them.
constexpr int kSmemBytes = 7 * kTileBytes + 4 * kRows * 4 + 1024, kDqTileBytes = 64 * 64 * 4;
constexpr int smem_bytes(bool bulk) { return kSmemBytes + (bulk ? kDqTileBytes : 0); }

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
__device__ __forceinline__ void wgmma_settle(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
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

// d (64 x 64 f32) = (accumulate ? d : 0) + A (64 x 16) B (16 x 64), A and B from shared memory; TA / TB: the
// operand is MN-major (1) or K-major (0). Accumulator: thread 32 w + 4 g + t holds rows 16 w + g (+ 8) and
// columns 8 j + 2 t (+ 1) in d[4 j + {0, 1}] ({2, 3} for row + 8).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FP8T_WGMMA_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : FP8T_WGMMA_D32_OPERANDS(d)
      : "l"(a), "l"(b), "r"(int{accumulate}), "n"(TA), "n"(TB));
}
// The same with A (64 x 16) from registers, in mma.sync's m16n8k16 A layout per warp (warp w: rows 16 w..).
template <int TB>
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FP8T_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : FP8T_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1), "n"(TB));
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

// dQ leaves through f32 atomics into dq_accum (B, T, C) (kBulk false) or through the dQ tile in shared memory,
// added by one bulk asynchronous reduction (cp.reduce.async.bulk) into dq_accum's 64 x 64 tile of (b*h, query
// block) in fragment order (kBulk true; attention_dq_kernel<true> reads that layout).
template <int kMinBlocks, bool kBulk>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_backward_wgmma_kernel(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout,
                                    const bf16* qkv, const float* lse, int BH, int T, int NH, int group, float scale) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sK = smem;
  unsigned char* sV = sK + kTileBytes;
  unsigned char* sQ = sV + kTileBytes;     // 2 stages
  unsigned char* sdO = sQ + 2 * kTileBytes;  // 2 stages
  unsigned char* sdSt = sdO + 2 * kTileBytes;
  float* sLse = reinterpret_cast<float*>(sdSt + kTileBytes);  // 2 x 64, lse * log2(e)
  float* sDelta = sLse + 2 * kRows;                             // 2 x 64
  float* sdQ = sDelta + 2 * kRows;                              // (kBulk) 64 x 64, fragment order

  const int n_kb = ceil_div(T, kKeys);
  int bh, kb;
  backward_block(static_cast<int>(blockIdx.x), BH, n_kb, group, bh, kb);
  const int b = bh / NH, h = bh % NH, k0 = kb * kKeys;
  const int C = NH * kHs;
  const int64_t ld = 3 * int64_t{C};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int key_lo = k0 + warp * 16;  // this warp's first key (accumulator rows)
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * kHs;
  const bf16* do_base = dout + int64_t{b} * T * C + h * kHs;
  const float* lse_bh = lse + int64_t{bh} * T;
  const float* delta_bh = delta + int64_t{bh} * T;
  const int n_qb = ceil_div(T, kRows);
  const float sl2 = scale * kLog2e;

  auto load_rows = [&](int q0, int st) {
    load_tile_sw128(sQ + st * kTileBytes, q_base, ld, q0, T);
    load_tile_sw128(sdO + st * kTileBytes, do_base, C, q0, T);
    cp_async_commit();
  };
  load_tile_sw128(sK, q_base + C, ld, k0, T);
  load_tile_sw128(sV, q_base + 2 * C, ld, k0, T);
  load_rows(kb * kRows, 0);
  if (threadIdx.x < kRows) {  // query rows past T: lse = inf, hence P = 0
    const int qi = kb * kRows + threadIdx.x;
    sLse[threadIdx.x] = qi < T ? lse_bh[qi] * kLog2e : INFINITY;
    sDelta[threadIdx.x] = qi < T ? delta_bh[qi] : 0.0f;
  }

  float dk[32], dv[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dv[i] = 0.0f;
  const uint64_t dK = sw128_desc(sK), dV = sw128_desc(sV), dSt = sw128_desc(sdSt);

  for (int qb = kb; qb < n_qb; ++qb) {
    const int st = (qb - kb) & 1, q0 = qb * kRows;
    cp_async_wait<0>();    // the only group in flight is stage st (with sK, sV on the first step)
    fence_async_shared();  // this thread's cp.async writes, visible to the async proxy (wgmma)
    // Stage st is complete, and every warp's MMAs of step qb - 1 are done: stage st ^ 1 and sdSt are free.
    __syncthreads();
    float next_lse = INFINITY, next_delta = 0.0f;
    if (qb + 1 < n_qb) {
      load_rows(q0 + kRows, st ^ 1);
      const int qi = q0 + kRows + threadIdx.x;
      if (threadIdx.x < kRows && qi < T) {
        next_lse = lse_bh[qi] * kLog2e;
        next_delta = delta_bh[qi];
      }
    }
    const uint64_t dQt = sw128_desc(sQ + st * kTileBytes), dOt = sw128_desc(sdO + st * kTileBytes);

    // S^T = K Q^T, dP^T = V dO^T: (64 keys, 64 queries), K = the 64 channels.
    float s[32], dp[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHs / 16; ++kk) {
      wgmma_ss<0, 0>(s, dK + kk * kKStep, dQt + kk * kKStep, kk > 0);
      wgmma_ss<0, 0>(dp, dV + kk * kKStep, dOt + kk * kKStep, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_settle(s);
    wgmma_settle(dp);

    // P^T, dS^T as A fragments (k = queries); dS^T also into sdSt. Masked on the diagonal step only (the one
    // where queries precede keys; it also holds every key past T).
    const bool diagonal = qb == kb;
    const float* sLset = sLse + st * kRows;
    const float* sDeltat = sDelta + st * kRows;
    uint32_t pa[4][4], dsa[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lq = *reinterpret_cast<const float2*>(sLset + 8 * j + 2 * t);
      const float2 dq = *reinterpret_cast<const float2*>(sDeltat + 8 * j + 2 * t);
      float p[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = exp2f(fmaf(s[4 * j + e], sl2, -((e & 1) ? lq.y : lq.x)));
        if (diagonal && q0 + 8 * j + 2 * t + (e & 1) < key_lo + g + 8 * (e >> 1)) p[e] = 0.0f;
        ds[e] = p[e] * (dp[4 * j + e] - ((e & 1) ? dq.y : dq.x));
      }
      pa[j / 2][(j & 1) * 2] = pack_bf16(p[0], p[1]);
      pa[j / 2][(j & 1) * 2 + 1] = pack_bf16(p[2], p[3]);
      dsa[j / 2][(j & 1) * 2] = pack_bf16(ds[0], ds[1]);
      dsa[j / 2][(j & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
      // dS^T row = key (warp * 16 + g, + 8), columns 8 j + 2 t: chunk j of the row, swizzled.
      const int r0 = warp * 16 + g;
      unsigned char* row0 = sdSt + r0 * 128 + ((j ^ (r0 & 7)) << 4) + 4 * t;
      unsigned char* row8 = sdSt + (r0 + 8) * 128 + ((j ^ ((r0 + 8) & 7)) << 4) + 4 * t;
      *reinterpret_cast<uint32_t*>(row0) = dsa[j / 2][(j & 1) * 2];
      *reinterpret_cast<uint32_t*>(row8) = dsa[j / 2][(j & 1) * 2 + 1];
    }

    // dV += P^T dO, dK += dS^T Q (K = queries; dO and Q are (queries, channels): MN-major B).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_settle(pa[kk]);
      wgmma_settle(dsa[kk]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      wgmma_rs<1>(dv, pa[kk], dOt + kk * kMnStep);
      wgmma_rs<1>(dk, dsa[kk], dQt + kk * kMnStep);
    }
    wgmma_commit();

    // dQ (64 queries, 64 channels) = dS K: A = dS (queries, keys) read from dS^T (MN-major), B = K (keys,
    // channels): MN-major.
    fence_async_shared();  // this thread's dS^T stores, visible to wgmma
    // kBulk: the previous step's reduction has read sdQ before the barrier below lets anyone rewrite it.
    if (kBulk && threadIdx.x == 0) bulk_wait_read();
    __syncthreads();       // every warp's dS^T rows are in place
    float dqa[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_ss<1, 1>(dqa, dSt + kk * kMnStep, dK + kk * kMnStep, kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_settle(dqa);
    wgmma_settle(dv);
    wgmma_settle(dk);

    if constexpr (kBulk) {
      // Fragment order: the pair (row 16 w + g + 8 r, columns 8 j + 2 t, + 1) at ((w * 8 + j) * 2 + r) * 64 + 2 lane,
      // so each warp's store is 256 contiguous bytes. Query rows past T hold dS = 0, hence zeros.
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(sdQ + ((warp * 8 + j) * 2 + r) * 64 + 2 * lane) =
              make_float2(dqa[4 * j + 2 * r], dqa[4 * j + 2 * r + 1]);
      fence_async_shared();
      __syncthreads();
      if (threadIdx.x == 0) bulk_reduce_add(dq_accum + (int64_t{bh} * n_qb + qb) * 4096, sdQ, kDqTileBytes);
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = q0 + warp * 16 + g + 8 * r;
        if (qi >= T) continue;
        float* dst = dq_accum + (int64_t{b} * T + qi) * C + h * kHs + 2 * t;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          atomicAdd(reinterpret_cast<float2*>(dst + 8 * j), make_float2(dqa[4 * j + 2 * r], dqa[4 * j + 2 * r + 1]));
      }
    }
    if (threadIdx.x < kRows) {  // stage st ^ 1 was last read in step qb - 1, before this step's first barrier
      sLse[(st ^ 1) * kRows + threadIdx.x] = next_lse;
      sDelta[(st ^ 1) * kRows + threadIdx.x] = next_delta;
    }
  }

  if (kBulk && threadIdx.x == 0) bulk_wait_all();  // shared memory must outlive the last reduction's read

  // dK (scaled) and dV added into dqkv: rows key_lo + g (+ 8), channels 8 j + 2 t (+ 1).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int ki = key_lo + g + 8 * r;
    if (ki >= T) continue;
    bf16* dk_dst = dqkv + (int64_t{b} * T + ki) * ld + C + h * kHs + 2 * t;
    bf16* dv_dst = dk_dst + C;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      auto* pk = reinterpret_cast<__nv_bfloat162*>(dk_dst + 8 * j);
      auto* pv = reinterpret_cast<__nv_bfloat162*>(dv_dst + 8 * j);
      const float2 ok = __bfloat1622float2(*pk), ov = __bfloat1622float2(*pv);
      *pk = __floats2bfloat162_rn(ok.x + scale * dk[4 * j + 2 * r], ok.y + scale * dk[4 * j + 2 * r + 1]);
      *pv = __floats2bfloat162_rn(ov.x + dv[4 * j + 2 * r], ov.y + dv[4 * j + 2 * r + 1]);
    }
  }
}


// Forward: one block of two warpgroups per (128 queries, b*h), heaviest query blocks first; warpgroup w owns
// queries q0 + 64 w .. + 63 and runs the online softmax over key tiles of 64 up to the diagonal:
// S = Q K^T (A = Q, B = K, both K-major in shared memory), O += P V (A = P from registers, B = V MN-major).
constexpr int kFwdRows = 128, kFwdThreads = 256;
constexpr int kFwdSmemBytes = 6 * kTileBytes + 1024;  // sQ (2 tiles), 2 x sK, 2 x sV; +1024 for alignment

__global__ void __launch_bounds__(kFwdThreads, 2)
    attention_forward_wgmma_kernel(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;                  // 2 tiles: one per warpgroup
  unsigned char* sK = sQ + 2 * kTileBytes;   // 2 stages
  unsigned char* sV = sK + 2 * kTileBytes;   // 2 stages

  const int C = NH * kHs;
  const int64_t ld = 3 * int64_t{C};
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kFwdRows;  // longest rows first
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int wg_lo = q0 + wg * 64, row_lo = wg_lo + warp * 16;  // this warpgroup's and this warp's first query
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * kHs;
  const int n_kt = ceil_div(std::min(q0 + kFwdRows, T), kKeys);
  const float sl2 = scale * kLog2e;

  load_tile_sw128<kFwdThreads>(sQ, q_base, ld, q0, T);
  load_tile_sw128<kFwdThreads>(sQ + kTileBytes, q_base, ld, q0 + 64, T);
  load_tile_sw128<kFwdThreads>(sK, q_base + C, ld, 0, T);
  load_tile_sw128<kFwdThreads>(sV, q_base + 2 * C, ld, 0, T);
  cp_async_commit();
  const uint64_t dQ = sw128_desc(sQ + wg * kTileBytes);

  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8: raw max, partial sum

  for (int kt = 0; kt < n_kt; ++kt) {
    const int st = kt & 1, k0 = kt * kKeys;
    if (kt + 1 < n_kt) {  // the other stage was released by the barrier that ended the previous step
      load_tile_sw128<kFwdThreads>(sK + (st ^ 1) * kTileBytes, q_base + C, ld, k0 + kKeys, T);
      load_tile_sw128<kFwdThreads>(sV + (st ^ 1) * kTileBytes, q_base + 2 * C, ld, k0 + kKeys, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_shared();
    __syncthreads();
    if (k0 <= wg_lo + 63) {  // else every key of the tile is after every query of this warpgroup
      const uint64_t dKt = sw128_desc(sK + st * kTileBytes), dVt = sw128_desc(sV + st * kTileBytes);
      float s[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHs / 16; ++kk) wgmma_ss<0, 0>(s, dQ + kk * kKStep, dKt + kk * kKStep, kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_settle(s);
      if (k0 + kKeys - 1 > row_lo) {  // the diagonal crosses this warp's rows
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (k0 + 8 * j + 2 * t + (e & 1) > row_lo + g + 8 * (e >> 1)) s[4 * j + e] = -INFINITY;
      }
      // Online softmax; key 0 precedes every query, so the running max is finite from the first tile on.
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
      float alpha[2], msc[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        msc[r] = mx[r] * sl2;
        alpha[r] = exp2f(m[r] * sl2 - msc[r]);
        m[r] = mx[r];
        l[r] *= alpha[r];
      }
      uint32_t pf[4][4];  // P (64, 64) bf16 as A fragments: the accumulator layout maps onto it
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = exp2f(fmaf(s[4 * j], sl2, -msc[0])), p1 = exp2f(fmaf(s[4 * j + 1], sl2, -msc[0]));
        const float p2 = exp2f(fmaf(s[4 * j + 2], sl2, -msc[1])), p3 = exp2f(fmaf(s[4 * j + 3], sl2, -msc[1]));
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        pf[j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
        pf[j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_settle(pf[kk]);
      wgmma_settle(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) wgmma_rs<1>(o, pf[kk], dVt + kk * kMnStep);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_settle(o);
    }
    __syncthreads();  // every warp is done with stage st before the next step refills it
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int qi = row_lo + g + 8 * r;
    if (qi >= T) continue;
    const float inv = 1.0f / l[r];
    bf16* dst = out + (int64_t{b} * T + qi) * C + h * kHs + 2 * t;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
          __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    if (t == 0) lse[int64_t{bh} * T + qi] = (m[r] * sl2 + log2f(l[r])) / kLog2e;
  }
}

#undef FP8T_WGMMA_D32
#undef FP8T_WGMMA_D32_OPERANDS

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

constexpr int kFwdRows = 128, kFwdThreads = 256, kFwdSmemBytes = 6 * kTileBytes + 1024;

template <int kMinBlocks, bool kBulk>
__global__ void attention_backward_wgmma_kernel(bf16*, float*, const float*, const bf16*, const bf16*, const float*,
                                                int, int, int, int, float) {
  __trap();
}
__global__ void attention_forward_wgmma_kernel(bf16*, float*, const bf16*, int, int, float) { __trap(); }

#endif

}  // namespace

bool attention_wgmma_available() {
#ifdef FP8T_CUDA_SM90A
  static const bool hopper = [] {
    int device = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
  }();
  return hopper;
#else
  return false;
#endif
}

void attention_forward_wgmma64(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, float scale,
                               cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "attention_forward_wgmma64: needs an sm_90a build on a Hopper GPU");
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kFwdSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(B * NH, ceil_div(T, kFwdRows));
  attention_forward_wgmma_kernel<<<grid, kFwdThreads, kFwdSmemBytes, stream>>>(out, lse, qkv, T, NH, scale);
  CUDA_CHECK_LAUNCH();
}

namespace {

// set_attention_backward_wgmma_variant; the environment's FP8T_ATTN_BWD_VARIANT (0..3) picks the starting one.
int initial_variant() {
  const char* env = std::getenv("FP8T_ATTN_BWD_VARIANT");
  if (!env || !*env) return 3;
  FP8T_CHECK(std::strlen(env) == 1 && env[0] >= '0' && env[0] <= '3',
             "FP8T_ATTN_BWD_VARIANT={}: expected 0, 1, 2 or 3 (see kernels/attention_wgmma.cuh)", env);
  return env[0] - '0';
}
int g_variant = -1;  // read from the environment at first use (an error then is an exception, not a crash)
int current_variant() {
  if (g_variant < 0) g_variant = initial_variant();
  return g_variant;
}

template <int kMinBlocks, bool kBulk>
void launch_backward_wgmma(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const bf16* qkv,
                           const float* lse, int B, int T, int NH, float scale, cudaStream_t stream) {
  auto* kernel = attention_backward_wgmma_kernel<kMinBlocks, kBulk>;
  static const int slots = [kernel] {  // blocks resident at once on the device
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(kBulk)));
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_bytes(kBulk)));
    return sms * std::max(per_sm, 1);
  }();
  const int BH = B * NH, n_kb = ceil_div(T, kKeys);
  kernel<<<BH * n_kb, kThreads, smem_bytes(kBulk), stream>>>(dqkv, dq_accum, delta, dout, qkv, lse, BH, T, NH,
                                                              backward_group(BH, n_kb, T, kHs, slots), scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void set_attention_backward_wgmma_variant(int variant) {
  FP8T_CHECK(variant >= 0 && variant < 4, "attention backward wgmma variant {} (0..3)", variant);
  g_variant = variant;
}

bool attention_backward_wgmma_tiled_dq() { return current_variant() >= 2; }

void attention_backward_wgmma64(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const bf16* qkv,
                                const float* lse, int B, int T, int NH, float scale, cudaStream_t stream) {
  FP8T_CHECK(attention_wgmma_available(), "attention_backward_wgmma64: needs an sm_90a build on a Hopper GPU");
  switch (current_variant()) {
    case 0: launch_backward_wgmma<2, false>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream); break;
    case 1: launch_backward_wgmma<3, false>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream); break;
    case 2: launch_backward_wgmma<2, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream); break;
    default: launch_backward_wgmma<3, true>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream); break;
  }
}

}  // namespace fp8t::kernels
