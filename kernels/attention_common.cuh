// Device helpers shared by the attention kernels (kernels/attention.cu, kernels/attention_wgmma*.cu): cp.async,
// bf16 packing, the softmax and gradient arithmetic on accumulator tiles, and the block order of the backward.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/fast_math.cuh"

namespace fp8t::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
// Softmax exponentials are ex2_ftz (kernels/fast_math.cuh): a P or rescale factor below 2^-126 becomes 0. A row's
// largest P is 1 in the forward (exp(s - max)) and at least 1 / T in the backward (exp(s - lse)), so a flushed term
// is below 2^-126 T of the row's largest, far under one f32 ulp of anything it adds to; exp2f's subnormal handling
// costs three instructions per score in kernels bound by their issue rate.

// Barrier `id` (1..15; 0 is __syncthreads') over `threads` threads of the block, a multiple of 32.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// An arrival at barrier `id` that does not wait: its other threads' bar.sync completes once these have arrived.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; `valid == false` writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The m16n8 accumulator layout, shared by mma.sync's tiles and wgmma's per-warp rows: a warp's 16-row tile
// over N8 * 8 columns is x[N8][4], lane 4 g + t holding rows g (x[j][0], x[j][1]) and g + 8 (x[j][2], x[j][3]),
// columns 8 j + 2 t and + 1. Accumulator pairs of adjacent 8-column tiles are the A fragment of a 16-wide k
// step: A[k] = {x[2k][0..1], x[2k][2..3], x[2k+1][0..1], x[2k+1][2..3]}, each pair packed to bf16.

// Forward: raw scores s of the warp's queries row_lo + g (+ 8) against keys k0 + 8 j + 2 t (+ 1); keys after
// their query become -inf.
template <int N8>
__device__ __forceinline__ void mask_causal(float (&s)[N8][4], int k0, int row_lo, int g, int t) {
#pragma unroll
  for (int j = 0; j < N8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (k0 + 8 * j + 2 * t + (e & 1) > row_lo + g + 8 * (e >> 1)) s[j][e] = -INFINITY;
}

// Forward: one online-softmax step over a tile of raw scores s (sl2 = scale * log2(e)) without touching the output
// accumulator: the running max m and partial sum l of rows g, g + 8 are updated, P = exp(scale s - max) comes out as
// bf16 A fragments pf, and alpha (per row) is what the output accumulator must be multiplied by (now, or once a P V
// product still in flight has landed: the lab's pipelined forward). Key 0 precedes every query, so the running max
// is finite from the first tile on.
template <int N8>
__device__ __forceinline__ void softmax_step_p(const float (&s)[N8][4], float sl2, float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], uint32_t (&pf)[N8 / 2][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < N8; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
  }
  float msc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    msc[r] = mx[r] * sl2;
    alpha[r] = ex2_ftz(m[r] * sl2 - msc[r]);
    m[r] = mx[r];
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int j = 0; j < N8; ++j) {
    const float p0 = ex2_ftz(fmaf(s[j][0], sl2, -msc[0])), p1 = ex2_ftz(fmaf(s[j][1], sl2, -msc[0]));
    const float p2 = ex2_ftz(fmaf(s[j][2], sl2, -msc[1])), p3 = ex2_ftz(fmaf(s[j][3], sl2, -msc[1]));
    l[0] += p0 + p1;
    l[1] += p2 + p3;
    pf[j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
    pf[j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
  }
}

// o (D8 8-column tiles of rows g, g + 8) *= alpha per row.
template <int D8>
__device__ __forceinline__ void rescale_rows(float (&o)[D8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int d = 0; d < D8; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
}

// softmax_step_p with the output accumulator o rescaled at once.
template <int N8, int D8>
__device__ __forceinline__ void online_softmax_step(const float (&s)[N8][4], float sl2, float (&m)[2], float (&l)[2],
                                                    float (&o)[D8][4], uint32_t (&pf)[N8 / 2][4]) {
  float alpha[2];
  softmax_step_p(s, sl2, m, l, alpha, pf);
  rescale_rows(o, alpha);
}

// Forward: the warp's finished rows row_lo + g (+ 8) below T. out (rows of stride ld, at the head's first
// channel) = o / l as bf16; lse (the head's T values) = the row's logsumexp of scale * s.
template <int D8>
__device__ __forceinline__ void store_rows(const float (&o)[D8][4], float (&l)[2], const float (&m)[2], float sl2,
                                           bf16* out, int64_t ld, float* lse, int row_lo, int T, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int qi = row_lo + g + 8 * r;
    if (qi >= T) continue;
    const float inv = 1.0f / l[r];
    bf16* dst = out + qi * ld + 2 * t;
#pragma unroll
    for (int d = 0; d < D8; ++d)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * d) = __floats2bfloat162_rn(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    if (t == 0) lse[qi] = (m[r] * sl2 + log2f(l[r])) / kLog2e;
  }
}

// P^T of tile j (x: its 4 scores in the accumulator layout), in place; zero where the query precedes the key on a
// diagonal step.
__device__ __forceinline__ void p_tile(float (&x)[4], int j, const float* lse2, float sl2, bool diagonal, int q0,
                                       int key_lo, int g, int t) {
  const float2 lq = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * t);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    x[e] = ex2_ftz(fmaf(x[e], sl2, -((e & 1) ? lq.y : lq.x)));
    if (diagonal && q0 + 8 * j + 2 * t + (e & 1) < key_lo + g + 8 * (e >> 1)) x[e] = 0.0f;
  }
}
// The scores of a diagonal step where the query precedes the key set to -inf, so that P^T made from them with
// diagonal false is p_tile's with diagonal true, bit for bit (ex2 of -inf is +0, also where lse is inf): the mask's
// tests in their own loop, run on diagonal steps only, without a second copy of the P^T code.
template <int N8>
__device__ __forceinline__ void mask_scores(float (&s)[N8][4], int q0, int key_lo, int g, int t) {
#pragma unroll
  for (int j = 0; j < N8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (q0 + 8 * j + 2 * t + (e & 1) < key_lo + g + 8 * (e >> 1)) s[j][e] = -INFINITY;
}
// Tile j's 4 values (rows g, g + 8) packed into the A fragments a.
template <int N8>
__device__ __forceinline__ void pack_tile(const float (&x)[4], int j, uint32_t (&a)[N8 / 2][4]) {
  a[j / 2][(j & 1) * 2] = pack_bf16(x[0], x[1]);
  a[j / 2][(j & 1) * 2 + 1] = pack_bf16(x[2], x[3]);
}
// dS^T of tile j from its P^T and dP^T, packed into dsa and handed to store_ds.
template <int N8, typename StoreDs>
__device__ __forceinline__ void ds_tile(const float (&p)[4], const float (&dp)[4], int j, const float* delta, int t,
                                        uint32_t (&dsa)[N8 / 2][4], StoreDs store_ds) {
  const float2 dq = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * t);
  float ds[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) ds[e] = p[e] * (dp[e] - ((e & 1) ? dq.y : dq.x));
  pack_tile<N8>(ds, j, dsa);
  store_ds(j, dsa[j / 2][(j & 1) * 2], dsa[j / 2][(j & 1) * 2 + 1]);
}

// Backward: P^T = exp(scale S^T - lse) and dS^T = P^T (dP^T - delta) of the warp's keys key_lo + g (+ 8) over
// the step's queries q0 + 8 j + 2 t (+ 1), as bf16 A fragments (k = queries). lse2 (lse * log2(e)) and delta:
// the step's per-query values; on a diagonal step P = 0 where the query precedes the key. store_ds(j, lo, hi)
// receives the packed dS^T pairs of tile j (rows g and g + 8) as they are made (the kernels keep dS^T in shared
// memory for dQ; storing inside the loop keeps the mma.sync kernel's register allocation).
// (Written out per element rather than from p_tile and ds_tile above: P and dS of an element made together is the
// instruction order both kernels' register allocations were tuned on.)
template <int N8, typename StoreDs>
__device__ __forceinline__ void backward_p_ds(const float (&s)[N8][4], const float (&dp)[N8][4], const float* lse2,
                                              const float* delta, float sl2, bool diagonal, int q0, int key_lo, int g,
                                              int t, uint32_t (&pa)[N8 / 2][4], uint32_t (&dsa)[N8 / 2][4],
                                              StoreDs store_ds) {
#pragma unroll
  for (int j = 0; j < N8; ++j) {
    const float2 lq = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * t);
    const float2 dq = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * t);
    float p[4], ds[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = ex2_ftz(fmaf(s[j][e], sl2, -((e & 1) ? lq.y : lq.x)));
      if (diagonal && q0 + 8 * j + 2 * t + (e & 1) < key_lo + g + 8 * (e >> 1)) p[e] = 0.0f;
      ds[e] = p[e] * (dp[j][e] - ((e & 1) ? dq.y : dq.x));
    }
    pack_tile<N8>(p, j, pa);
    pack_tile<N8>(ds, j, dsa);
    store_ds(j, dsa[j / 2][(j & 1) * 2], dsa[j / 2][(j & 1) * 2 + 1]);
  }
}

// The same in two halves, so that an MMA can run between them: backward_p turns the scores s into P in place (f32)
// and into pa; backward_ds then makes dS from that P and dp.
template <int N8>
__device__ __forceinline__ void backward_p(float (&s)[N8][4], const float* lse2, float sl2, bool diagonal, int q0,
                                           int key_lo, int g, int t, uint32_t (&pa)[N8 / 2][4]) {
#pragma unroll
  for (int j = 0; j < N8; ++j) {
    p_tile(s[j], j, lse2, sl2, diagonal, q0, key_lo, g, t);
    pack_tile<N8>(s[j], j, pa);
  }
}
template <int N8, typename StoreDs>
__device__ __forceinline__ void backward_ds(const float (&p)[N8][4], const float (&dp)[N8][4], const float* delta,
                                            int t, uint32_t (&dsa)[N8 / 2][4], StoreDs store_ds) {
#pragma unroll
  for (int j = 0; j < N8; ++j) ds_tile<N8>(p[j], dp[j], j, delta, t, dsa, store_ds);
}

// backward_ds from P^T as pa holds it (bf16), so that s is free once pa is made.
template <int N8, typename StoreDs>
__device__ __forceinline__ void backward_ds_bf16p(const uint32_t (&pa)[N8 / 2][4], const float (&dp)[N8][4],
                                                  const float* delta, int t, uint32_t (&dsa)[N8 / 2][4],
                                                  StoreDs store_ds) {
#pragma unroll
  for (int j = 0; j < N8; ++j) {
    float p[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = pa[j / 2][(j & 1) * 2 + h];
      p[2 * h] = __uint_as_float(w << 16);
      p[2 * h + 1] = __uint_as_float(w & 0xffff0000u);
    }
    ds_tile<N8>(p, dp[j], j, delta, t, dsa, store_ds);
  }
}

// Block order of the backward. Before, blocks ran key block by key block over all B*NH heads, so the ~400 in
// flight touched every head and each head's Q, dO and dq_accum rows left L2 between its key blocks. Now the
// key blocks form bands, each taking half of the key blocks still left (later bands hold lighter blocks, so
// the grid still ends on short blocks); within a band, heads go in groups whose blocks run together, heaviest
// first. Block i -> (head, key block). Not inlined: inlined, it moved ptxas's register allocation of the main
// loop from 16 to 88 bytes of spill at HS 64; the call runs once per block.
__device__ __noinline__ void backward_block(int i, int BH, int n_kb, int group, int& bh, int& kb) {
  const int kb_major = i / BH;  // the key block of block i in the plain key-block-major order: picks the band
  int lo = 0, hi = max(1, n_kb / 2);
  while (kb_major >= hi) {
    lo = hi;
    hi = lo + max(1, (n_kb - lo) / 2);
  }
  const int width = hi - lo, j = i - BH * lo;  // band [lo, hi) holds blocks BH * lo .. BH * hi - 1
  const int g0 = j / (group * width) * group, g_size = min(group, BH - g0);
  const int r = j - g0 * width;  // < g_size * width
  kb = lo + r / g_size;
  bh = g0 + r % g_size;
}

// Backward: the work of block blockIdx.x (KEYS keys per block, head size HS), in backward_block's order, and this
// thread's place in it: warp w owns keys key_lo = k0 + 16 w .. + 15, lane = 4 g + t as in the m16n8 layout.
template <int KEYS, int HS>
struct BackwardBlock {
  int bh, kb;             // head bh = b * NH + h, key block kb
  int b, h, k0;           // batch, head, first key
  int C;                  // channels, NH * HS
  int64_t ld;             // qkv's row stride, 3 C
  int warp, lane, g, t;   // lane = 4 g + t
  int key_lo;             // this warp's first key

  __device__ __forceinline__ BackwardBlock(int BH, int T, int NH, int group) {
    int head, key_block;  // locals: references to members would keep this object in local memory
    backward_block(static_cast<int>(blockIdx.x), BH, ceil_div(T, KEYS), group, head, key_block);
    bh = head;
    kb = key_block;
    b = bh / NH;
    h = bh % NH;
    k0 = kb * KEYS;
    C = NH * HS;
    ld = 3 * int64_t{C};
    warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    g = lane >> 2;
    t = lane & 3;
    key_lo = k0 + warp * 16;
  }
};

// The main pass's dK (times the softmax scale) and dV of this thread added into dqkv (B, T, 3C) bf16, written over it
// unless `accumulate`: from the m16n8 accumulators dk[j][2 r + e] of rows key_lo + g + 8 r, channels 8 j + 2 t + e.
template <int KEYS, int HS>
__device__ __forceinline__ void add_dkv(bf16* dqkv, const float (&dk)[HS / 8][4], const float (&dv)[HS / 8][4],
                                        float scale, bool accumulate, const BackwardBlock<KEYS, HS>& blk, int T) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int ki = blk.key_lo + blk.g + 8 * r;
    if (ki >= T) continue;
    bf16* dk_dst = dqkv + (int64_t{blk.b} * T + ki) * blk.ld + blk.C + blk.h * HS + 2 * blk.t;
    bf16* dv_dst = dk_dst + blk.C;
#pragma unroll
    for (int j = 0; j < HS / 8; ++j) {
      auto* pk = reinterpret_cast<__nv_bfloat162*>(dk_dst + 8 * j);
      auto* pv = reinterpret_cast<__nv_bfloat162*>(dv_dst + 8 * j);
      const float2 ok = accumulate ? __bfloat1622float2(*pk) : float2{0.0f, 0.0f};
      const float2 ov = accumulate ? __bfloat1622float2(*pv) : float2{0.0f, 0.0f};
      *pk = __floats2bfloat162_rn(ok.x + scale * dk[j][2 * r], ok.y + scale * dk[j][2 * r + 1]);
      *pv = __floats2bfloat162_rn(ov.x + dv[j][2 * r], ov.y + dv[j][2 * r + 1]);
    }
  }
}

// Heads per group: each head's Q, K, V, dO (bf16) and dq_accum (f32) rows are 12 T HS bytes, and ~8 MiB per
// group keeps a few groups in L2. Grids of fewer than 8 waves take one group of all heads, which is the plain
// key-block-major order: there the last group's long blocks would start too late (a simulated tail of up to
// 20% at 2 waves, under 1% from 8 waves on).
inline int backward_group(int BH, int n_kb, int T, int HS, int slots) {
  if (int64_t{BH} * n_kb < 8 * int64_t{slots}) return BH;
  const int64_t per_head = 12 * int64_t{T} * HS;
  return static_cast<int>(std::clamp<int64_t>((int64_t{8} << 20) / per_head, 1, BH));
}

}  // namespace
}  // namespace fp8t::kernels
