// The backward stage of the FP8 linear's CUDA path (src/ops/fp8_linear_cuda.cpp has the forward stage and the
// overview): the output-gradient cast, then dgrad by the input's prologue, then wgrad.
#include <cuda_runtime.h>

#include <utility>

#include "core/check.h"
#include "core/cuda_check.h"
#include "core/launch_limits.h"
#include "fp8/saved.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_saved.cuh"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear_cuda_parts.h"
#include "ops/gelu_cuda.h"
#include "ops/grad_sink.h"
#include "ops/layernorm_cuda.h"
#include "ops/op_common.h"
#include "ops/ops.h"

namespace fp8t::detail {
namespace {

namespace k = kernels;
using bf16 = __nv_bfloat16;

// d(prologue output) = dy @ w, written (beta 0) into a new (M, IC) tensor of category `cat`.
Tensor dgrad_into_new(const Fp8LinearSaved& s, const QuantizedTensor& dyq, MemCategory cat, cudaStream_t stream) {
  Tensor dh = Tensor::empty(s.x_grad.shape, DType::bf16, dyq.device(), cat);
  k::matmul_fp8_backward_input(dh.data<bf16>(), operand(dyq, false), operand(s.st->weight_fp8, true),
                               static_cast<int>(s.M), static_cast<int>(s.IC), static_cast<int>(s.OC),
                               /*accumulate=*/false, stream, s.st->cfg.fast_accum_in("dgrad"));
  return dh;
}

// LayerNorm prologue: the GEMM's output is d layernorm(x), written as the unfused LayerNorm output's gradient
// would be (same bits); then the LayerNorm backward adds into x's gradient (zero-filled if new: it
// accumulates) and into ln_w's and ln_b's (f32).
void dgrad_layernorm(const Fp8LinearSaved& s, const QuantizedTensor& dyq, cudaStream_t stream) {
  const Tensor dh = dgrad_into_new(s, dyq, MemCategory::workspace, stream);
  const Tensor& x_value = value_of(s.ln_x);
  Tensor dx = s.ln_x->requires_grad
                  ? grad_of(s.ln_x)  // zero-fills a new gradient
                  : Tensor::zeros(x_value.shape(), DType::bf16, x_value.device(), MemCategory::workspace);
  ops_detail::GradSink dlw(s.prologue.ln_w, DType::f32, /*scratch=*/true),
      dlb(s.prologue.ln_b, DType::f32, /*scratch=*/true);
  expect_cuda(dx, DType::bf16, "the input gradient", s.st->name);
  // x = add(a, b) recorded just before this linear: x's gradient is final here, and b's, which b's producer (an FP8
  // linear) may take as its dy codes written by this pass (ln_residual).
  cuda_ops::layernorm_backward_residual(dx, dlw.tensor(), dlb.tensor(), dh, x_value, s.prologue.ln_w->value,
                                        s.ln_mean, s.ln_rstd, s.ln_residual);
  dlw.commit();
  dlb.commit();
}

// GELU prologue, x's producer an FP8 linear that applies the GELU backward in its own dy cast: the GEMM's
// output d gelu(x) becomes x's pending gradient, with x (or its FP8 round trip, restored there) for gelu'(x).
// Whoever else reads x's gradient first gets exactly what dgrad_gelu writes.
void dgrad_gelu_pending(const Fp8LinearSaved& s, const QuantizedTensor& dyq, cudaStream_t stream) {
  Tensor dh = dgrad_into_new(s, dyq, MemCategory::activations, stream);
  // The value, not the Var: x's gradient cell must not own x (a cycle if it were never consumed).
  const Tensor pre = s.pre_kept ? value_of(s.pre_kept) : Tensor();
  PendingGrad& p = s.x_grad.cell->pending;
  p.operand = std::move(dh);
  p.input = [pre, saved = s.pre_saved] { return pre.defined() ? pre : fp8_restore(saved, MemCategory::workspace); };
  if (!pre.defined()) {  // the codes themselves, for a producer that reads them directly
    p.input_codes = s.pre_saved.codes;
    p.input_row_scale_inv = s.pre_saved.scale_inv;
  }
  p.materialize = [](const Tensor& dgelu, const Tensor& gelu_in) {
    Tensor g = Tensor::empty(dgelu.shape(), DType::bf16, dgelu.device(), MemCategory::activations);
    g.zero_();
    cuda_ops::gelu_backward(g, gelu_in, dgelu);
    return g;
  };
}

// No prologue: dx (M, IC) (+)= dy (M, OC) @ w (OC, IC), w^T (IC, OC) the K-major operand; a gradient that
// does not exist yet is written (beta 0), not zero-filled and added to. GELU prologue (written here when no
// producer takes it pending): the GEMM writes d gelu(x) into a temporary as the unfused GELU output's gradient
// would be (same bits), then dx += gelu'(x) * d gelu(x).
void dgrad_into_x(const Fp8LinearSaved& s, const QuantizedTensor& dyq, cudaStream_t stream) {
  const GradRef& xg = s.x_grad;
  const bool accumulate = grad_exists(xg);
  if (!accumulate) xg.cell->grad = Tensor::empty(xg.shape, xg.dtype, xg.device, MemCategory::activations);
  Tensor& dx = xg.cell->grad;
  expect_cuda(dx, DType::bf16, "the input gradient", s.st->name);
  if (s.prologue.kind == k::Fp8CastInput::gelu) {
    if (!accumulate) dx.zero_();
    const Tensor dh = dgrad_into_new(s, dyq, MemCategory::workspace, stream);
    const Tensor pre = s.pre_kept ? value_of(s.pre_kept) : fp8_restore(s.pre_saved, MemCategory::workspace);
    cuda_ops::gelu_backward(dx, pre, dh);
    return;
  }
  k::matmul_fp8_backward_input(dx.data<bf16>(), operand(dyq, false), operand(s.st->weight_fp8, true),
                               static_cast<int>(s.M), static_cast<int>(s.IC), static_cast<int>(s.OC), accumulate,
                               stream, s.st->cfg.fast_accum_in("dgrad"));
}

// x^T's codes for wgrad: the forward's, or (bf16 storage, recast_xt) cast again from what the forward's cast
// read, with the forward's scale, which reproduces the forward's codes.
QuantizedTensor x_codes_t(const Fp8LinearSaved& s, cudaStream_t stream) {
  if (s.x_fp8.codes_t.defined()) return s.x_fp8;
  const Fp8LinearState& st = *s.st;
  // s.x_scale's device: a deferred wgrad's copy of s has no x_grad (PendingGrad::then).
  QuantizedTensor xt = per_tensor_codes(s.M, s.IC, fp8_dtype(st.formats.forward), s.x_scale.device(), false, true,
                                        MemCategory::workspace, MemCategory::workspace, s.x_fp8.scale_inv);
  uint8_t* out_t = xt.codes_t.data<uint8_t>();
  const float* scale = s.x_scale.data<float>();
  if (s.recast_xt && s.prologue.kind == k::Fp8CastInput::layernorm) {
    const k::Fp8CastOperands ops{s.ln_mean.data<float>(), s.ln_rstd.data<float>(), s.prologue.ln_w->value.data<bf16>(),
                                 s.prologue.ln_b->value.data<bf16>()};
    k::fp8_cast(value_of(s.ln_x).raw(), DType::bf16, s.M, s.IC, nullptr, out_t, st.formats.forward, scale,
                k::Fp8CastOutputs{}, stream, k::Fp8CastInput::layernorm, ops);
  } else if (s.recast_xt) {  // gelu of pre's FP8 round trip, read from its codes: what the forward's cast read
    k::Fp8CastOperands ops;
    ops.pre_codes = s.pre_saved.codes.data<uint8_t>();
    ops.row_scale_inv = s.pre_saved.scale_inv.data<float>();
    k::fp8_cast(nullptr, DType::bf16, s.M, s.IC, nullptr, out_t, st.formats.forward, scale, k::Fp8CastOutputs{},
                stream, k::Fp8CastInput::saved_gelu, ops);
  } else {
    k::fp8_cast(value_of(s.x_kept).raw(), DType::bf16, s.M, s.IC, nullptr, out_t, st.formats.forward, scale,
                k::Fp8CastOutputs{}, stream);
  }
  return xt;
}

// dw (OC, IC) += dy^T (OC, M) @ x (M, IC), with dy^T and x^T as the K-major operands (dyq's codes_t, xt's codes_t);
// a stale dw (GradCell::stale) is overwritten.
void wgrad(const Fp8LinearSaved& s, const QuantizedTensor& dyq, const QuantizedTensor& xt, cudaStream_t stream) {
  bool accumulate = true;
  Tensor dw = ops_detail::grad_for_write(s.w, accumulate);
  FP8T_CHECK(dw.device().is_cuda() && (dw.dtype() == DType::f32 || dw.dtype() == DType::bf16),
             "fp8_linear ({}): the weight gradient must be a CUDA f32 or bf16 tensor, got {}", s.st->name, dw.str());
  k::matmul_fp8_backward_weight(dw.raw(), dw.dtype(), operand(dyq, true), operand(xt, true), static_cast<int>(s.M),
                                static_cast<int>(s.IC), static_cast<int>(s.OC), accumulate, stream,
                                s.st->cfg.fast_accum_in("wgrad"));
}

// dgrad by the input's prologue, then wgrad, from dy's codes.
void dgrad_and_wgrad(const Fp8LinearSaved& s, const QuantizedTensor& dyq, cudaStream_t stream) {
  const bool need_dx = s.x_needs_grad, need_dw = s.w->requires_grad;
  const int64_t M = s.M;
  Fp8LinearState& st = *s.st;
  if (need_dx) {
    const GradRef& xg = s.x_grad;
    if (s.prologue.kind == k::Fp8CastInput::layernorm)
      dgrad_layernorm(s, dyq, stream);
    else if (s.prologue.kind == k::Fp8CastInput::gelu && xg.cell->takes_pending && xg.dtype == DType::bf16 &&
             !grad_exists(xg))
      dgrad_gelu_pending(s, dyq, stream);
    else
      dgrad_into_x(s, dyq, stream);
  }
  if (need_dw) {
    // fp8_all's fc2 whose dgrad left x's (the GELU input's) gradient pending with its codes: the wgrad waits for
    // x's producer, whose dy cast reads those codes and writes gelu(x)'s transposed codes, the wgrad's operand, in
    // the same pass (PendingGrad::then); else (written false) it casts them itself, as here below.
    PendingGrad& p = s.x_grad.cell->pending;
    if (s.recast_xt && s.prologue.kind == k::Fp8CastInput::gelu && need_dx && p.defined() &&
        p.input_codes.defined() && !p.then) {
      const QuantizedTensor xt = per_tensor_codes(M, s.IC, fp8_dtype(st.formats.forward), dyq.device(), false, true,
                                                  MemCategory::workspace, MemCategory::workspace, s.x_fp8.scale_inv);
      p.gelu_t = xt.codes_t;
      p.gelu_scale = s.x_scale;
      Fp8LinearSaved later = s;
      later.x_grad = GradRef{};  // the closure lives in x's gradient cell: no reference back to it
      QuantizedTensor dyq_t = dyq;
      dyq_t.codes = Tensor();  // dgrad is done: only the transposed codes wait
      p.then = [later = std::move(later), dyq_t = std::move(dyq_t), xt](bool written) {
        const cudaStream_t st_stream = k::compute_stream();
        wgrad(later, dyq_t, written ? xt : x_codes_t(later, st_stream), st_stream);
      };
    } else {
      wgrad(s, dyq, x_codes_t(s, stream), stream);
    }
  }
}

// dy as the op that computed it left it (PendingGrad::dy_codes, at this linear's Fp8DyRequest): already cast with
// this linear's scale; the statistics and column sums that cast would have added go where its own cast puts them.
QuantizedTensor take_cast_dy(const Fp8LinearSaved& s, const PendingGrad& p, float* db, cudaStream_t stream) {
  Fp8LinearState& st = *s.st;
  const int64_t M = s.M, OC = s.OC;
  const DType dt = fp8_dtype(st.formats.backward);
  const Tensor& any = p.dy_codes.defined() ? p.dy_codes : p.dy_codes_t;
  FP8T_CHECK((p.dy_codes.defined() || !s.x_needs_grad) && (p.dy_codes_t.defined() || !s.w->requires_grad) &&
                 (!p.dy_codes.defined() || (p.dy_codes.shape() == Shape{M, OC} && p.dy_codes.dtype() == dt)) &&
                 (!p.dy_codes_t.defined() || (p.dy_codes_t.shape() == Shape{OC, M} && p.dy_codes_t.dtype() == dt)) &&
                 p.dy_stats.numel() == kernels::cast_stats_floats(OC) && p.dy_stats.dtype() == DType::f32,
             "fp8_linear ({}): the output gradient left as codes ({}, {}, statistics {}) is not this backward's dy "
             "({} x {} {}, {} and {} needed)",
             st.name, p.dy_codes.defined() ? p.dy_codes.str() : "no codes",
             p.dy_codes_t.defined() ? p.dy_codes_t.str() : "no transposed codes", p.dy_stats.str(), M, OC,
             dtype_name(dt), s.x_needs_grad ? "codes" : "no codes", s.w->requires_grad ? "codes_t" : "no codes_t");
  Fp8DeviceSlot* sdy = slot(st.device.slots(any.device(), st.metas()), Fp8Role::grad_output);
  k::Fp8CastOutputs stats = stats_into(sdy);
  stats.colsum = db;
  k::fp8_add_cast_stats(p.dy_stats.data<float>(), OC, stats, stream);
  st.device.mark_pending(Fp8Role::grad_output);
  QuantizedTensor q = per_tensor_codes(M, OC, dt, any.device(), false, false, MemCategory::workspace,
                                       MemCategory::workspace,
                                       st.device.scales_view(Fp8Role::grad_output).slice_flat(0, {1}));
  q.codes = p.dy_codes;
  q.codes_t = p.dy_codes_t;
  return q;
}

}  // namespace

void backward_stage(const Fp8LinearSaved& s) {
  Fp8LinearState& st = *s.st;
  const bool need_dx = s.x_needs_grad, need_dw = s.w->requires_grad;
  // dy is the output's gradient (its value is not kept), or with a pending GELU backward (left by the FP8
  // linear with a GELU input that reads y) d gelu(y), which the dy cast turns into y's gradient with the dgelu
  // prologue: y's gradient is then never written. The bias-only path below has no cast and writes it.
  PendingGrad pending;
  if ((need_dx || need_dw) && s.yg.cell->pending.defined()) std::swap(pending, s.yg.cell->pending);
  if (pending.dy_codes.defined() || pending.dy_codes_t.defined()) {
    const cudaStream_t stream = k::compute_stream();
    ops_detail::GradSink db_sink(s.b, DType::f32);
    dgrad_and_wgrad(s, take_cast_dy(s, pending, db_sink.ptr<float>(), stream), stream);
    db_sink.commit();
    return;
  }
  const Tensor dy_full = pending.defined() ? pending.operand : grad_of(s.yg);
  expect_cuda(dy_full, DType::bf16, "the output gradient", st.name);
  const int64_t M = s.M, OC = s.OC;
  const Tensor dy = dy_full.view({M, OC});
  // A pending GELU input kept as per-row codes is read straight from them where the scale is known before the
  // cast (saved_dgelu); a scale-from-tensor recipe's amax pass reads its bf16 round trip.
  const bool pre_from_codes =
      pending.defined() && pending.input_codes.defined() && !st.grad_output.recipe->scale_from_tensor();
  const Tensor dy_pre = pending.defined() && !pre_from_codes ? pending.input() : Tensor();  // (M, OC) gelu's input
  k::Fp8CastOperands dy_ops;
  if (pre_from_codes) {
    FP8T_CHECK(pending.input_codes.numel() == M * OC && pending.input_row_scale_inv.numel() == M,
               "fp8_linear ({}): a pending GELU gradient's saved input has {} codes and {} row scales, not {} and {}",
               st.name, pending.input_codes.numel(), pending.input_row_scale_inv.numel(), M * OC, M);
    dy_ops.pre_codes = pending.input_codes.data<uint8_t>();
    dy_ops.row_scale_inv = pending.input_row_scale_inv.data<float>();
  }
  if (dy_pre.defined()) {
    expect_cuda(dy_pre, DType::bf16, "the GELU input of a pending gradient", st.name);
    FP8T_CHECK(dy_pre.numel() == M * OC, "fp8_linear ({}): a pending GELU gradient's input has {} elements, not {}",
               st.name, dy_pre.numel(), M * OC);
    dy_ops.pre = dy_pre.data<bf16>();
  }
  const k::Fp8CastInput dy_input = pre_from_codes    ? k::Fp8CastInput::saved_dgelu
                                   : dy_pre.defined() ? k::Fp8CastInput::dgelu
                                                      : k::Fp8CastInput::as_is;
  const cudaStream_t stream = k::compute_stream();
  Fp8DeviceSlot* sdy = slot(st.device.slots(dy.device(), st.metas()), Fp8Role::grad_output);
  // Bias gradient (OC) += column sums of the unquantized dy, as Transformer Engine does (in f32: a bf16
  // gradient gets them through a temporary, ops/grad_sink.h).
  ops_detail::GradSink db_sink(s.b, DType::f32);
  float* db = db_sink.ptr<float>();
  if (!need_dx && !need_dw) {
    if (db) k::matmul_backward_bias(db, dy.data<bf16>(), static_cast<int>(M), static_cast<int>(OC), stream);
    db_sink.commit();
    return;
  }
  // dy (M, OC) for dgrad and dy^T (OC, M) for wgrad, in one pass that also adds dy's column sums into db.
  const QuantizedTensor dyq = per_tensor_codes(M, OC, fp8_dtype(st.formats.backward), dy.device(), need_dx, need_dw,
                                               MemCategory::workspace, MemCategory::workspace,
                                               st.device.scales_view(Fp8Role::grad_output).slice_flat(0, {1}));
  prepare_scale(st.grad_output, sdy, dy, stream, dy_input, dy_ops);
  k::Fp8CastOutputs dy_stats = stats_into(sdy);
  dy_stats.colsum = db;
  uint8_t* out = need_dx ? dyq.codes.data<uint8_t>() : nullptr;
  uint8_t* out_t = need_dw ? dyq.codes_t.data<uint8_t>() : nullptr;
  // fp8_all's fc: the GELU input's codes also give fc2's deferred wgrad its operand, in the same pass.
  const bool pair = pre_from_codes && pending.then && pending.gelu_t.defined() &&
                    k::fp8_saved_gelu_pair_supported(dy.data<bf16>(), M, OC, out, out_t,
                                                     pending.gelu_t.data<uint8_t>(), dy_ops);
  if (pair)
    k::fp8_cast_saved_gelu_pair(dy.data<bf16>(), M, OC, out, out_t, pending.gelu_t.data<uint8_t>(),
                                st.formats.backward, &sdy->scale, pending.gelu_scale.data<float>(), dy_stats, dy_ops,
                                stream);
  else
    k::fp8_cast(dy.raw(), DType::bf16, M, OC, out, out_t, st.formats.backward, &sdy->scale, dy_stats, stream, dy_input,
                dy_ops);
  st.device.mark_pending(Fp8Role::grad_output);
  if (pending.then) pending.then(pair);
  dgrad_and_wgrad(s, dyq, stream);
  db_sink.commit();
}


}  // namespace fp8t::detail
