// Sum of squares of an f32 buffer, for global-norm gradient clipping without a host round trip.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace fp8t::kernels {

// *out += sum_i x[i]^2  (out is one device f32; zero it first, or accumulate several buffers/shards into it)
void global_norm_squared(float* out, const float* x, size_t n, cudaStream_t stream);

}  // namespace fp8t::kernels
