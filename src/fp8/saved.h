// FP8 storage of activations that ops save for backward (precision.fp8.activation_storage: fp8_all):
// the tensor is kept as E4M3 codes with a current scale per row (row = last dimension, e.g. one token's
// qkv or GELU input: scale = 448 / amax of that row), one byte per element instead of two (BF16) or four
// (CPU f32), plus 4 bytes per row.
//
// The op quantizes its input first and runs its forward pass on the round trip dequant(q(x)), so the
// forward and the backward pass see exactly the same values (for attention, the softmax recomputed in
// backward matches the forward's logsumexp). On CUDA one kernel reads each row once and writes the
// codes, the row's scale_inv and (fp8_save_inplace) the round trip over x itself (kernels/fp8_saved.cuh);
// the host path computes the same bits on f32 tensors.
#pragma once
#include "fp8/quantized_tensor.h"

namespace fp8t {

// The saved form is a QuantizedTensor (fp8/quantized_tensor.h) with layout per_row and E4M3 codes of x's
// shape; restoring it gives bf16 on CUDA, f32 on the CPU (what the ops compute in).
// Quantizes x (CUDA bf16 or CPU f32) row by row with scale = 448 / amax(row) (1 when the row's amax is
// zero or not finite, so the codes stay finite: fp8_scale_from_amax(amax, 448, 0, 1)), and returns the
// saved form; *roundtrip (if given) receives dequant(q(x)) in x's dtype, a new tensor.
QuantizedTensor fp8_save(const Tensor& x, Tensor* roundtrip);
// fp8_save that overwrites x's elements with dequant(q(x)) (no new tensor): every handle on x's storage
// sees the rounded values, so the caller must own x (no view of it, and no saved node that still reads
// it unrounded).
QuantizedTensor fp8_save_inplace(Tensor& x);
// The saved form's tensors for x (E4M3 codes of x's shape, an f32 scale_inv per row, on x's device), not yet
// written: for a kernel that writes them as fp8_save does while doing more in the same pass (the FP8 linear's
// save of pre fused with its GELU cast, kernels/fp8_saved.cuh).
QuantizedTensor fp8_saved_rows_empty(const Tensor& x);
// dequant(q(x)), a new tensor of category `cat` (dequantize(s, cat)).
Tensor fp8_restore(const QuantizedTensor& s, MemCategory cat = MemCategory::activations);

}  // namespace fp8t
