// The backward of the mma.sync attention (kernels/attention.cu has the schedule): delta = rowsum(dO * O) with the
// dQ scratch zeroed, the main pass over key blocks (dK, dV in registers, dQ through f32 atomics or the wgmma
// backward's tiles), and the pass that adds scale * dQ into dqkv; the wgmma backward (HS 64 on a Hopper)
// shares the first and last.
#include "kernels/attention_backward_passes.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/fp8_codec.cuh"

namespace fp8t::kernels {
namespace {

// delta (B, NH, T) = rowsum(dO * O) per head, and dq_accum (B, T, C) = 0 for the backward's atomics.
// One thread per 8 channels (16-byte loads); HS / 8 adjacent lanes hold one head of one row.
template <int HS>
__global__ void attention_delta_kernel(float* delta, float* dq_accum, const bf16* dout, const bf16* out,
                                       int64_t n_chunks, int T, int NH) {
  constexpr int kLanes = HS / 8;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  float acc = 0.0f;
  if (i < n_chunks) {
    const auto a = Vec16<bf16>::load(dout + 8 * i), o = Vec16<bf16>::load(out + 8 * i);
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a.v[k]));
      const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o.v[k]));
      acc += x.x * y.x + x.y * y.y;
    }
    if (dq_accum) {  // null: the caller zeroes it (a tiled layout longer than the rows)
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      reinterpret_cast<float4*>(dq_accum + 8 * i)[0] = zero;
      reinterpret_cast<float4*>(dq_accum + 8 * i)[1] = zero;
    }
  }
  // Every lane shuffles (lanes past the end add zeros); the groups of kLanes never straddle two heads.
#pragma unroll
  for (int m = kLanes / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (i < n_chunks && i % kLanes == 0) {
    const int64_t row_chunks = int64_t{NH} * kLanes, bt = i / row_chunks, b = bt / T, t = bt % T;
    const int h = static_cast<int>(i % row_chunks) / kLanes;
    delta[(b * NH + h) * T + t] = acc;
  }
}

// delta as attention_delta_kernel, with O read from its transposed E4M3 codes o_t (C, M), M = B * T, times
// *scale_inv. A lane takes 4 adjacent rows (M % 4 == 0) and 8 channels of one head; the HS / 8 lanes of such a group
// of rows sit side by side in the warp and add up their partial sums by shuffles. So a group's lanes read each row's
// dO (HS channels) as one contiguous run, and for each channel the 4 rows' codes are one word, the warp's groups
// reading adjacent words. O is the f32 product decode(code) * scale_inv, not rounded to bf16 (the CPU emulation's
// dequantized value).
template <int HS>
__global__ void attention_delta_fp8t_kernel(float* delta, const bf16* dout, const uint8_t* o_t,
                                            const float* scale_inv_ptr, int64_t M, int T, int NH) {
  constexpr int kLanes = HS / 8;  // lanes per group of 4 rows: 8 or 16, dividing the warp
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, groups = M / 4;
  const int64_t g = i / kLanes;  // (head, group of 4 rows)
  const int c0 = 8 * static_cast<int>(i % kLanes);
  const bool inside = g < groups * NH;  // every lane stays for the shuffles
  const int h = inside ? static_cast<int>(g / groups) : 0;
  const int64_t m0 = inside ? 4 * (g % groups) : 0, C = int64_t{NH} * HS;
  float acc[4] = {};
  if (inside) {
    const float scale_inv = *scale_inv_ptr;
    Vec16<bf16> d[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) d[r] = Vec16<bf16>::load(dout + (m0 + r) * C + h * HS + c0);
    uint32_t w[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) w[e] = *reinterpret_cast<const uint32_t*>(o_t + (int64_t{h} * HS + c0 + e) * M + m0);
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float o = __fmul_rn(from_fp8<Fp8Format::e4m3>(static_cast<uint8_t>(w[e] >> 8 * r)), scale_inv);
        acc[r] = fmaf(__bfloat162float(d[r].v[e]), o, acc[r]);
      }
  }
#pragma unroll
  for (int m = kLanes / 2; m > 0; m >>= 1)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], m);
  if (inside && c0 == 0) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t m = m0 + r, b = m / T, t = m % T;
      delta[(b * NH + h) * T + t] = acc[r];
    }
  }
}

// Backward tiling per head size. kKeys: keys per block, 16 per warp, whose dK and dV stay in registers for the
// whole block; kRows: query rows per step; kMinBlocks: blocks per SM that __launch_bounds__ fits registers to.
template <int HS>
struct BwdTile;
// HS 64: three blocks of 4 warps per SM (168 registers) measured 117 TFLOP/s against 108 with two blocks and no
// spills. Still to measure: kKeys 128, kMinBlocks 1 (8 warps, 210 registers, half the dQ atomics).
template <>
struct BwdTile<64> {
  static constexpr int kKeys = 64, kRows = 64, kMinBlocks = 3;
};
// HS 128: 32 rows keep dK, dV (128 registers) and the scores within 255; 8 warps of 255 registers fill the
// register file with one block (4 warps of 64 keys left half of it unused).
template <>
struct BwdTile<128> {
  static constexpr int kKeys = 128, kRows = 32, kMinBlocks = 1;
};

template <int HS>
constexpr int backward_smem_bytes() {
  constexpr int KEYS = BwdTile<HS>::kKeys, BR = BwdTile<HS>::kRows;
  // sK, sV, 2 x sQ, 2 x sdO, sdS^T, 2 x lse, 2 x delta
  return (2 * KEYS + 4 * BR) * (HS + kPad) * 2 + KEYS * (BR + kPad) * 2 + 4 * BR * 4;
}

template <int HS>
__global__ void __launch_bounds__(2 * BwdTile<HS>::kKeys, BwdTile<HS>::kMinBlocks)
    attention_backward_kernel(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const bf16* qkv,
                              const float* lse, int BH, int T, int NH, int group, float scale, bool accumulate) {
  constexpr int KEYS = BwdTile<HS>::kKeys, BR = BwdTile<HS>::kRows, kThreads = 2 * KEYS, kWarps = KEYS / 16;
  constexpr int kLd = HS + kPad, kLdS = BR + kPad;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);  // (KEYS, HS)
  bf16* sV = sK + KEYS * kLd;                // (KEYS, HS)
  bf16* sQ = sV + KEYS * kLd;                // 2 x (BR queries, HS)
  bf16* sdO = sQ + 2 * BR * kLd;             // 2 x (BR queries, HS)
  bf16* sdSt = sdO + 2 * BR * kLd;           // (KEYS, BR queries) dS^T
  float* sLse = reinterpret_cast<float*>(sdSt + KEYS * kLdS);  // 2 x (BR) lse * log2(e)
  float* sDelta = sLse + 2 * BR;                               // 2 x (BR)

  const BackwardBlock<KEYS, HS> blk(BH, T, NH, group);  // blk.key_lo: this warp's first key
  const bf16* q_base = qkv + int64_t{blk.b} * T * blk.ld + blk.h * HS;
  const bf16* do_base = dout + int64_t{blk.b} * T * blk.C + blk.h * HS;
  const float* lse_bh = lse + int64_t{blk.bh} * T;
  const float* delta_bh = delta + int64_t{blk.bh} * T;
  const int qb_first = blk.k0 / BR, n_qb = ceil_div(T, BR);
  const float sl2 = scale * kLog2e;

  // Query rows past T get lse = inf, hence P = 0 and no contribution.
  auto load_rows = [&](int q0, int st) {
    load_tile<BR, HS, kThreads>(sQ + st * BR * kLd, q_base, blk.ld, q0, T);
    load_tile<BR, HS, kThreads>(sdO + st * BR * kLd, do_base, blk.C, q0, T);
    cp_async_commit();
  };
  load_tile<KEYS, HS, kThreads>(sK, q_base + blk.C, blk.ld, blk.k0, T);
  load_tile<KEYS, HS, kThreads>(sV, q_base + 2 * blk.C, blk.ld, blk.k0, T);
  load_rows(qb_first * BR, 0);
  if (threadIdx.x < BR) {
    const int qi = qb_first * BR + threadIdx.x;
    sLse[threadIdx.x] = qi < T ? lse_bh[qi] * kLog2e : INFINITY;
    sDelta[threadIdx.x] = qi < T ? delta_bh[qi] : 0.0f;
  }

  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};  // this warp's (16 keys, HS)
  // dQ (BR, HS) of a step split over the warps: kRowTiles row tiles of 16 times HS / kCols column slices.
  constexpr int kRowTiles = BR / 16, kCols = HS * kRowTiles / kWarps;
  static_assert(kWarps % kRowTiles == 0 && kCols % 16 == 0, "dQ tiles must divide evenly over the warps");
  const int dq_row = (blk.warp % kRowTiles) * 16, dq_col = (blk.warp / kRowTiles) * kCols;

  for (int qb = qb_first; qb < n_qb; ++qb) {
    const int st = (qb - qb_first) & 1, q0 = qb * BR;
    cp_async_wait<0>();  // the only group in flight is stage st (with sK, sV on the first step)
    // Stage st is visible to every thread, and every warp has left step qb - 1: stage st ^ 1 of sQ, sdO, sLse,
    // sDelta and sdSt are free to overwrite.
    __syncthreads();
    float next_lse = INFINITY, next_delta = 0.0f;  // kept in registers, stored at the end of the step
    if (qb + 1 < n_qb) {
      load_rows(q0 + BR, st ^ 1);
      const int qi = q0 + BR + threadIdx.x;
      if (threadIdx.x < BR && qi < T) {
        next_lse = lse_bh[qi] * kLog2e;
        next_delta = delta_bh[qi];
      }
    }
    const bf16* sQt = sQ + st * BR * kLd;
    const bf16* sdOt = sdO + st * BR * kLd;

    // 16-query chunks whose every query precedes every key of this warp are masked whole (P = dS = 0): their
    // MMAs are skipped, and the mask below zeroes their P. Warp-uniform; only on the diagonal steps.
    auto live = [&](int chunk) { return q0 + 16 * chunk + 15 >= blk.key_lo; };

    // S^T = K Q^T and dP^T = V dO^T, (16 keys, BR queries) for this warp.
    float s[BR / 8][4] = {}, dp[BR / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldmatrix_x4(ka, frag_rows16(sK + blk.warp * 16 * kLd + kk * 16, kLd, blk.lane));
      ldmatrix_x4(va, frag_rows16(sV + blk.warp * 16 * kLd + kk * 16, kLd, blk.lane));
#pragma unroll
      for (int jp = 0; jp < BR / 16; ++jp) {
        if (!live(jp)) continue;
        uint32_t qb4[4], ob4[4];
        ldmatrix_x4(qb4, frag_cols16(sQt + jp * 16 * kLd + kk * 16, kLd, blk.lane));
        ldmatrix_x4(ob4, frag_cols16(sdOt + jp * 16 * kLd + kk * 16, kLd, blk.lane));
        mma(s[2 * jp], ka, qb4[0], qb4[1]);
        mma(s[2 * jp + 1], ka, qb4[2], qb4[3]);
        mma(dp[2 * jp], va, ob4[0], ob4[1]);
        mma(dp[2 * jp + 1], va, ob4[2], ob4[3]);
      }
    }
    // P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta); both as A fragments, dS^T also to shared.
    // The mask is needed iff the step's first query precedes the warp's last key.
    const bool diagonal = q0 < blk.key_lo + 15;
    uint32_t pa[BR / 16][4], dsa[BR / 16][4];
    backward_p_ds(s, dp, sLse + st * BR, sDelta + st * BR, sl2, diagonal, q0, blk.key_lo, blk.g, blk.t, pa, dsa,
                  [&](int j, uint32_t lo, uint32_t hi) {
                    bf16* row = sdSt + (blk.warp * 16 + blk.g) * kLdS + 8 * j + 2 * blk.t;
                    *reinterpret_cast<uint32_t*>(row) = lo;
                    *reinterpret_cast<uint32_t*>(row + 8 * kLdS) = hi;
                  });
    // dV += P^T dO, dK += dS^T Q (dK unscaled until the end).
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      if (!live(kk)) continue;
#pragma unroll
      for (int dp16 = 0; dp16 < HS / 16; ++dp16) {
        uint32_t ob4[4], qb4[4];
        ldmatrix_x4_trans(ob4, frag_rows16(sdOt + kk * 16 * kLd + dp16 * 16, kLd, blk.lane));
        ldmatrix_x4_trans(qb4, frag_rows16(sQt + kk * 16 * kLd + dp16 * 16, kLd, blk.lane));
        mma(dv[2 * dp16], pa[kk], ob4[0], ob4[1]);
        mma(dv[2 * dp16 + 1], pa[kk], ob4[2], ob4[3]);
        mma(dk[2 * dp16], dsa[kk], qb4[0], qb4[1]);
        mma(dk[2 * dp16 + 1], dsa[kk], qb4[2], qb4[3]);
      }
    }
    __syncthreads();  // sdSt is complete
    // dQ (BR, HS) partial = dS K over this block's keys; this warp's 16 rows x kCols columns.
    float dqa[kCols / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
      uint32_t da[4];
      ldmatrix_x4_trans(da, frag_cols16(sdSt + kk * 16 * kLdS + dq_row, kLdS, blk.lane));
#pragma unroll
      for (int dp16 = 0; dp16 < kCols / 16; ++dp16) {
        uint32_t kb4[4];
        ldmatrix_x4_trans(kb4, frag_rows16(sK + kk * 16 * kLd + dq_col + dp16 * 16, kLd, blk.lane));
        mma(dqa[2 * dp16], da, kb4[0], kb4[1]);
        mma(dqa[2 * dp16 + 1], da, kb4[2], kb4[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qi = q0 + dq_row + blk.g + 8 * r;
      if (qi >= T) continue;
      float* dst = dq_accum + (int64_t{blk.b} * T + qi) * blk.C + blk.h * HS + dq_col + 2 * blk.t;
#pragma unroll
      for (int d = 0; d < kCols / 8; ++d) {
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(dst + 8 * d), make_float2(dqa[d][2 * r], dqa[d][2 * r + 1]));
#else  // vector atomics arrive with sm_90; Ampere adds the pair one by one
        atomicAdd(dst + 8 * d, dqa[d][2 * r]);
        atomicAdd(dst + 8 * d + 1, dqa[d][2 * r + 1]);
#endif
      }
    }
    if (threadIdx.x < BR) {  // stage st ^ 1 was last read in step qb - 1, before this step's first barrier
      sLse[(st ^ 1) * BR + threadIdx.x] = next_lse;
      sDelta[(st ^ 1) * BR + threadIdx.x] = next_delta;
    }
  }

  add_dkv(dqkv, dk, dv, scale, accumulate, blk, T);  // dK (scaled) and dV into dqkv
}

// dqkv[:, :, q part] += scale * dq_accum (= unless `accumulate`); one thread per 8 channels of (B, T, C) (16-byte
// accesses). kTiled: dq_accum in DqLayout::tiles (the wgmma backward's): head size 64, tile (b * NH + h, t / 64),
// and in it row 16 w + g + 8 r, columns 8 j .. 8 j + 7 at ((w * 8 + j) * 2 + r) * 64 + 8 g.
template <bool kTiled>
__global__ void attention_dq_kernel(bf16* dqkv, const float* dq_accum, int64_t n_chunks, int C, int T, float scale,
                                    bool accumulate) {
  const int row_chunks = C / 8;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_chunks;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / row_chunks;
    bf16* d = dqkv + bt * 3 * C + (i % row_chunks) * 8;
    const float* src = dq_accum + 8 * i;
    if constexpr (kTiled) {
      const int c8 = static_cast<int>(i % row_chunks), h = c8 / 8, j = c8 % 8, NH = C / 64;
      const int64_t b = bt / T;
      const int t = static_cast<int>(bt % T), row = t % 64, w = row / 16, g = row % 8, r = (row / 8) % 2;
      src = dq_accum + ((b * NH + h) * ceil_div(T, 64) + t / 64) * 4096 + ((w * 8 + j) * 2 + r) * 64 + 8 * g;
    }
    const float4 a0 = reinterpret_cast<const float4*>(src)[0];
    const float4 a1 = reinterpret_cast<const float4*>(src)[1];
    const float acc[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    Vec16<bf16> v;
    if (accumulate) v = Vec16<bf16>::load(d);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v.v[k] = __float2bfloat16_rn((accumulate ? __bfloat162float(v.v[k]) : 0.0f) + scale * acc[k]);
    v.store(d);
  }
}

template <int HS>
void launch_backward(bf16* dqkv, float* dq_accum, float* delta, const bf16* dout, const AttentionQkv& qkv,
                     const AttentionOut& out, const float* lse, int B, int T, int NH, cudaStream_t stream,
                     const AttentionKernels& k, bool accumulate, const AttentionDyCodes* dy) {
  constexpr int KEYS = BwdTile<HS>::kKeys, kThreads = 2 * KEYS, bytes = backward_smem_bytes<HS>();
  static PerDevice<int> resident;  // blocks resident at once per device (the shared memory limit is set on each)
  const int slots = resident.get([] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_backward_kernel<HS>, kThreads, bytes));
    return sm_count() * std::max(per_sm, 1);
  });
  const float scale = 1.0f / sqrtf(float(HS));
  const bool wgmma = use_wgmma(HS, k);
  const DqLayout layout = wgmma ? DqLayout::tiles : DqLayout::rows;
  attention_backward_delta(delta, dq_accum, layout, dout, out, B, T, NH, HS, stream);
  if (wgmma) {
    attention_backward_wgmma64(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, scale, stream, accumulate, dy);
  } else {
    const int BH = B * NH, n_kb = ceil_div(T, KEYS);
    attention_backward_kernel<HS><<<BH * n_kb, kThreads, bytes, stream>>>(
        dqkv, dq_accum, delta, dout, qkv.bf16, lse, BH, T, NH, backward_group(BH, n_kb, T, HS, slots), scale,
        accumulate);
    CUDA_CHECK_LAUNCH();
  }
  if (dy)  // codes, or dqkv with column sums
    attention_backward_dq_codes(dq_accum, *dy, B, T, NH, stream, dqkv);
  else
    attention_backward_dq(dqkv, dq_accum, layout, B, T, NH, HS, stream, accumulate);
}

void check_pass(const char* what, DqLayout layout, int HS) {
  FP8T_CHECK(HS == 64 || HS == 128, "{}: head size {} not supported (64 or 128)", what, HS);
  FP8T_CHECK(layout == DqLayout::rows || HS == 64, "{}: the tiled dQ layout needs head size 64, got {}", what, HS);
}

}  // namespace

int64_t attention_dq_floats(DqLayout layout, int B, int T, int NH, int HS) {
  if (layout == DqLayout::tiles) return int64_t{B} * NH * ceil_div(T, 64) * 64 * 64;  // whole 64-query tiles per head
  return int64_t{B} * T * NH * HS;
}

int64_t attention_dq_scratch_floats(int B, int T, int NH, int HS, const AttentionKernels& k) {
  return attention_dq_floats(use_wgmma(HS, k) ? DqLayout::tiles : DqLayout::rows, B, T, NH, HS);
}

void attention_backward_delta(float* delta, float* dq_accum, DqLayout layout, const bf16* dout, const AttentionOut& out,
                              int B, int T, int NH, int HS, cudaStream_t stream) {
  check_pass("attention_backward_delta", layout, HS);
  FP8T_CHECK((out.bf16 != nullptr) != (out.e4m3_t != nullptr) && (!out.e4m3_t || out.scale_inv),
             "attention_backward: O must be given either as bf16 or as E4M3 codes with their scale_inv");
  if (out.e4m3_t) {  // the codes' kernel leaves dq_accum alone: zeroed here in either layout
    const int64_t M = int64_t{B} * T, threads = M / 4 * NH * (HS / 8);
    FP8T_CHECK(M % 16 == 0 && aligned16(out.e4m3_t),
               "attention_backward: O's transposed codes need B * T = {} a multiple of 16 and 16-byte alignment", M);
    const unsigned blocks = checked_grid(ceil_div64(threads, 256), kMaxGridX, "attention_backward",
                                         "B*T / 4 * NH * HS / 8 threads (256 per block)");
    CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, attention_dq_floats(layout, B, T, NH, HS) * sizeof(float), stream));
    if (HS == 64)
      attention_delta_fp8t_kernel<64><<<blocks, 256, 0, stream>>>(delta, dout, out.e4m3_t, out.scale_inv, M, T, NH);
    else
      attention_delta_fp8t_kernel<128><<<blocks, 256, 0, stream>>>(delta, dout, out.e4m3_t, out.scale_inv, M, T, NH);
    CUDA_CHECK_LAUNCH();
    return;
  }
  FP8T_CHECK(aligned16(out.bf16), "attention_backward: out must be 16-byte aligned");
  const int64_t n_chunks = int64_t{B} * T * NH * HS / 8;
  const unsigned blocks = checked_grid(ceil_div64(n_chunks, 256), kMaxGridX, "attention_backward",
                                       "B*T*C / 8 chunks of dout (256 per block)");
  // The kernel zeroes 8 floats of dq_accum per chunk: all of it in the rows layout, and in the tiled one where T is a
  // multiple of 64 (the same length; the layout does not matter to zeros). A longer tiled scratch is zeroed here.
  const int64_t dq_floats = attention_dq_floats(layout, B, T, NH, HS);
  const bool zero_here = dq_floats != 8 * n_chunks;
  if (zero_here) CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, dq_floats * sizeof(float), stream));
  float* rows = zero_here ? nullptr : dq_accum;
  if (HS == 64)
    attention_delta_kernel<64><<<blocks, 256, 0, stream>>>(delta, rows, dout, out.bf16, n_chunks, T, NH);
  else
    attention_delta_kernel<128><<<blocks, 256, 0, stream>>>(delta, rows, dout, out.bf16, n_chunks, T, NH);
  CUDA_CHECK_LAUNCH();
}

void attention_backward_dq(bf16* dqkv, const float* dq_accum, DqLayout layout, int B, int T, int NH, int HS,
                           cudaStream_t stream, bool accumulate) {
  check_pass("attention_backward_dq", layout, HS);
  const int C = NH * HS;
  const int64_t n_chunks = int64_t{B} * T * C / 8;
  const float scale = 1.0f / sqrtf(float(HS));
  const int blocks = static_cast<int>(std::min<int64_t>((n_chunks + 255) / 256, 65536));
  if (layout == DqLayout::tiles)
    attention_dq_kernel<true><<<blocks, 256, 0, stream>>>(dqkv, dq_accum, n_chunks, C, T, scale, accumulate);
  else
    attention_dq_kernel<false><<<blocks, 256, 0, stream>>>(dqkv, dq_accum, n_chunks, C, T, scale, accumulate);
  CUDA_CHECK_LAUNCH();
}

void attention_backward(bf16* dqkv, float* dq_accum, float* delta, const bf16* dout, const AttentionQkv& qkv,
                        const AttentionOut& out, const float* lse, int B, int T, int NH, int HS, cudaStream_t stream,
                        const AttentionKernels& k, bool accumulate, const AttentionDyCodes* dy) {
  check_sizes("attention_backward", qkv, B, T, NH, HS, k);
  FP8T_CHECK(aligned16(dout), "attention_backward: dout must be 16-byte aligned");
  FP8T_CHECK((dy || aligned16(dqkv)) && aligned16(dq_accum),
             "attention_backward: dqkv and dq_accum must be 16-byte aligned");
  if (dy) {
    FP8T_CHECK(attention_writes_dy_codes(HS, k) && !accumulate,
               "attention_backward: dy codes need the warpgroup-MMA kernels (head size 64 on a Hopper GPU, sm_90a "
               "build; attention_writes_dy_codes) and accumulate false, got head size {}, accumulate {}",
               HS, accumulate);
    if (dy->codes || dy->codes_t)
      FP8T_CHECK(dy->scale && (reinterpret_cast<uintptr_t>(dy->codes) & 7u) == 0,
                 "attention_backward: dy codes need a scale and 8-byte aligned codes or codes_t");
    else
      FP8T_CHECK(dy->stats.colsum && dqkv, "attention_backward: dy without codes needs column sums and dqkv");
  }
  FP8T_CHECK(int64_t{B} * NH * ceil_div(T, 64) <= 0x7fffffff, "attention_backward: grid too large (B={} NH={} T={})", B,
             NH, T);
  if (HS == 64)
    launch_backward<64>(dqkv, dq_accum, delta, dout, qkv, out, lse, B, T, NH, stream, k, accumulate, dy);
  else
    launch_backward<128>(dqkv, dq_accum, delta, dout, qkv, out, lse, B, T, NH, stream, k, accumulate, dy);
}

}  // namespace fp8t::kernels
