// Sum of squares of f32 or bf16 values: a grid-stride pass with per-thread f32 partials, a block reduction,
// one atomic per block.
#include "kernels/cuda_common.cuh"
#include "kernels/global_norm.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

__device__ __forceinline__ float value(float x) { return x; }
__device__ __forceinline__ float value(bf16 x) { return __bfloat162float(x); }

template <class T>
__global__ void sum_squares_kernel(float* out, const T* x, size_t n) {
  __shared__ float scratch[32];
  float acc = 0.0f;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float xi = value(x[i]);
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
  const int grid = static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 132 * 4));
  sum_squares_kernel<<<grid, kThreads, 0, stream>>>(out, x, n);
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
