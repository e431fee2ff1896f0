// Sum of squares of f32 or bf16 values: a grid-stride pass of 16-byte loads with per-thread f32 partials, a block
// reduction, one atomic per block.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/global_norm.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

__device__ __forceinline__ float value(float x) { return x; }
__device__ __forceinline__ float value(bf16 x) { return __bfloat162float(x); }

// x[0, head) (up to the first 16-byte boundary) and the tail past the last whole 16-byte vector go one element per
// thread; the rest 16 bytes per load with four loads in flight per thread. (With one 2-byte load per thread the bf16
// gradient's 3.1 GB at GPT-2 1.5B took 2.3 ms, 1.35 TB/s: the twenty-second session's timeline.)
template <class T>
__global__ void sum_squares_kernel(float* out, const T* x, size_t n, size_t head) {
  __shared__ float scratch[32];
  constexpr int kPer = Vec16<T>::size, kLoads = 4;
  const size_t tid = blockIdx.x * size_t{blockDim.x} + threadIdx.x, stride = size_t{gridDim.x} * blockDim.x;
  const size_t vecs = (n - head) / kPer, tail = head + vecs * kPer;
  const T* body = x + head;
  float acc = 0.0f;
  auto add = [&](const Vec16<T>& q) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const float xi = value(q.v[k]);
      acc += xi * xi;
    }
  };
  size_t i = tid;
  for (; i + (kLoads - 1) * stride < vecs; i += kLoads * stride) {
    Vec16<T> q[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) q[j] = Vec16<T>::load(body + (i + j * stride) * kPer);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) add(q[j]);
  }
  for (; i < vecs; i += stride) add(Vec16<T>::load(body + i * kPer));
  for (size_t k = tid; k < head + (n - tail); k += stride) {
    const float xi = value(x[k < head ? k : tail + (k - head)]);
    acc += xi * xi;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

namespace {
template <class T>
void launch_sum_squares(float* out, const T* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kThreads = 512;
  // Elements before the first 16-byte boundary (x is aligned to its element, so this is exact).
  const size_t misaligned = reinterpret_cast<uintptr_t>(x) % 16;
  const size_t head = std::min(n, misaligned ? (16 - misaligned) / sizeof(T) : 0);
  const size_t work = (n + Vec16<T>::size - 1) / Vec16<T>::size;  // one thread per 16 bytes, up to 4 blocks per SM
  const int grid = static_cast<int>(std::min<size_t>((work + kThreads - 1) / kThreads, size_t{4} * sm_count()));
  sum_squares_kernel<<<grid, kThreads, 0, stream>>>(out, x, n, head);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void global_norm_squared(float* out, const float* x, size_t n, cudaStream_t stream) {
  launch_sum_squares(out, x, n, stream);
}
void global_norm_squared(float* out, const bf16* x, size_t n, cudaStream_t stream) {
  launch_sum_squares(out, x, n, stream);
}

}  // namespace fp8t::kernels
