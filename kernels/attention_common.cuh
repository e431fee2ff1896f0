// Device helpers shared by the attention kernels (kernels/attention.cu, kernels/attention_wgmma.cu): cp.async,
// bf16 packing, and the block order of the backward pass.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

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
