// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), 16-byte vectors. The
// per-value math is in gelu_math.cuh, shared with the FP8 cast's GELU prologue.
#include "kernels/cuda_common.cuh"
#include "kernels/gelu.cuh"
#include "kernels/gelu_math.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, size_t n) {
  using V = Vec16<bf16>;
  const size_t nvec = n / V::size, stride = size_t{gridDim.x} * blockDim.x;
  const size_t tid = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (size_t i = tid; i < nvec; i += stride) {
    const V x = V::load(inp + i * V::size);
    V y;
#pragma unroll
    for (int k = 0; k < V::size; ++k) y.v[k] = __float2bfloat16_rn(gelu(__bfloat162float(x.v[k])));
    y.store(out + i * V::size);
  }
  for (size_t i = nvec * V::size + tid; i < n; i += stride) out[i] = __float2bfloat16_rn(gelu(__bfloat162float(inp[i])));
}

__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, size_t n) {
  using V = Vec16<bf16>;
  const size_t nvec = n / V::size, stride = size_t{gridDim.x} * blockDim.x;
  const size_t tid = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (size_t i = tid; i < nvec; i += stride) {
    const V x = V::load(inp + i * V::size), d = V::load(dout + i * V::size), acc = V::load(dinp + i * V::size);
    V y;
#pragma unroll
    for (int k = 0; k < V::size; ++k)
      y.v[k] = __float2bfloat16_rn(
          gelu_backward_value(__bfloat162float(acc.v[k]), __bfloat162float(x.v[k]), __bfloat162float(d.v[k])));
    y.store(dinp + i * V::size);
  }
  for (size_t i = nvec * V::size + tid; i < n; i += stride)
    dinp[i] = __float2bfloat16_rn(
        gelu_backward_value(__bfloat162float(dinp[i]), __bfloat162float(inp[i]), __bfloat162float(dout[i])));
}

constexpr int kThreads = 256;
int grid_for(size_t n) {
  return static_cast<int>(std::clamp<size_t>((n / 8 + kThreads - 1) / kThreads, 1, 65536));
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  FP8T_CHECK(aligned16(out) && aligned16(inp), "gelu_forward: pointers must be 16-byte aligned");
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, inp, n);
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  FP8T_CHECK(aligned16(dinp) && aligned16(inp) && aligned16(dout), "gelu_backward: pointers must be 16-byte aligned");
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dinp, inp, dout, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
