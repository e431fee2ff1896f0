// The attention forward at head size 64 on Hopper's warpgroup MMA (sm_90a), fed as FlashAttention-3 feeds its
// consumers: a loading warpgroup, one lane of which brings Q once and each key tile's K and V by TMA into three stages
// on transaction barriers, and the two computing warpgroups never meet. The loading warps give up their registers
// (setmaxnreg) so that the computing ones hold 104 without spilling. The product's forward where qkv is bf16; E4M3 qkv
// (fp8_all) takes the cp.async kernel (kernels/attention_wgmma_forward_kernel.cuh), and in the lab a form of this one
// whose loading warpgroup dequantizes the codes (kCodes). The lab also keeps the form with a single loading warp
// (!kWide, 1% slower on an H100 in the fiftieth session) and its ping-pong form.
#pragma once
#include "core/launch_limits.h"
#include "kernels/attention_wgmma.cuh"
#include "kernels/attention_wgmma_common.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/tma.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kWsRows = 128, kWsStages = 3;
constexpr int kWsComputeThreads = 256;
// The block: two computing warpgroups and (kWide, the product's) a whole loading warpgroup, whose three idle warps let
// setmaxnreg move registers to the computing ones, or (the lab) a single loading warp. ptxas gives 288 threads at 2
// blocks per SM 96 registers (one scheduler holds 5 of the 18 warps) and they spill 8 bytes; 384 threads start at 80,
// and the computing warps then take kWideRegs.
template <bool kWide>
constexpr int kWsThreads = kWsComputeThreads + (kWide ? 128 : 32);
constexpr int kWideLoaderRegs = 24, kWideRegs = 104;  // 80 + (80 - 24) * 128 / 256 = 108, rounded down to 8
constexpr int kCodesLoaderRegs = 40, kCodesRegs = 96;  // kCodes: the loading warps dequantize (32 spill 72 bytes)
constexpr int kCodeTileBytes = 64 * 64;  // one 64 x 64 tile of E4M3 codes
// sQ (2 tiles: one per warpgroup), kWsStages x (sK, sV); kCodes: their codes' staging (2 + 2 kWsStages code tiles);
// the barriers (full, empty, q_full; kCodes: codes_full, q_codes); +1024 to align the tiles.
// Byte offsets from the aligned base: sQ 0, sK, sV, then (kCodes) the code tiles cQ, cK, cV, then the barriers.
constexpr int kOffK = 2 * kTileBytes, kOffV = kOffK + kWsStages * kTileBytes, kOffCQ = kOffV + kWsStages * kTileBytes;
constexpr int kOffCK = kOffCQ + 2 * kCodeTileBytes, kOffCV = kOffCK + kWsStages * kCodeTileBytes;
template <bool kCodes>
constexpr int kOffBars = kCodes ? kOffCV + kWsStages * kCodeTileBytes : kOffCQ;
template <bool kCodes>
constexpr int kWsSmemBytes = (2 + 2 * kWsStages) * kTileBytes + (kCodes ? (2 + 2 * kWsStages) * kCodeTileBytes : 0) +
                             (2 * kWsStages + 1 + (kCodes ? kWsStages + 1 : 0)) * 8 + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// kCodes: rows [row0, row0 + 64) of a staged code tile (64 bytes a row) dequantized into a swizzled bf16 tile by the
// loading warpgroup's thread lt (4 chunks of 8 codes each), rows at or beyond T as zeros.
__device__ __forceinline__ void dequant_code_tile(unsigned char* tile, const unsigned char* codes,
                                                  const float* row_sinv, int row0, int T, int lt) {
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int i = lt + it * 128, r = i / 8, c = i % 8;
    const float sinv = row0 + r < T ? row_sinv[row0 + r] : 0.0f;
    uint32_t w[4];
    dequant_bf16x8<Fp8Format::e4m3>(*reinterpret_cast<const uint2*>(codes + r * 64 + c * 8), sinv, w);
    *reinterpret_cast<uint4*>(tile + r * 128 + ((c ^ (r & 7)) << 4)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// kCodes: the loading warpgroup (thread lt of 128). Lane 0 keeps up to kWsStages key tiles' codes in flight; every
// thread dequantizes each into the stage's bf16 tiles once the computing warps have released them. smem: the aligned
// base (the kernel's layout, kOff*).
__device__ __forceinline__ void load_codes_ws(const CUtensorMap& tm, const float* row_sinv, unsigned char* smem, int b,
                                              int h, int C, int q0, int n_kt, int T, int lt) {
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars<true>);
  uint64_t* empty = full + kWsStages;
  uint64_t* q_full = empty + kWsStages;
  uint64_t* codes_full = q_full + 1;
  uint64_t* q_codes = codes_full + kWsStages;
  const float* sinv_b = row_sinv + int64_t{b} * T;
  auto fetch = [&](int kt) {  // lane 0: key tile kt's codes into staging slot kt % kWsStages
    const int st = kt % kWsStages;
    mbar_arrive_expect_tx(codes_full + st, 2 * kCodeTileBytes);
    tma_load_3d(smem + kOffCK + st * kCodeTileBytes, &tm, C + h * kHs, kt * kKeys, b, codes_full + st);
    tma_load_3d(smem + kOffCV + st * kCodeTileBytes, &tm, 2 * C + h * kHs, kt * kKeys, b, codes_full + st);
  };
  if (lt == 0) {
    tma_prefetch_map(&tm);
    mbar_arrive_expect_tx(q_codes, 2 * kCodeTileBytes);
    for (int half = 0; half < 2; ++half)
      tma_load_3d(smem + kOffCQ + half * kCodeTileBytes, &tm, h * kHs, q0 + 64 * half, b, q_codes);
    for (int kt = 0; kt < n_kt && kt < kWsStages; ++kt) fetch(kt);
  }
  mbar_wait(q_codes, 0);
  for (int half = 0; half < 2; ++half)
    dequant_code_tile(smem + half * kTileBytes, smem + kOffCQ + half * kCodeTileBytes, sinv_b, q0 + 64 * half, T, lt);
  fence_async_shared();  // this thread's stores, visible to wgmma
  mbar_arrive(q_full);
  for (int kt = 0; kt < n_kt; ++kt) {
    const int st = kt % kWsStages;
    mbar_wait(codes_full + st, (kt / kWsStages) & 1);
    if (kt >= kWsStages) mbar_wait(empty + st, (kt / kWsStages - 1) & 1);  // tile kt - kWsStages is done with
    dequant_code_tile(smem + kOffK + st * kTileBytes, smem + kOffCK + st * kCodeTileBytes, sinv_b, kt * kKeys, T, lt);
    dequant_code_tile(smem + kOffV + st * kTileBytes, smem + kOffCV + st * kCodeTileBytes, sinv_b, kt * kKeys, T, lt);
    fence_async_shared();
    mbar_arrive(full + st);
    named_barrier(4, 128);  // every loading thread has read the staging slot
    if (lt == 0 && kt + kWsStages < n_kt) fetch(kt + kWsStages);
  }
}

// One block per (128 queries, b*h), heaviest query blocks first, two blocks per SM, as the product's forward: warpgroup
// w owns queries q0 + 64 w .. + 63 and runs the same online softmax over key tiles of 64 up to its diagonal, with the
// same MMAs in the same order (so the same results bit for bit). Thread 256, the loading warps' first lane, loads: Q's
// two tiles on q_full, then key tile kt's K and V into stage kt % kWsStages on full[stage], once the eight computing
// warps have released that stage's previous tile on empty[stage]. The lower warpgroup's last tile (wholly after its
// queries) is never read by it; the loader never waits for that release, since no tile comes after the last.
// kPingpong (FlashAttention-3's ping-pong; in the lab, 1.5% slower on an H100 in the fiftieth session): the two
// warpgroups take turns issuing their MMA groups, two turns a key tile (S, then P V). Warpgroup w issues after a
// bar.sync on barrier 2 + w and then arrives on the other's; the upper one arrives once first, so that the lower one
// starts. The lower one also takes its two turns on its last tile, which it does not read (barriers only), and the
// upper one skips its last arrival, so each barrier's arrivals match its waits.
// kCodes (with kWide; in the lab, 3.5-5% slower than the cp.async codes kernel on an H100 in the fiftieth session):
// tm_qkv maps qkv's E4M3 codes (bytes, unswizzled 64 x 64 boxes) and row_sinv their per-row scale_inv. The loading
// warpgroup's first lane brings the codes by TMA into staging tiles (Q's once on q_codes, a key tile's K and V into
// staging slot kt % kWsStages on codes_full), and its 128 threads dequantize them into the bf16 tiles (as CodesTile
// does, rows at or beyond T as zeros), then arrive on q_full and full (128 arrivals each). A staging slot is refilled
// once all 128 have read it (named barrier 4).
template <bool kPingpong, bool kWide, bool kCodes>
__global__ void __launch_bounds__(kWsThreads<kWide>, 2)
    attention_forward_ws_kernel(const __grid_constant__ CUtensorMap tm_qkv, bf16* out, float* lse,
                                const float* row_sinv, int T, int NH, float scale) {
  static_assert(!kCodes || kWide, "the codes' dequantization needs the whole loading warpgroup");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  unsigned char* sQ = smem;             // [warpgroup]
  unsigned char* sK = smem + kOffK;      // [stage]
  unsigned char* sV = smem + kOffV;      // [stage]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars<kCodes>);  // [stage]
  uint64_t* empty = full + kWsStages;                                     // [stage]
  uint64_t* q_full = empty + kWsStages;
  uint64_t* codes_full = q_full + 1;           // kCodes: [stage]
  uint64_t* q_codes = codes_full + kWsStages;  // kCodes

  const int C = NH * kHs;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kWsRows;  // longest rows first
  const int n_kt = ceil_div(std::min(q0 + kWsRows, T), kKeys);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      mbar_init(full + s, kCodes ? 128 : 1);  // the loading lane's arrival with the TMA bytes, or (kCodes) the 128
      mbar_init(empty + s, 8);                // one arrival per computing warp
      if constexpr (kCodes) mbar_init(codes_full + s, 1);
    }
    mbar_init(q_full, kCodes ? 128 : 1);
    if constexpr (kCodes) mbar_init(q_codes, 1);
    mbar_init_fence();
  }
  __syncthreads();  // the block's only one

  if (tid >= kWsComputeThreads) {  // the loading warp(s): one lane issues every copy
    if constexpr (kCodes) {
      setmaxnreg_dec<kCodesLoaderRegs>();
      load_codes_ws(tm_qkv, row_sinv, smem, b, h, C, q0, n_kt, T, tid - kWsComputeThreads);
      return;
    }
    if constexpr (kWide) setmaxnreg_dec<kWideLoaderRegs>();
    if (tid != kWsComputeThreads) return;
    tma_prefetch_map(&tm_qkv);
    mbar_arrive_expect_tx(q_full, 2 * kTileBytes);
    for (int half = 0; half < 2; ++half)
      tma_load_3d(sQ + half * kTileBytes, &tm_qkv, h * kHs, q0 + 64 * half, b, q_full);
    for (int kt = 0; kt < n_kt; ++kt) {
      const int st = kt % kWsStages;
      if (kt >= kWsStages) mbar_wait(empty + st, (kt / kWsStages - 1) & 1);  // tile kt - kWsStages is done with
      mbar_arrive_expect_tx(full + st, 2 * kTileBytes);
      tma_load_3d(sK + st * kTileBytes, &tm_qkv, C + h * kHs, kt * kKeys, b, full + st);
      tma_load_3d(sV + st * kTileBytes, &tm_qkv, 2 * C + h * kHs, kt * kKeys, b, full + st);
    }
    return;
  }

  // What the loading warpgroup gave back and no more: a block's registers stay within what it was launched with.
  if constexpr (kCodes) setmaxnreg_inc<kCodesRegs>();
  else if constexpr (kWide) setmaxnreg_inc<kWideRegs>();
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const int wg_lo = q0 + wg * 64, row_lo = wg_lo + warp * 16;  // this warpgroup's and this warp's first query
  const int n_wg = std::min(n_kt, wg_lo / kKeys + 1);          // key tiles up to this warpgroup's diagonal
  const float sl2 = scale * kLog2e;
  const uint64_t dQ = sw128_desc(sQ + wg * kTileBytes);

  float o[8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8: raw max, partial sum
  const int n_turns = kPingpong ? n_kt : n_wg;                // key tiles this warpgroup steps through
  if (kPingpong && wg == 1) named_barrier_arrive(2, kWsComputeThreads);
  mbar_wait(q_full, 0);
  for (int kt = 0; kt < n_turns; ++kt) {
    const int st = kt % kWsStages, k0 = kt * kKeys;
    const bool last = kt + 1 == n_turns;
    auto turn = [&](int phase) {  // kPingpong: even phases begin a turn, odd ones end it
      if constexpr (kPingpong) {
        if (phase % 2 == 0 && wg == 0) {  // barrier ids as immediates: ptxas then reserves 4, not all 16
          named_barrier(2, kWsComputeThreads);
        } else if (phase % 2 == 0) {
          named_barrier(3, kWsComputeThreads);
        } else if (wg == 0) {
          named_barrier_arrive(3, kWsComputeThreads);
        } else if (!(last && phase == 3)) {
          named_barrier_arrive(2, kWsComputeThreads);
        }
      }
    };
    if (kt == n_wg) {  // kPingpong, the lower warpgroup's tile past its queries: the turns alone
      for (int phase = 0; phase < 4; ++phase) turn(phase);
      break;
    }
    mbar_wait(full + st, (kt / kWsStages) & 1);
    const uint64_t dKt = sw128_desc(sK + st * kTileBytes), dVt = sw128_desc(sV + st * kTileBytes);
    forward_tile_64(o, m, l, dQ, dKt, dVt, k0, row_lo, sl2, g, t, turn);  // its MMAs done: the stage's last reads
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + st);
  }

  store_rows(o, l, m, sl2, out + int64_t{b} * T * C + h * kHs, C, lse + int64_t{bh} * T, row_lo, T, g, t);
}

#else  // not sm_90a: never launched (attention_wgmma_available() is false)

template <bool kPingpong, bool kWide, bool kCodes>
__global__ void attention_forward_ws_kernel(const __grid_constant__ CUtensorMap, bf16*, float*, const float*, int, int,
                                            float) {
  __trap();
}

#endif

// Whether the loading-warp kernel takes this qkv: bf16 (or, kCodes, E4M3 codes), 16-byte aligned (TMA's base).
template <bool kCodes = false>
bool forward_ws_takes(const AttentionQkv& qkv) {
  const void* base = kCodes ? static_cast<const void*>(qkv.e4m3) : static_cast<const void*>(qkv.bf16);
  return base != nullptr && reinterpret_cast<uintptr_t>(base) % 16 == 0 && (!kCodes || qkv.row_scale_inv);
}

template <bool kPingpong = false, bool kWide = true, bool kCodes = false>
void launch_forward_ws(bf16* out, float* lse, const AttentionQkv& qkv, int B, int T, int NH, float scale,
                       cudaStream_t stream) {
  FP8T_CHECK(forward_ws_takes<kCodes>(qkv), "launch_forward_ws: needs {} qkv, 16-byte aligned",
             kCodes ? "E4M3 (with row scales)" : "bf16");
  auto* kernel = attention_forward_ws_kernel<kPingpong, kWide, kCodes>;
  static PerDevice<bool> configured;  // the shared memory limit is set on each device
  configured.get([kernel] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWsSmemBytes<kCodes>));
    return true;
  });
  const int64_t C = NH * kHs;
  const CUtensorMap tm_qkv = kCodes ? tensor_map_u8_3d(qkv.e4m3, 3 * C, T, B, 3 * C, 3 * C * T, 64, 64)
                                    : tensor_map_bf16_3d(qkv.bf16, 3 * C, T, B, 3 * C, 3 * C * T, 64, 64);
  const dim3 grid(B * NH, ceil_div(T, kWsRows));
  kernel<<<grid, kWsThreads<kWide>, kWsSmemBytes<kCodes>, stream>>>(tm_qkv, out, lse, qkv.row_scale_inv, T, NH, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace fp8t::kernels
