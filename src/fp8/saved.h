// FP8 storage of activations that ops save for backward (precision.fp8.activation_storage: fp8_all):
// the tensor is kept as E4M3 codes with a per-tensor current scale (amax of this very tensor), one
// byte per element instead of two (BF16) or four (CPU f32).
//
// The op quantizes its input first and runs its forward pass on the round trip dequant(q(x)), so the
// forward and the backward pass see exactly the same values (for attention, the softmax recomputed in
// backward matches the forward's logsumexp).
#pragma once
#include "core/tensor.h"

namespace fp8t {

struct Fp8Saved {
  Tensor codes;         // e4m3, x's shape, MemCategory::activations
  Tensor scales;        // f32 {amax, scale, scale_inv, unused} on x's device (CUDA: 16-byte aligned)
  DType dtype = DType::f32;  // what restore() returns: bf16 on CUDA, f32 on the CPU
  bool defined() const { return codes.defined(); }
};

// Quantizes x (CUDA bf16 or CPU f32) with scale = 448 / amax(x) (1 when the amax is zero or not
// finite, so the codes stay finite), and returns the saved form; *roundtrip (if given) receives
// dequant(q(x)) in x's dtype.
Fp8Saved fp8_save(const Tensor& x, Tensor* roundtrip);
// dequant(q(x)) in the saved dtype, a new tensor of category `cat`.
Tensor fp8_restore(const Fp8Saved& s, MemCategory cat = MemCategory::activations);

}  // namespace fp8t
