// The compute stream of the current device: every launch of a training step goes on it.
#pragma once
#include <cuda_runtime.h>

namespace fp8t::kernels {

// Created on first use per device; it synchronizes with the legacy default stream, so plain
// cudaMemset/cudaMemcpy issued by core/ stay ordered with the kernels.
cudaStream_t compute_stream();

}  // namespace fp8t::kernels
