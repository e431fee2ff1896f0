// CUDA entry points for the optimizer over raw ranges of the flat buffers (FP8T_HAVE_CUDA).
#pragma once
#include <cstdint>

#include "core/adamw_math.h"

namespace fp8t::cuda_ops {

// One AdamW step on the compute stream, bit for bit adamw_update_cpu (b holds device pointers).
void adamw(const AdamWBuffers& b, const AdamWHyper& h);

}  // namespace fp8t::cuda_ops
