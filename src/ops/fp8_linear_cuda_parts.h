// The pieces of the FP8 linear's CUDA path that its forward and backward stages (fp8_linear_cuda.cpp) share with
// its weight handling (fp8_weight_cuda.cpp: the per-version weight cache and the sharded-master publishing):
// device scale slots, the current-scaling amax pass, GEMM operands and per-tensor code buffers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "fp8/quantized_tensor.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/matmul.cuh"
#include "ops/fp8_linear.h"

namespace fp8t::detail {

// Role r's slot among a state's device slots (fp8/device_meta.h).
inline Fp8DeviceSlot* slot(Fp8DeviceSlot* slots, Fp8Role r) { return slots + static_cast<int>(r); }

// Scale-from-tensor recipes (current scaling): the amax of t (of what the cast reads: the prologue's values
// with those operands) and the scale from it, on the device, into the slot before the cast. Otherwise the
// slot already holds the step's scale.
void prepare_scale(const Fp8TensorMeta& meta, Fp8DeviceSlot* s, const Tensor& t, cudaStream_t stream,
                   kernels::Fp8CastInput input = kernels::Fp8CastInput::as_is, kernels::Fp8CastOperands ops = {});

// Where a cast records its statistics: the slot's amax and saturation count.
inline kernels::Fp8CastOutputs stats_into(Fp8DeviceSlot* s) { return {&s->amax, &s->saturated}; }

// q as a cuBLASLt operand: its codes (or, transposed, codes_t) and the device pointer to its scale_inv.
kernels::MatmulOperand operand(const QuantizedTensor& q, bool transposed);

// Per-tensor FP8 codes (rows, cols), optionally with their transposed copy, scaled by `scale_inv` (1 f32).
QuantizedTensor per_tensor_codes(int64_t rows, int64_t cols, DType dt, Device dev, bool row_major, bool transposed,
                                 MemCategory cat, MemCategory cat_t, Tensor scale_inv);

// The (OC, IC) and (IC, OC) FP8 copies of the weight w (its bf16 compute copy or f32 master) for st's
// weight_version, cast in one pass; nothing when they are current.
void cache_weight_cuda(Fp8LinearState& st, const Tensor& w, Fp8DeviceSlot* slots, cudaStream_t stream);

}  // namespace fp8t::detail
