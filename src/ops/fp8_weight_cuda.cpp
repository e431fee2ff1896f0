// The FP8 linear's weight handling on CUDA and the pieces its forward and backward share
// (ops/fp8_linear_cuda_parts.h): the weight's per-version FP8 cache, and the sharded-master side of
// Fp8LinearState (ops/fp8_linear_cuda.h): piece amaxes, the scale from a reduced amax, piece casts and the
// adopted codes' transposed copy.
#include <utility>

#include "core/check.h"
#include "core/cuda_check.h"
#include "core/graph_capture.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear_cuda.h"
#include "ops/fp8_linear_cuda_parts.h"

namespace fp8t::detail {

namespace k = kernels;

// Scale-from-tensor recipes (current scaling): the amax of t (of what the cast reads: the prologue's values
// with those operands) and the scale from it, on the device, into the slot before the cast. Otherwise the
// slot already holds the step's scale.
void prepare_scale(const Fp8TensorMeta& meta, Fp8DeviceSlot* s, const Tensor& t, cudaStream_t stream,
                   k::Fp8CastInput input, k::Fp8CastOperands ops) {
  if (!meta.recipe->scale_from_tensor()) return;
  CUDA_CHECK(cudaMemsetAsync(&s->amax_now, 0, sizeof(float), stream));
  k::fp8_amax(t.raw(), t.dtype(), t.numel(), &s->amax_now, stream, input, t.dim(-1), ops);
  k::fp8_scale_from_amax(&s->amax_now, meta.fmax(), meta.margin, &s->scale, &s->scale_inv, stream);
}

// q as a cuBLASLt operand: its codes (or, transposed, codes_t) and the device pointer to its scale_inv.
k::MatmulOperand operand(const QuantizedTensor& q, bool transposed) {
  const Tensor& c = transposed ? q.codes_t : q.codes;
  FP8T_CHECK(c.defined() && q.layout == ScaleLayout::per_tensor && q.scale_inv.device().is_cuda(),
             "fp8_linear: a GEMM operand needs {} per-tensor codes on the device, got a {} tensor{}",
             transposed ? "transposed" : "row-major", scale_layout_name(q.layout), c.defined() ? "" : " without them");
  return {c.raw(), c.dtype(), q.scale_inv.data<float>(), q.layout};
}

// Per-tensor FP8 codes (rows, cols), optionally with their transposed copy, scaled by `scale_inv` (1 f32).
QuantizedTensor per_tensor_codes(int64_t rows, int64_t cols, DType dt, Device dev, bool row_major, bool transposed,
                                 MemCategory cat, MemCategory cat_t, Tensor scale_inv) {
  QuantizedTensor q;
  q.shape = {rows, cols};
  if (row_major) q.codes = Tensor::empty({rows, cols}, dt, dev, cat);
  if (transposed) q.codes_t = Tensor::empty({cols, rows}, dt, dev, cat_t);
  q.scale_inv = std::move(scale_inv);
  return q;
}

// The (OC, IC) and (IC, OC) FP8 copies of the weight (its bf16 compute copy or f32 master) for this
// weight_version, cast in one pass.
void cache_weight_cuda(Fp8LinearState& st, const Tensor& w, Fp8DeviceSlot* slots, cudaStream_t stream) {
  if (st.cache_valid && st.cached_version == st.weight_version) return;
  const int64_t OC = w.dim(0), IC = w.dim(1);
  const DType dt = fp8_dtype(st.formats.forward);
  QuantizedTensor& q = st.weight_fp8;
  if (!q.codes.defined() || q.codes.shape() != w.shape() || q.codes.dtype() != dt)
    q = per_tensor_codes(OC, IC, dt, w.device(), true, true, MemCategory::fp8_cache, MemCategory::fp8_cache,
                         st.device.scales_view(Fp8Role::weight).slice_flat(0, {1}));
  Fp8DeviceSlot* s = slot(slots, Fp8Role::weight);
  prepare_scale(st.weight, s, w, stream);
  k::fp8_cast(w.raw(), w.dtype(), OC, IC, q.codes.data<uint8_t>(), q.codes_t.data<uint8_t>(), st.formats.forward,
              &s->scale, stats_into(s), stream);
  st.device.mark_pending(Fp8Role::weight);  // the step's weight amax, whatever the grad mode (as on the CPU)
  auto now_current = [&st] {
    st.cached_version = st.weight_version;
    st.cache_valid = true;
    ++st.weight_casts;
  };
  now_current();
  on_graph_replay(now_current);  // a replayed step casts the weight of its own version
}

// ---------------------------------------------------------------- sharded-master weights

void fp8_weight_piece_amax_cuda(const Tensor& piece, float* amax) {
  k::fp8_amax(piece.raw(), piece.dtype(), piece.numel(), amax, k::compute_stream());
}

void fp8_weight_scale_from_amax_cuda(Fp8LinearState& st, const Tensor& amax, int64_t index) {
  Fp8DeviceSlot* s = slot(st.device.slots(amax.device(), st.metas()), Fp8Role::weight);
  k::fp8_scale_from_amax(amax.data<float>() + index, st.weight.fmax(), st.weight.margin, &s->scale, &s->scale_inv,
                         k::compute_stream());
}

void fp8_cast_weight_piece_cuda(Fp8LinearState& st, const Tensor& piece, Tensor& codes) {
  Fp8DeviceSlot* s = slot(st.device.slots(piece.device(), st.metas()), Fp8Role::weight);
  if (piece.numel() > 0)
    k::fp8_cast(piece.raw(), piece.dtype(), 1, piece.numel(), codes.data<uint8_t>(), nullptr, st.formats.forward,
                &s->scale, stats_into(s), k::compute_stream());
  st.device.mark_pending(Fp8Role::weight);  // also with no piece: every rank records the weight's amax
}

void fp8_adopt_weight_codes_cuda(Fp8LinearState& st, const Tensor& codes) {
  const int64_t OC = codes.dim(0), IC = codes.dim(1);
  (void)st.device.slots(codes.device(), st.metas());
  QuantizedTensor& q = st.weight_fp8;
  if (!q.codes_t.defined() || q.codes_t.shape() != Shape{IC, OC} || q.codes_t.dtype() != codes.dtype())
    q = per_tensor_codes(OC, IC, codes.dtype(), codes.device(), false, true, MemCategory::fp8_cache,
                         MemCategory::fp8_cache, st.device.scales_view(Fp8Role::weight).slice_flat(0, {1}));
  q.codes = codes;
  k::fp8_transpose(codes.data<uint8_t>(), OC, IC, q.codes_t.data<uint8_t>(), k::compute_stream());
}

}  // namespace fp8t::detail
