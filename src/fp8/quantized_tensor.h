// The one FP8 tensor type: codes, an optional transposed copy of the same cast, and the scales with
// their layout. GEMM operands (per-tensor scales from a recipe's device slot), the cached FP8 weights
// and the activations saved for backward (per-row scales, fp8/saved.h) are all QuantizedTensors, and so
// will be block-scaled operands (1x128 activation tiles, 128x128 weight tiles, as in DeepSeek-V3).
//
// dequant(codes[r, c]) = decode(codes[r, c]) * scale_inv[block of (r, c)], where the block of (r, c) is
//   per_tensor     the one scale             scale_inv shape (1)
//   per_row        row r                     (rows)
//   block_1x128    (r, c / 128)              (rows, ceil(cols / 128))
//   block_128x128  (r / 128, c / 128)        (ceil(rows / 128), ceil(cols / 128))
// with rows the product of the leading dimensions and cols the last one. The layout is part of the
// tensor, so a reader never guesses it: dequantize() and the GEMM plans branch on it.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace fp8t {

const char* scale_layout_name(ScaleLayout layout);
// The shape of scale_inv for (rows, cols) codes in `layout` (see above).
Shape scale_shape(ScaleLayout layout, int64_t rows, int64_t cols);

struct QuantizedTensor {
  Tensor codes;      // (..., cols) e4m3 or e5m2; may be undefined when only codes_t is kept
  Tensor codes_t;    // (cols, rows): the same cast transposed (Hopper FP8 GEMMs take K-major operands), or undefined
  Tensor scale_inv;  // f32, scale_shape(layout, rows, cols), on the codes' device (a view of a device slot for
                     // per-tensor GEMM operands, fp8/device_meta.h)
  ScaleLayout layout = ScaleLayout::per_tensor;
  Shape shape;       // the logical (untransposed) shape of the tensor

  bool defined() const { return codes.defined() || codes_t.defined(); }
  const Tensor& any_codes() const { return codes.defined() ? codes : codes_t; }
  Fp8Format format() const { return fp8_format_of(any_codes().dtype()); }
  Device device() const { return any_codes().device(); }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const { return cols() == 0 ? 0 : shape_numel(shape) / cols(); }
  // The per-tensor scale_inv as a host float (copied from the device where it lives there).
  float tensor_scale_inv() const;
};

// Host f32 x -> codes in `layout`: per_tensor casts with the given `scale`; the other layouts take a current
// scale per row or block, fmax / amax of that block (1 where the amax is zero or not finite, so the codes stay
// finite), and ignore `scale`. *stats (if given) receives the amax of x and the saturation count.
struct Fp8CastStats;
QuantizedTensor quantize(const Tensor& x, ScaleLayout layout, Fp8Format f, float scale, MemCategory cat,
                         Fp8CastStats* stats = nullptr);
// The values an FP8 GEMM multiplies: decoded codes without any scale (host f32; per_tensor only, whose scale
// the GEMM applies afterwards).
Tensor decode(const QuantizedTensor& q, MemCategory cat = MemCategory::workspace);
// dequant(q) in q's logical shape: host f32 on the CPU; bf16 on CUDA (rounded to nearest even), from codes
// or, where only they are kept, from codes_t.
Tensor dequantize(const QuantizedTensor& q, MemCategory cat = MemCategory::workspace);

}  // namespace fp8t
