// Causal flash attention (FlashAttention-2 schedule) on tensor cores through WMMA (bf16 16x16x16, f32
// accumulate). Tiles of 64 queries x 64 keys; each of the 4 warps owns 16 rows of a tile. Scores and
// probabilities are staged in shared memory between the two GEMMs of each step.
// Forward: one block per (query tile, b*h), online softmax over key tiles 0..diagonal.
// Backward: delta = rowsum(dO * O); one block per (key tile, b*h) accumulating dK, dV in registers over
// query tiles diagonal..end, dQ added to an f32 scratch with atomics; a last pass adds scale * dQ into dqkv.
#include <mma.h>

#include "kernels/attention.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

namespace wmma = nvcuda::wmma;

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr int kTile = 64;  // queries and keys per tile
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kLdS = kTile + 4;  // f32 score tiles, padded
constexpr int kLdP = kTile + 8;  // bf16 probability tiles, padded

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int HS>
struct Layout {
  static constexpr int kLdX = HS + 8;  // bf16 (64, HS) tiles, padded
  static constexpr int kLdO = HS + 4;  // f32 (64, HS) tiles, padded
  static constexpr int kTileX = kTile * kLdX * 2;
  static constexpr int kTileS = kTile * kLdS * 4;
  static constexpr int kTileP = kTile * kLdP * 2;
  static constexpr int kTileO = kTile * kLdO * 4;
  // forward: sQ, sK, sV, sS, sP, sO, m, l
  static constexpr int kForwardBytes = 3 * kTileX + kTileS + kTileP + kTileO + 2 * kTile * 4;
  // backward: sK, sV, sQ, sdO, sS+sdP (reused as the f32 dQ/dK/dV staging tile), sP, sdS, lse, delta
  static constexpr int kStage = (2 * kTileS > kTileO) ? 2 * kTileS : kTileO;
  static constexpr int kBackwardBytes = 4 * kTileX + kStage + 2 * kTileP + 2 * kTile * 4;
};

// Copies rows [row0, row0 + 64) of one head (HS channels at `src`, row stride `ld`) into sX (64, kLdX);
// rows at or beyond T are zero.
template <int HS>
__device__ __forceinline__ void load_tile(bf16* sX, const bf16* src, int64_t ld, int row0, int T) {
  using V = Vec16<bf16>;
  constexpr int kVecPerRow = HS / V::size;
  for (int i = threadIdx.x; i < kTile * kVecPerRow; i += kThreads) {
    const int r = i / kVecPerRow, c = (i % kVecPerRow) * V::size;
    V v;
    if (row0 + r < T) {
      v = V::load(src + (row0 + r) * ld + c);
    } else {
#pragma unroll
      for (int k = 0; k < V::size; ++k) v.v[k] = __float2bfloat16_rn(0.0f);
    }
    v.store(sX + r * Layout<HS>::kLdX + c);
  }
}

// sDst (16 rows of this warp, 64 cols) f32 = sA (16, HS) @ sB (64, HS)^T, both bf16 row-major in smem.
template <int HS>
__device__ __forceinline__ void warp_scores(float* sDst, const bf16* sA, const bf16* sB) {
  constexpr int ld = Layout<HS>::kLdX;
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA a;
      FragBt b;
      wmma::load_matrix_sync(a, sA + kk * 16, ld);
      wmma::load_matrix_sync(b, sB + j * 16 * ld + kk * 16, ld);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(sDst + j * 16, acc, kLdS, wmma::mem_row_major);
  }
}

template <int HS>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T,
                                                                       int NH, float scale) {
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);                   // (64, HS)
  bf16* sK = sQ + kTile * L::kLdX;                            // (64, HS)
  bf16* sV = sK + kTile * L::kLdX;                            // (64, HS)
  float* sS = reinterpret_cast<float*>(sV + kTile * L::kLdX);  // (64, 64)
  bf16* sP = reinterpret_cast<bf16*>(sS + kTile * kLdS);      // (64, 64)
  float* sO = reinterpret_cast<float*>(sP + kTile * kLdP);    // (64, HS)
  float* sM = sO + kTile * L::kLdO;                           // (64) running max
  float* sL = sM + kTile;                                     // (64) running sum

  const int C = NH * HS;
  const int64_t ld = 3 * int64_t{C};
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int qt = gridDim.x - 1 - blockIdx.x;  // longest tiles first
  const int q0 = qt * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * HS;

  load_tile<HS>(sQ, q_base, ld, q0, T);
  for (int i = threadIdx.x; i < kTile * L::kLdO; i += kThreads) sO[i] = 0.0f;
  if (threadIdx.x < kTile) {
    sM[threadIdx.x] = -INFINITY;
    sL[threadIdx.x] = 0.0f;
  }
  const int row0 = warp * 16;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous step is done with sK, sV
    load_tile<HS>(sK, q_base + C, ld, k0, T);
    load_tile<HS>(sV, q_base + 2 * C, ld, k0, T);
    __syncthreads();
    warp_scores<HS>(sS + row0 * kLdS, sQ + row0 * L::kLdX, sK);
    __syncwarp();
    // Online softmax over this warp's 16 rows; two columns per lane.
    for (int r = row0; r < row0 + 16; ++r) {
      const int qi = q0 + r;
      float s[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        s[u] = (k0 + c <= qi) ? sS[r * kLdS + c] * scale : -INFINITY;
      }
      const float m_old = sM[r];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s[0], s[1])));  // finite: key k0 <= qi always
      float psum = 0.0f;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const float p = __expf(s[u] - m_new);
        psum += p;
        sP[r * kLdP + lane + 32 * u] = __float2bfloat16_rn(p);
      }
      psum = warp_sum(psum);
      const float alpha = __expf(m_old - m_new);
      for (int d = lane; d < HS; d += 32) sO[r * L::kLdO + d] *= alpha;
      __syncwarp();
      if (lane == 0) {
        sM[r] = m_new;
        sL[r] = sL[r] * alpha + psum;
      }
    }
    __syncwarp();
    // sO rows += sP rows (16, 64) @ sV (64, HS)
#pragma unroll
    for (int j = 0; j < HS / 16; ++j) {
      FragC acc;
      wmma::load_matrix_sync(acc, sO + row0 * L::kLdO + j * 16, L::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA a;
        FragB bv;
        wmma::load_matrix_sync(a, sP + row0 * kLdP + kk * 16, kLdP);
        wmma::load_matrix_sync(bv, sV + kk * 16 * L::kLdX + j * 16, L::kLdX);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(sO + row0 * L::kLdO + j * 16, acc, L::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int r = row0; r < row0 + 16; ++r) {
    const int qi = q0 + r;
    if (qi >= T) break;
    const float l = sL[r];
    const float inv = 1.0f / l;
    bf16* o = out + (int64_t{b} * T + qi) * C + h * HS;
    for (int d = lane; d < HS; d += 32) o[d] = __float2bfloat16_rn(sO[r * L::kLdO + d] * inv);
    if (lane == 0) lse[int64_t{bh} * T + qi] = sM[r] + logf(l);
  }
}

// delta (B, NH, T) = rowsum(dO * O) per head; one warp per (b, t, h).
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int64_t BT, int T, int NH,
                                       int HS) {
  const int64_t w = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= BT * NH) return;
  const int64_t bt = w / NH;
  const int h = static_cast<int>(w % NH);
  const int64_t off = bt * NH * HS + int64_t{h} * HS;
  float acc = 0.0f;
  for (int d = lane; d < HS; d += 32) acc += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int64_t b = bt / T, t = bt % T;
    delta[(b * NH + h) * T + t] = acc;
  }
}

// Adds a (64, HS) f32 staging tile (this warp's 16 rows) times `scale` into rows of dst (row stride ld).
template <int HS>
__device__ __forceinline__ void warp_add_rows(bf16* dst, int64_t ld, const float* sX, int row0, int t0, int T,
                                              float scale) {
  const int lane = threadIdx.x % 32;
  for (int r = row0; r < row0 + 16; ++r) {
    if (t0 + r >= T) break;
    bf16* d = dst + (t0 + r) * ld;
    for (int c = lane; c < HS; c += 32)
      d[c] = __float2bfloat16_rn(__bfloat162float(d[c]) + scale * sX[r * Layout<HS>::kLdO + c]);
  }
}

template <int HS>
__global__ void __launch_bounds__(kThreads) attention_backward_kernel(bf16* dqkv, float* dq_accum, const float* delta,
                                                                        const bf16* dout, const bf16* qkv,
                                                                        const float* lse, int T, int NH, float scale) {
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);                      // (64 keys, HS)
  bf16* sV = sK + kTile * L::kLdX;                               // (64 keys, HS)
  bf16* sQ = sV + kTile * L::kLdX;                               // (64 queries, HS)
  bf16* sdO = sQ + kTile * L::kLdX;                              // (64 queries, HS)
  float* sS = reinterpret_cast<float*>(sdO + kTile * L::kLdX);   // (64 q, 64 k) scores
  float* sdP = sS + kTile * kLdS;                                // (64 q, 64 k) dO V^T
  float* sX = sS;                                                // (64, HS) f32 staging, reuses sS/sdP
  bf16* sP = reinterpret_cast<bf16*>(smem + 4 * L::kTileX + L::kStage);  // (64 q, 64 k)
  bf16* sdS = sP + kTile * kLdP;                                 // (64 q, 64 k)
  float* sLse = reinterpret_cast<float*>(sdS + kTile * kLdP);    // (64)
  float* sDelta = sLse + kTile;                                  // (64)

  const int C = NH * HS;
  const int64_t ld = 3 * int64_t{C};
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int kt = blockIdx.x, k0 = kt * kTile;
  const int n_qt = (T + kTile - 1) / kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16;
  const bf16* q_base = qkv + int64_t{b} * T * ld + h * HS;
  const bf16* do_base = dout + int64_t{b} * T * C + h * HS;

  load_tile<HS>(sK, q_base + C, ld, k0, T);
  load_tile<HS>(sV, q_base + 2 * C, ld, k0, T);
  FragC dk[HS / 16], dv[HS / 16];  // this warp's 16 keys x HS
#pragma unroll
  for (int j = 0; j < HS / 16; ++j) {
    wmma::fill_fragment(dk[j], 0.0f);
    wmma::fill_fragment(dv[j], 0.0f);
  }

  for (int qt = kt; qt < n_qt; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // the previous step is done with every tile
    load_tile<HS>(sQ, q_base, ld, q0, T);
    load_tile<HS>(sdO, do_base, C, q0, T);
    if (threadIdx.x < kTile) {
      const int qi = q0 + threadIdx.x;
      sLse[threadIdx.x] = qi < T ? lse[int64_t{bh} * T + qi] : 0.0f;
      sDelta[threadIdx.x] = qi < T ? delta[int64_t{bh} * T + qi] : 0.0f;
    }
    __syncthreads();
    // This warp's 16 query rows: S = Q K^T, dP = dO V^T
    warp_scores<HS>(sS + row0 * kLdS, sQ + row0 * L::kLdX, sK);
    warp_scores<HS>(sdP + row0 * kLdS, sdO + row0 * L::kLdX, sV);
    __syncwarp();
    for (int r = row0; r < row0 + 16; ++r) {
      const int qi = q0 + r;
      const float lse_r = sLse[r], delta_r = sDelta[r];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        const float p = (k0 + c <= qi) ? __expf(sS[r * kLdS + c] * scale - lse_r) : 0.0f;
        sP[r * kLdP + c] = __float2bfloat16_rn(p);
        sdS[r * kLdP + c] = __float2bfloat16_rn(p * (sdP[r * kLdS + c] - delta_r));
      }
    }
    __syncthreads();  // every warp reads all query rows of sP and sdS below; sS/sdP become the staging tile
    // This warp's 16 keys: dV += P^T dO, dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragAt pt, dst;
      wmma::load_matrix_sync(pt, sP + kk * 16 * kLdP + row0, kLdP);
      wmma::load_matrix_sync(dst, sdS + kk * 16 * kLdP + row0, kLdP);
#pragma unroll
      for (int j = 0; j < HS / 16; ++j) {
        FragB bo, bq;
        wmma::load_matrix_sync(bo, sdO + kk * 16 * L::kLdX + j * 16, L::kLdX);
        wmma::load_matrix_sync(bq, sQ + kk * 16 * L::kLdX + j * 16, L::kLdX);
        wmma::mma_sync(dv[j], pt, bo, dv[j]);
        wmma::mma_sync(dk[j], dst, bq, dk[j]);
      }
    }
    // This warp's 16 query rows: dQ partial = dS K, added to the f32 scratch
#pragma unroll
    for (int j = 0; j < HS / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA a;
        FragB bk;
        wmma::load_matrix_sync(a, sdS + row0 * kLdP + kk * 16, kLdP);
        wmma::load_matrix_sync(bk, sK + kk * 16 * L::kLdX + j * 16, L::kLdX);
        wmma::mma_sync(acc, a, bk, acc);
      }
      wmma::store_matrix_sync(sX + row0 * L::kLdO + j * 16, acc, L::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = row0; r < row0 + 16; ++r) {
      const int qi = q0 + r;
      if (qi >= T) break;
      float* dq = dq_accum + (int64_t{b} * T + qi) * C + h * HS;
      for (int c = lane; c < HS; c += 32) atomicAdd(&dq[c], sX[r * L::kLdO + c]);
    }
  }
  // dK (scaled) and dV into dqkv, through the staging tile (this warp's rows only).
  __syncthreads();
  bf16* dk_base = dqkv + int64_t{b} * T * ld + C + h * HS;
#pragma unroll
  for (int j = 0; j < HS / 16; ++j)
    wmma::store_matrix_sync(sX + row0 * L::kLdO + j * 16, dk[j], L::kLdO, wmma::mem_row_major);
  __syncwarp();
  warp_add_rows<HS>(dk_base, ld, sX, row0, k0, T, scale);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < HS / 16; ++j)
    wmma::store_matrix_sync(sX + row0 * L::kLdO + j * 16, dv[j], L::kLdO, wmma::mem_row_major);
  __syncwarp();
  warp_add_rows<HS>(dk_base + C, ld, sX, row0, k0, T, 1.0f);
}

// dqkv[:, :, q part] += scale * dq_accum; one thread per element of (B, T, C).
__global__ void attention_dq_kernel(bf16* dqkv, const float* dq_accum, int64_t n, int C, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    bf16* d = dqkv + bt * 3 * C + c;
    *d = __float2bfloat16_rn(__bfloat162float(*d) + scale * dq_accum[i]);
  }
}

// ------------------------------------------------------------------------------------------------
// kernel launchers

void check_sizes(const char* what, const void* qkv, int B, int T, int NH, int HS) {
  FP8T_CHECK(B > 0 && T > 0 && NH > 0, "{}: bad sizes B={} T={} NH={}", what, B, T, NH);
  FP8T_CHECK(HS == 64 || HS == 128, "{}: head size {} not supported (64 or 128)", what, HS);
  FP8T_CHECK(aligned16(qkv), "{}: qkv must be 16-byte aligned", what);
}

template <int HS>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
  constexpr int bytes = Layout<HS>::kForwardBytes;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_forward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(T, kTile), B * NH);
  attention_forward_kernel<HS><<<grid, kThreads, bytes, stream>>>(out, lse, qkv, T, NH, 1.0f / sqrtf(float(HS)));
  CUDA_CHECK_LAUNCH();
}

template <int HS>
void launch_backward(bf16* dqkv, float* dq_accum, const float* delta, const bf16* dout, const bf16* qkv,
                     const float* lse, int B, int T, int NH, cudaStream_t stream) {
  constexpr int bytes = Layout<HS>::kBackwardBytes;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attention_backward_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(T, kTile), B * NH);
  attention_backward_kernel<HS>
      <<<grid, kThreads, bytes, stream>>>(dqkv, dq_accum, delta, dout, qkv, lse, T, NH, 1.0f / sqrtf(float(HS)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
  check_sizes("attention_forward", qkv, B, T, NH, HS);
  if (HS == 64)
    launch_forward<64>(out, lse, qkv, B, T, NH, stream);
  else
    launch_forward<128>(out, lse, qkv, B, T, NH, stream);
}

void attention_backward(bf16* dqkv, float* dq_accum, float* delta, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int NH, int HS, cudaStream_t stream) {
  check_sizes("attention_backward", qkv, B, T, NH, HS);
  FP8T_CHECK(aligned16(dout), "attention_backward: dout must be 16-byte aligned");
  const int64_t BT = int64_t{B} * T, C = int64_t{NH} * HS;
  CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, BT * C * sizeof(float), stream));
  attention_delta_kernel<<<ceil_div(BT * NH * 32, 256), 256, 0, stream>>>(delta, dout, out, BT, T, NH, HS);
  CUDA_CHECK_LAUNCH();
  if (HS == 64)
    launch_backward<64>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, stream);
  else
    launch_backward<128>(dqkv, dq_accum, delta, dout, qkv, lse, B, T, NH, stream);
  const int64_t n = BT * C;
  attention_dq_kernel<<<static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536)), 256, 0, stream>>>(
      dqkv, dq_accum, n, static_cast<int>(C), 1.0f / sqrtf(float(HS)));
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
