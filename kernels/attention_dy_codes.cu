// The attention backward's dQ pass writing qkv's Q gradient as dy codes (AttentionDyCodes, kernels/attention.cuh):
// scale * dq_accum (DqLayout::tiles), rounded to bf16 as attention_backward_dq writes it, then encoded as the plain
// E5M2 cast would encode that bf16 gradient, row-major and transposed, with the cast's statistics.
#include "kernels/attention_backward_passes.cuh"
#include "kernels/attention_dy_codes.cuh"
#include "kernels/attention_wgmma.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kDqThreads = 128;

// One block per (b * NH + h, 64-row tile of T). Thread i takes channels 8 (i % 8) .. + 7 of tile rows
// 4 (i / 8) .. + 3; dq_accum's tile (bh, tile) holds row 16 w + g + 8 r, channels 8 j .. 8 j + 7 at
// ((w * 8 + j) * 2 + r) * 64 + 8 g (attention_dq_kernel's reading of the main pass's fragment order).
// kCodes false: the bf16 values go into dqkv's Q part instead of codes, with their column sums alone.
template <bool kCodes>
__global__ void __launch_bounds__(kDqThreads) attention_dq_codes_kernel(const float* dq_accum, AttentionDyCodes dy,
                                                                        int T, int NH, int64_t M, float scale,
                                                                        bf16* dqkv) {
  __shared__ __align__(16) uint8_t s_t[kDyTile * kDyTile];
  __shared__ float s_cs[kDqThreads / 32][kDyTile];
  const int n_tiles = ceil_div(T, kDyTile);
  const int bh = static_cast<int>(blockIdx.x) / n_tiles, tile = static_cast<int>(blockIdx.x) % n_tiles;
  const int b = bh / NH, h = bh % NH, C = NH * kDyTile, j = static_cast<int>(threadIdx.x) % 8;
  const int64_t ld = 3 * int64_t{C};
  const float* src_tile = dq_accum + (int64_t{bh} * n_tiles + tile) * kDyTile * kDyTile;
  const float s = kCodes ? *dy.scale : 0.0f;
  ThreadStats st;
  float cs[8] = {};
  // Every load first: the code stores below (bytes, which may alias anything) would otherwise hold each row's loads
  // back until the previous row's stores were issued.
  float4 a[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = 4 * (static_cast<int>(threadIdx.x) / 8) + i, w = row / 16, g = row % 8, r = (row / 8) % 2;
    const float4* src = reinterpret_cast<const float4*>(src_tile + ((w * 8 + j) * 2 + r) * 64 + 8 * g);
    a[i][0] = src[0];
    a[i][1] = src[1];
  }
  uint2 codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = 4 * (static_cast<int>(threadIdx.x) / 8) + i, q = tile * kDyTile + row;
    const bool inside = q < T;
    const float acc[8] = {a[i][0].x, a[i][0].y, a[i][0].z, a[i][0].w, a[i][1].x, a[i][1].y, a[i][1].z, a[i][1].w};
    float x[8];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {  // attention_dq_kernel's values, not accumulating; rounded in pairs
      const float2 v = bf16_round2(0.0f + scale * acc[e], 0.0f + scale * acc[e + 1]);
      x[e] = inside ? v.x : 0.0f;
      x[e + 1] = inside ? v.y : 0.0f;
      cs[e] += x[e];
      cs[e + 1] += x[e + 1];
    }
    const int64_t at = (int64_t{b} * T + q) * ld + h * kDyTile + 8 * j;
    if constexpr (kCodes) {
      codes[i] = convert8<kDyFormat>(x, s, st);
      if (inside && dy.codes) *reinterpret_cast<uint2*>(dy.codes + at) = codes[i];
    } else if (inside) {
      Vec16<bf16> v;
#pragma unroll
      for (int e = 0; e < 8; ++e) v.v[e] = __float2bfloat16_rn(x[e]);  // x is bf16 already: exact
      v.store(dqkv + at);
    }
  }
  // The thread's 4 rows are adjacent: channel 8 j + e's four codes are one word of the transposed tile.
#pragma unroll
  for (int e = 0; e < 8 && kCodes; ++e) {
    const int sel = (e % 4) | (e % 4 + 4) << 4;  // byte e % 4 of the first word, then of the second
    const auto half = [&](int i) { return e < 4 ? codes[i].x : codes[i].y; };
    const uint32_t lo = __byte_perm(half(0), half(1), sel), hi = __byte_perm(half(2), half(3), sel);
    *reinterpret_cast<uint32_t*>(s_t + (8 * j + e) * kDyTile + 4 * (threadIdx.x / 8)) = __byte_perm(lo, hi, 0x5410);
  }
  // Column sums: lanes j, j + 8, j + 16, j + 24 of a warp share channels; then the 4 warps.
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    cs[e] += __shfl_xor_sync(0xffffffffu, cs[e], 8);
    cs[e] += __shfl_xor_sync(0xffffffffu, cs[e], 16);
    if (lane < 8) s_cs[warp][8 * j + e] = cs[e];
  }
  if constexpr (kCodes) flush_warp_stats(st, dy.stats);
  __syncthreads();
  if (kCodes && dy.codes_t)
    store_codes_t<kDqThreads>(s_t, dy.codes_t, int64_t{h} * kDyTile, int64_t{b} * T + int64_t{tile} * kDyTile,
                              min(kDyTile, T - tile * kDyTile), M);
  if (dy.stats.colsum && threadIdx.x < kDyTile) {
    const int c = static_cast<int>(threadIdx.x);
    atomicAdd(dy.stats.colsum + h * kDyTile + c, s_cs[0][c] + s_cs[1][c] + s_cs[2][c] + s_cs[3][c]);
  }
}

}  // namespace

bool attention_writes_dy_codes(int HS, const AttentionKernels& kernels) {
  return HS == kDyTile && kernels.wgmma && attention_wgmma_available();
}

void attention_backward_dq_codes(const float* dq_accum, const AttentionDyCodes& dy, int B, int T, int NH,
                                 cudaStream_t stream, bf16* dqkv) {
  const bool codes = dy.codes || dy.codes_t;
  FP8T_CHECK(codes ? dy.scale != nullptr : dy.stats.colsum && dqkv && aligned16(dqkv),
             "attention_backward_dq_codes: dy needs a scale and codes, or column sums and a 16-byte aligned dqkv");
  const int64_t blocks = int64_t{B} * NH * ceil_div(T, kDyTile);
  FP8T_CHECK(blocks <= 0x7fffffff, "attention_backward_dq_codes: grid too large (B={} NH={} T={})", B, NH, T);
  const float scale = 1.0f / sqrtf(static_cast<float>(kDyTile));
  const int64_t M = int64_t{B} * T;
  if (codes)
    attention_dq_codes_kernel<true>
        <<<static_cast<int>(blocks), kDqThreads, 0, stream>>>(dq_accum, dy, T, NH, M, scale, nullptr);
  else
    attention_dq_codes_kernel<false>
        <<<static_cast<int>(blocks), kDqThreads, 0, stream>>>(dq_accum, dy, T, NH, M, scale, dqkv);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
