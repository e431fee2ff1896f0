// The add op's kernel: a grid-stride loop over 16-byte vectors of bf16, then a scalar tail.
#include "kernels/add.cuh"
#include "kernels/cuda_common.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

// One element of out: a + b, or with kBias a + (b + bias), summed in f32 and rounded once to bf16. The bias sum's
// order is the one add_layernorm.cu keeps too (layernorm.cuh), so the fused and unfused paths agree bit for bit.
template <bool kBias>
__device__ __forceinline__ bf16 add_one(bf16 a, bf16 b, bf16 bias) {
  if constexpr (kBias)
    return __float2bfloat16_rn(__fadd_rn(__bfloat162float(a), __fadd_rn(__bfloat162float(b), __bfloat162float(bias))));
  else
    return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
}

// out = a + b (+ bias[i % C] with kBias) over n elements in grid-stride loops. With kVectors a thread step takes a
// 16-byte vector of 8 elements and the scalar loop takes the tail; a bias then needs C % 8 == 0, so that a vector stays
// in one row, and a 16-byte-aligned bias. Without kVectors the scalar loop takes all n elements, for any C and bias.
template <bool kBias, bool kVectors>
__global__ void add_kernel(bf16* out, const bf16* a, const bf16* b, const bf16* bias, size_t n, int C) {
  using V = Vec16<bf16>;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t nvec = 0;  // 16-byte vectors the first loop takes; the scalar loop takes the elements after them
  if constexpr (kVectors) {
    nvec = n / V::size;
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < nvec; i += stride) {
      const V va = V::load(a + i * V::size), vb = V::load(b + i * V::size);
      V vc{};
      if constexpr (kBias) vc = V::load(bias + (i * V::size) % static_cast<size_t>(C));
      V vo;
#pragma unroll
      for (int k = 0; k < V::size; ++k) vo.v[k] = add_one<kBias>(va.v[k], vb.v[k], vc.v[k]);
      vo.store(out + i * V::size);
    }
  }
  for (size_t i = nvec * V::size + blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    out[i] = add_one<kBias>(a[i], b[i], kBias ? bias[i % static_cast<size_t>(C)] : bf16{});
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
    add_kernel<false, true><<<grid_for(n / Vec16<bf16>::size + 1), kThreads, 0, stream>>>(out, a, b, nullptr, n, 0);
  } else {
    FP8T_CHECK(C > 0 && n % static_cast<size_t>(C) == 0, "add_forward: a bias of {} elements for {} elements", C, n);
    if (C % Vec16<bf16>::size == 0 && aligned16(b_bias))
      add_kernel<true, true><<<grid_for(n / Vec16<bf16>::size), kThreads, 0, stream>>>(out, a, b, b_bias, n, C);
    else
      add_kernel<true, false><<<grid_for(n), kThreads, 0, stream>>>(out, a, b, b_bias, n, C);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
