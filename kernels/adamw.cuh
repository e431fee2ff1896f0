// AdamW over a range of the flat buffers: f32 master weights, f32 or bf16 gradients, moments in f32,
// bf16 or block-scaled E4M3 (m) with bf16 (v), optionally refreshing a bf16 compute copy.
#pragma once
#include <cuda_runtime.h>

#include "core/adamw_math.h"

namespace fp8t::kernels {

// One AdamW step over b.n elements of device buffers, bit for bit adamw_update_cpu (ops/cpu/adamw.h):
// per element adamw_element (core/adamw_math.h) with the weight decay of its segment, then m and v
// stored in b.state_dtype (bf16 rounded stochastically; fp8 m re-scaled per block of kMomentBlock from
// the block's new amax). b.segments must be a device array.
void adamw_update(const AdamWBuffers& b, const AdamWHyper& h, cudaStream_t stream);

}  // namespace fp8t::kernels
