// Sum of squares of an f32 or bf16 buffer, for global-norm gradient clipping without a host round trip.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace fp8t::kernels {

// *out += sum_i x[i]^2  (out is one device f32; zero it first, or accumulate several buffers/shards into it)
// (the bf16 values are squared and summed in f32)
void global_norm_squared(float* out, const float* x, size_t n, cudaStream_t stream);
void global_norm_squared(float* out, const __nv_bfloat16* x, size_t n, cudaStream_t stream);

}  // namespace fp8t::kernels
