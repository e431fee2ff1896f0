// The add op's kernel: a grid-stride loop over 16-byte vectors of bf16, then a scalar tail.
#include "kernels/add.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

// out[i] = a[i] + b[i]; each thread handles 8 elements per 16-byte vector; the tail is scalar.
__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, size_t n) {
  using V = Vec16<bf16>;
  const size_t nvec = n / V::size;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < nvec; i += stride) {
    const V va = V::load(a + i * V::size), vb = V::load(b + i * V::size);
    V vo;
#pragma unroll
    for (int k = 0; k < V::size; ++k)
      vo.v[k] = __float2bfloat16_rn(__bfloat162float(va.v[k]) + __bfloat162float(vb.v[k]));
    vo.store(out + i * V::size);
  }
  for (size_t i = nvec * V::size + blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// out[i] = a[i] + (b[i] + bias[i % C]) in f32, rounded once. C % 8 == 0, so a 16-byte vector is in one row.
__global__ void add_bias_kernel(bf16* out, const bf16* a, const bf16* b, const bf16* bias, size_t n, int C) {
  using V = Vec16<bf16>;
  const size_t nvec = n / V::size;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < nvec; i += stride) {
    const V va = V::load(a + i * V::size), vb = V::load(b + i * V::size);
    const V vc = V::load(bias + (i * V::size) % static_cast<size_t>(C));
    V vo;
#pragma unroll
    for (int k = 0; k < V::size; ++k)
      vo.v[k] = __float2bfloat16_rn(
          __fadd_rn(__bfloat162float(va.v[k]), __fadd_rn(__bfloat162float(vb.v[k]), __bfloat162float(vc.v[k]))));
    vo.store(out + i * V::size);
  }
}

// The same for any C, one element per thread step.
__global__ void add_bias_scalar_kernel(bf16* out, const bf16* a, const bf16* b, const bf16* bias, size_t n, int C) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16_rn(__fadd_rn(__bfloat162float(a[i]),
                                           __fadd_rn(__bfloat162float(b[i]), __bfloat162float(bias[i % C]))));
}

constexpr int kThreads = 256;
// Blocks for `threads` threads, capped: the grid-stride loops cover the rest.
int grid_for(size_t threads) { return static_cast<int>(std::min<size_t>((threads + kThreads - 1) / kThreads, 65536)); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void add_forward(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t stream, const bf16* b_bias, int C) {
  if (n == 0) return;
  FP8T_CHECK(aligned16(out) && aligned16(a) && aligned16(b), "add_forward: pointers must be 16-byte aligned");
  if (!b_bias) {
    add_kernel<<<grid_for(n / Vec16<bf16>::size + 1), kThreads, 0, stream>>>(out, a, b, n);
  } else {
    FP8T_CHECK(C > 0 && n % static_cast<size_t>(C) == 0, "add_forward: a bias of {} elements for {} elements", C, n);
    if (C % Vec16<bf16>::size == 0 && aligned16(b_bias))
      add_bias_kernel<<<grid_for(n / Vec16<bf16>::size), kThreads, 0, stream>>>(out, a, b, b_bias, n, C);
    else
      add_bias_scalar_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, a, b, b_bias, n, C);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
