// Hopper's asynchronous loads for warp-specialized kernels (sm_90a): the tensor memory accelerator (TMA) copying a
// box of a tensor into shared memory, the transaction barriers (mbarrier) that tell its readers when the bytes have
// landed, and setmaxnreg to move registers from loading warps to computing ones. The host side builds a tensor map
// (CUtensorMap) through the driver's cuTensorMapEncodeTiled, reached by cudaGetDriverEntryPointByVersion so that
// nothing links libcuda.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "kernels/attention_common.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// The barriers' initialization, visible to the other threads and to the async proxy (TMA's completions).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// An arrival that also expects `bytes` more of transactions (the TMA copies completing on this barrier).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// `bytes` more of transactions expected in the current phase, without an arrival.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
// Until the barrier's phase of this parity has completed (parity 0: its first phase, 1 the second, 0 the third...).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// A box of a 3-D tensor at coordinates (c0 innermost, c1, c2) into shared memory (dst aligned as the map's swizzle
// asks), completing `bar`'s transactions by its bytes. Coordinates past the tensor's extent read as zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The warpgroup's registers a thread: down to N (loading warps), up to N (computing warps). Every thread of the
// warpgroup executes it.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// cuTensorMapEncodeTiled, from the driver once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    FP8T_CHECK(fn && found == cudaDriverEntryPointSuccess,
               "tensor_map_encoder: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The tensor map of a 3-D tensor (d2, d1, d0) of `elem` bytes an element, row stride ld0 elements (>= d0) and plane
// stride ld1 elements, boxes of (1, box1, box0), out-of-range elements read as zeros.
inline CUtensorMap tensor_map_3d(const void* base, CUtensorMapDataType type, int elem, int64_t d0, int64_t d1,
                                 int64_t d2, int64_t ld0, int64_t ld1, int box0, int box1,
                                 CUtensorMapSwizzle swizzle) {
  FP8T_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0 && (ld0 * elem) % 16 == 0 && (ld1 * elem) % 16 == 0,
             "tensor_map_3d: a 16-byte aligned base and strides are needed");
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d1), static_cast<cuuint64_t>(d2)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld0 * elem), static_cast<cuuint64_t>(ld1 * elem)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box0), static_cast<cuuint32_t>(box1), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(&map, type, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  FP8T_CHECK(r == CUDA_SUCCESS, "tensor_map_3d: cuTensorMapEncodeTiled failed ({})", static_cast<int>(r));
  return map;
}

// A bf16 tensor's map with the 128-byte swizzle (box0 * 2 = 128 bytes).
inline CUtensorMap tensor_map_bf16_3d(const void* base, int64_t d0, int64_t d1, int64_t d2, int64_t ld0,
                                      int64_t ld1, int box0, int box1) {
  FP8T_CHECK(box0 * 2 == 128, "tensor_map_bf16_3d: a 128-byte box row is needed");
  return tensor_map_3d(base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, d0, d1, d2, ld0, ld1, box0, box1,
                       CU_TENSOR_MAP_SWIZZLE_128B);
}

// A byte tensor's map (FP8 codes), boxes unswizzled: box0 bytes a row, one row after the other.
inline CUtensorMap tensor_map_u8_3d(const void* base, int64_t d0, int64_t d1, int64_t d2, int64_t ld0, int64_t ld1,
                                    int box0, int box1) {
  return tensor_map_3d(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, d0, d1, d2, ld0, ld1, box0, box1,
                       CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace
}  // namespace fp8t::kernels
