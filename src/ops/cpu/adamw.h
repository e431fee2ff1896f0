// The CPU AdamW update over raw buffers (the reference kernels/adamw is tested against, bit for bit),
// the host computation of a step's scalars, and the fp8 first-moment block encoding.
#pragma once
#include <cstdint>

#include "config/config.h"
#include "core/adamw_math.h"

namespace fp8t {

// The scalars of AdamW step `step` (1-based: bias correction) with cfg's betas and eps.
AdamWHyper adamw_hyper(const OptimConfig& cfg, double lr, double grad_scale, int step);

// One AdamW step over host buffers: m and v in b.state_dtype, blocks of kMomentBlock from element 0.
void adamw_update_cpu(const AdamWBuffers& b, const AdamWHyper& h);

// The fp8 first-moment encoding of n values, blocks of kMomentBlock from m[0] (the last one may be
// shorter): scales[k] = amax of block k / 448 (0 for a block of zeros), codes = e4m3(m / scale),
// round to nearest even, saturating. A value of at most 2^-10 of its block's scale (about 2.2e-6 of the
// block's amax) becomes 0. dequantize gives e4m3 value * scale, the f32 product.
void quantize_moment_blocks(const float* m, int64_t n, uint8_t* codes, float* scales);
void dequantize_moment_blocks(const uint8_t* codes, const float* scales, int64_t n, float* m);
inline int64_t moment_blocks(int64_t n) { return (n + kMomentBlock - 1) / kMomentBlock; }

}  // namespace fp8t
