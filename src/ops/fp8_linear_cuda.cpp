// The CUDA path of the FP8 linear ops: the FP8 weight cache on the device, current-scaling amax passes, the
// fused casts, the fprop/dgrad/wgrad GEMMs and the backward node (declared in src/ops/fp8_linear_cuda.h).
#include "ops/fp8_linear_cuda.h"

#include <cuda_runtime.h>

#include <memory>
#include <utility>

#include "autograd/finite_watch.h"
#include "core/check.h"
#include "core/cuda_check.h"
#include "core/launch_limits.h"
#include "fp8/saved.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/cuda_ops.h"
#include "ops/grad_sink.h"
#include "ops/ops.h"

namespace fp8t::detail {
namespace {

namespace k = kernels;
using bf16 = __nv_bfloat16;

Fp8DeviceSlot* slot(Fp8DeviceSlot* slots, Fp8Role r) { return slots + static_cast<int>(r); }

// Current scaling: the amax of t (of what the cast reads: the prologue's values with those operands)
// and the scale from it, on the device, into the slot before the cast. Delayed scaling: the slot
// already holds the step's scale.
void prepare_scale(const Fp8TensorMeta& meta, Fp8DeviceSlot* s, const Tensor& t, cudaStream_t stream,
                   k::Fp8CastInput input = k::Fp8CastInput::as_is, k::Fp8CastOperands ln = {}) {
  if (meta.scaling != Fp8Scaling::current) return;
  CUDA_CHECK(cudaMemsetAsync(&s->amax_now, 0, sizeof(float), stream));
  k::fp8_amax(t.raw(), t.dtype(), t.numel(), &s->amax_now, stream, input, t.dim(-1), ln);
  k::fp8_scale_from_amax(&s->amax_now, meta.fmax(), meta.margin, &s->scale, &s->scale_inv, stream);
}

k::Fp8CastOutputs stats_into(Fp8DeviceSlot* s) { return {&s->amax, &s->saturated}; }

// The (OC, IC) and (IC, OC) FP8 copies of the bf16 weight for this weight_version, cast in one pass.
void cache_weight_cuda(Fp8LinearState& st, const Tensor& w, Fp8DeviceSlot* slots, cudaStream_t stream) {
  if (st.cache_valid && st.cached_version == st.weight_version) return;
  const int64_t OC = w.dim(0), IC = w.dim(1);
  const DType dt = fp8_dtype(st.formats.forward);
  if (!st.weight_fp8.codes.defined() || st.weight_fp8.codes.shape() != w.shape() || st.weight_fp8.codes.dtype() != dt) {
    st.weight_fp8.codes = Tensor::empty({OC, IC}, dt, w.device(), MemCategory::fp8_cache);
    st.weight_fp8_t = Tensor::empty({IC, OC}, dt, w.device(), MemCategory::fp8_cache);
  }
  Fp8DeviceSlot* s = slot(slots, Fp8Role::weight);
  prepare_scale(st.weight, s, w, stream);
  k::fp8_cast(w.raw(), w.dtype(), OC, IC, st.weight_fp8.codes.data<uint8_t>(), st.weight_fp8_t.data<uint8_t>(),
              st.formats.forward, &s->scale, stats_into(s), stream);
  st.device.mark_pending(Fp8Role::weight);  // the step's weight amax, whatever the grad mode (as on the CPU)
  st.weight_fp8.scale_inv = st.weight.scale_inv;  // host mirror; the GEMMs read the device slot
  st.cached_version = st.weight_version;
  st.cache_valid = true;
  ++st.weight_casts;
}

void expect_cuda(const Tensor& t, DType dtype, const char* what, const std::string& layer) {
  FP8T_CHECK(t.device().is_cuda() && t.dtype() == dtype, "fp8_linear ({}): {} must be a CUDA {} tensor, got {}", layer,
             what, dtype_name(dtype), t.str());
}

}  // namespace


Var fp8_linear_cuda(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, const InputPrologue& input,
                    bool serve_input) {
  const Tensor& wv = w->value;
  expect_cuda(x->value, DType::bf16, "x", st.name);
  // w: the bf16 compute copy, or the f32 master where the weight has no compute copy (nn/params.h).
  FP8T_CHECK(wv.device().is_cuda() && (wv.dtype() == DType::bf16 || wv.dtype() == DType::f32),
             "fp8_linear ({}): w must be a CUDA bf16 or f32 tensor, got {}", st.name, wv.str());
  if (b) expect_cuda(b->value, DType::bf16, "b", st.name);
  const int64_t IC = wv.dim(1), OC = wv.dim(0), M = x->value.numel() / IC;
  FP8T_CHECK(M % 16 == 0 && IC % 16 == 0 && OC % 16 == 0,
             "fp8_linear ({}): cuBLASLt FP8 GEMMs need rows (micro_batch * seq_len) = {}, in features = {} and out "
             "features = {} to be multiples of 16; change model.d_model / train.micro_batch / model.seq_len, or run "
             "this layer in bf16 (precision.fp8.layers, bf16_first_blocks, bf16_last_blocks)",
             st.name, M, IC, OC);
  // cuBLASLt and the LayerNorm statistics take M, IC and OC as int (the casts index in 64 bits).
  const std::string op = "fp8_linear (" + st.name + ")";
  checked_int(M, op.c_str(), "rows (micro_batch * seq_len)");
  checked_int(IC, op.c_str(), "in features");
  checked_int(OC, op.c_str(), "out features");
  const cudaStream_t stream = k::compute_stream();
  Fp8DeviceSlot* slots = st.device.slots(wv.device(), st.metas());
  cache_weight_cuda(st, wv, slots, stream);

  const bool gelu_input = input.kind == k::Fp8CastInput::gelu, ln_input = input.kind == k::Fp8CastInput::layernorm;
  if (ln_input) {
    expect_cuda(input.ln_w->value, DType::bf16, "the LayerNorm weight", st.name);
    expect_cuda(input.ln_b->value, DType::bf16, "the LayerNorm bias", st.name);
  }
  // x's gradient, or with a LayerNorm prologue also ln_w's or ln_b's: the LayerNorm backward.
  const bool in_needs_grad = needs_grad(x, input.ln_w, input.ln_b);
  const bool train = in_needs_grad || needs_grad(w, b);
  const bool store_fp8 = st.cfg.activation_storage != ActivationStorage::bf16;
  FP8T_CHECK(input.kind == k::Fp8CastInput::as_is || store_fp8,
             "fp8_linear ({}): a fused GELU or LayerNorm input needs FP8 activation storage", st.name);
  // gelu_input keeps the pre-activation x for the GELU backward: as x itself, or with fp8_all as FP8
  // codes, the forward then running on their round trip, written over x in place exactly as the gelu op
  // does (ops.h; a later reader of x sees it rounded). With delayed scaling the cast reads the codes
  // (saved_gelu: 1 byte per element instead of 2); current scaling's amax pass reads the bf16 round trip.
  const bool save_pre_fp8 = gelu_input && needs_grad(x) && st.cfg.activation_storage == ActivationStorage::fp8_all;
  const bool cast_from_codes = save_pre_fp8 && st.input.scaling == Fp8Scaling::delayed;
  Fp8Saved pre_saved;
  if (save_pre_fp8) pre_saved = fp8_save_inplace(x->value);
  const k::Fp8CastInput cast_input = cast_from_codes ? k::Fp8CastInput::saved_gelu : input.kind;
  const Tensor& xv = x->value;
  // wgrad needs x^T K-major: with fp8 storage the forward cast writes it alongside x. fp8_all with a
  // prologue whose operands backward keeps anyway (x, mean and rstd for LayerNorm's backward; pre's FP8
  // codes for GELU's) casts it again there instead, from the same values with the same scale.
  const bool recast_xt = st.cfg.activation_storage == ActivationStorage::fp8_all &&
                         ((ln_input && in_needs_grad) || save_pre_fp8);
  const bool keep_xt = train && w->requires_grad && store_fp8 && !recast_xt;
  FP8T_CHECK(!serve_input || input.kind == k::Fp8CastInput::as_is,
             "fp8_linear ({}): serve_input takes an input without a prologue", st.name);
  const DType fwd = fp8_dtype(st.formats.forward), bwd = fp8_dtype(st.formats.backward);
  const Tensor x2 = xv.view({M, IC});
  // layernorm_input: the (M) statistics the cast normalizes with, which the LayerNorm backward reads;
  // cast_from_codes: pre's saved codes, which the cast reads instead of x.
  Tensor ln_mean, ln_rstd;
  k::Fp8CastOperands cast_operands;
  if (ln_input) {
    const MemCategory cat = in_needs_grad ? MemCategory::activations : MemCategory::workspace;
    ln_mean = Tensor::empty({M}, DType::f32, xv.device(), cat);
    ln_rstd = Tensor::empty({M}, DType::f32, xv.device(), cat);
    k::layernorm_stats(ln_mean.data<float>(), ln_rstd.data<float>(), x2.data<bf16>(), M, static_cast<int>(IC),
                       stream);
    cast_operands = {ln_mean.data<float>(), ln_rstd.data<float>(), input.ln_w->value.data<bf16>(),
                     input.ln_b->value.data<bf16>()};
  }
  if (cast_from_codes) {
    cast_operands.pre_codes = pre_saved.codes.data<uint8_t>();
    cast_operands.row_scale_inv = pre_saved.row_scale_inv.data<float>();
  }
  Tensor xq = Tensor::empty({M, IC}, fwd, xv.device(), MemCategory::workspace);
  Tensor xq_t = keep_xt ? Tensor::empty({IC, M}, fwd, xv.device(), MemCategory::activations) : Tensor();
  Fp8DeviceSlot* sx = slot(slots, Fp8Role::input);
  prepare_scale(st.input, sx, x2, stream, cast_input, cast_operands);
  k::fp8_cast(x2.raw(), DType::bf16, M, IC, xq.data<uint8_t>(), keep_xt ? xq_t.data<uint8_t>() : nullptr,
              st.formats.forward, &sx->scale, grad_enabled() ? stats_into(sx) : k::Fp8CastOutputs{}, stream,
              cast_input, cast_operands);
  if (grad_enabled()) st.device.mark_pending(Fp8Role::input);
  // Backward needs this cast's (scale_inv, scale). Delayed scaling: the slot keeps them for the step.
  // Current scaling: the next cast overwrites the slot, so keep a copy.
  Tensor x_scales;
  if (train && st.input.scaling == Fp8Scaling::current) {
    x_scales = Tensor::empty({2}, DType::f32, xv.device(), MemCategory::activations);
    CUDA_CHECK(cudaMemcpyAsync(x_scales.raw(), &sx->scale_inv, 2 * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  }
  const float* x_scale_inv = x_scales.defined() ? x_scales.data<float>() : &sx->scale_inv;
  const float* x_scale = x_scales.defined() ? x_scales.data<float>() + 1 : &sx->scale;

  Shape oshape = xv.shape();
  oshape.back() = OC;
  Tensor out = Tensor::empty(oshape, DType::bf16, xv.device(), MemCategory::activations);
  k::matmul_fp8_forward(out.data<bf16>(), {xq.raw(), fwd, x_scale_inv},
                        {st.weight_fp8.codes.raw(), fwd, &slot(slots, Fp8Role::weight)->scale_inv},
                        b ? b->value.data<bf16>() : nullptr, static_cast<int>(M), static_cast<int>(IC),
                        static_cast<int>(OC), stream);
  xq = Tensor();  // back to the pool once the stream passes the GEMM

  Var y = make_var(std::move(out));
  if (!train) {
    watch_op(gelu_input ? "fp8_linear_gelu" : ln_input ? "fp8_linear_ln" : "fp8_linear", y,
             {&x, &w, &b, &input.ln_w, &input.ln_b});
    return y;
  }
  y->requires_grad = true;
  const bool x_needs_grad = in_needs_grad;  // with a LayerNorm prologue: x's, ln_w's or ln_b's
  // The backward below casts dy (for dgrad or wgrad) and can apply a pending GELU backward in that cast
  // (Fp8CastInput::dgelu): an FP8 linear with a GELU input that reads y leaves y's gradient so.
  y->grad_cell->takes_pending = x_needs_grad || w->requires_grad;
  const GradRef x_grad = grad_ref(x);  // the gradient only: x's value is not kept (but see ln_x_kept)
  Var x_kept = store_fp8 || !w->requires_grad ? Var() : x;  // bf16 storage: x is re-cast in backward
  // gelu_input: the pre-activation for the GELU backward (one of the two).
  Var pre_kept = gelu_input && x_needs_grad && !save_pre_fp8 ? x : Var();
  // ln_input: the LayerNorm backward's input (the residual stream, which the unfused LayerNorm keeps too).
  Var ln_x_kept = ln_input && x_needs_grad ? x : Var();
  InputPrologue prologue = ln_input && x_needs_grad ? input : InputPrologue{input.kind, {}, {}};
  if (!ln_x_kept) ln_mean = ln_rstd = Tensor();
  const char* node = gelu_input ? "fp8_linear_gelu" : ln_input ? "fp8_linear_ln" : "fp8_linear";
  current_tape()->record(node, [&st, x_grad, x_kept, pre_kept, pre_saved, prologue, ln_x_kept, ln_mean, ln_rstd,
                                xq_t, x_scales, x_scale, x_scale_inv, x_needs_grad, w, b, yg = grad_ref(y), M, IC,
                                OC, fwd, bwd, recast_xt] {
    const bool need_dx = x_needs_grad, need_dw = w->requires_grad;
    // dy is the output's gradient (its value is not kept), or with a pending GELU backward (left by the
    // FP8 linear with a GELU input that reads y) d gelu(y), which the dy cast turns into y's gradient
    // with the dgelu prologue: y's gradient is then never written. The bias-only path below has no cast
    // and writes it (grad_of).
    PendingGrad pending;
    if ((need_dx || need_dw) && yg.cell->pending.defined()) std::swap(pending, yg.cell->pending);
    const Tensor dy_full = pending.defined() ? pending.operand : grad_of(yg);
    expect_cuda(dy_full, DType::bf16, "the output gradient", st.name);
    const Tensor dy = dy_full.view({M, OC});
    // Delayed scaling reads a pending GELU input kept as per-row codes straight from them (saved_dgelu);
    // current scaling's amax pass reads its bf16 round trip.
    const bool pre_from_codes = pending.defined() && pending.input_codes.defined() &&
                                st.grad_output.scaling == Fp8Scaling::delayed;
    const Tensor dy_pre = pending.defined() && !pre_from_codes ? pending.input() : Tensor();  // (M, OC) gelu's input y
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
    Fp8DeviceSlot* slots = st.device.slots(dy.device(), st.metas());
    Fp8DeviceSlot* sdy = slot(slots, Fp8Role::grad_output);
    const int m = static_cast<int>(M), ic = static_cast<int>(IC), oc = static_cast<int>(OC);
    // Bias gradient (OC) += column sums of the unquantized dy, as Transformer Engine does (in f32: a bf16
    // gradient gets them through a temporary, ops/grad_sink.h).
    ops_detail::GradSink db_sink(b, DType::f32);
    float* db = db_sink.ptr<float>();
    if (need_dx || need_dw) {
      // dy (M, OC) for dgrad and dy^T (OC, M) for wgrad, in one pass that also adds dy's column sums
      // into db.
      Tensor dyq = need_dx ? Tensor::empty({M, OC}, bwd, dy.device(), MemCategory::workspace) : Tensor();
      Tensor dyq_t = need_dw ? Tensor::empty({OC, M}, bwd, dy.device(), MemCategory::workspace) : Tensor();
      prepare_scale(st.grad_output, sdy, dy, stream, dy_input, dy_ops);
      k::Fp8CastOutputs dy_stats = stats_into(sdy);
      dy_stats.colsum = db;
      k::fp8_cast(dy.raw(), DType::bf16, M, OC, need_dx ? dyq.data<uint8_t>() : nullptr,
                  need_dw ? dyq_t.data<uint8_t>() : nullptr, st.formats.backward, &sdy->scale, dy_stats, stream,
                  dy_input, dy_ops);
      st.device.mark_pending(Fp8Role::grad_output);
      if (need_dx && prologue.kind == k::Fp8CastInput::layernorm) {
        // The GEMM's output is d layernorm(x), written (beta 0) into a temporary as the unfused
        // LayerNorm output's gradient would be (same bits); then the LayerNorm backward adds into x's
        // gradient (zero-filled if new: it accumulates) and into ln_w's and ln_b's (f32).
        const Var& x_in = ln_x_kept;
        Tensor dh = Tensor::empty(x_grad.shape, DType::bf16, dy.device(), MemCategory::workspace);
        k::matmul_fp8_backward_input(dh.data<bf16>(), {dyq.raw(), bwd, &sdy->scale_inv},
                                     {st.weight_fp8_t.raw(), fwd, &slot(slots, Fp8Role::weight)->scale_inv}, m, ic,
                                     oc, /*accumulate=*/false, stream);
        const Tensor& x_value = value_of(x_in);  // grad_of zero-fills a new gradient
        Tensor dx = x_in->requires_grad
                        ? grad_of(x_in)
                        : Tensor::zeros(x_value.shape(), DType::bf16, x_value.device(), MemCategory::workspace);
        ops_detail::GradSink dlw(prologue.ln_w, DType::f32, /*scratch=*/true),
            dlb(prologue.ln_b, DType::f32, /*scratch=*/true);
        expect_cuda(dx, DType::bf16, "the input gradient", st.name);
        cuda_ops::layernorm_backward(dx, dlw.tensor(), dlb.tensor(), dh, x_value, prologue.ln_w->value, ln_mean,
                                     ln_rstd);
        dlw.commit();
        dlb.commit();
      } else if (need_dx && prologue.kind == k::Fp8CastInput::gelu && x_grad.cell->takes_pending &&
                 x_grad.dtype == DType::bf16 && !grad_exists(x_grad)) {
        // x's producer (an FP8 linear) applies the GELU backward in its own dy cast: the GEMM's output,
        // d gelu(x), becomes x's pending gradient, with x (or its FP8 round trip, restored there) for
        // gelu'(x). Whoever else reads x's gradient first gets exactly what the branch below writes.
        Tensor dh = Tensor::empty(x_grad.shape, DType::bf16, dy.device(), MemCategory::activations);
        k::matmul_fp8_backward_input(dh.data<bf16>(), {dyq.raw(), bwd, &sdy->scale_inv},
                                     {st.weight_fp8_t.raw(), fwd, &slot(slots, Fp8Role::weight)->scale_inv}, m, ic,
                                     oc, /*accumulate=*/false, stream);
        // The value, not the Var: x's gradient cell must not own x (a cycle if it were never consumed).
        const Tensor pre = pre_kept ? value_of(pre_kept) : Tensor();
        PendingGrad& p = x_grad.cell->pending;
        p.operand = std::move(dh);
        p.input = [pre, saved = pre_saved] { return pre.defined() ? pre : fp8_restore(saved, MemCategory::workspace); };
        if (!pre.defined()) {  // the codes themselves, for a producer that reads them directly
          p.input_codes = pre_saved.codes;
          p.input_row_scale_inv = pre_saved.row_scale_inv;
        }
        p.materialize = [](const Tensor& dgelu, const Tensor& gelu_in) {
          Tensor g = Tensor::empty(dgelu.shape(), DType::bf16, dgelu.device(), MemCategory::activations);
          g.zero_();
          cuda_ops::gelu_backward(g, gelu_in, dgelu);
          return g;
        };
      } else if (need_dx) {
        // A gradient that does not exist yet is written (beta 0), not zero-filled and added to.
        const bool accumulate = grad_exists(x_grad);
        if (!accumulate)
          x_grad.cell->grad = Tensor::empty(x_grad.shape, x_grad.dtype, x_grad.device, MemCategory::activations);
        Tensor& dx = x_grad.cell->grad;
        expect_cuda(dx, DType::bf16, "the input gradient", st.name);
        if (prologue.kind == k::Fp8CastInput::gelu) {
          // The GEMM's output is d gelu(x), written (beta 0) into a temporary as the unfused gelu
          // output's gradient would be (same bits); then dx += gelu'(x) * d gelu(x).
          if (!accumulate) dx.zero_();
          Tensor dh = Tensor::empty({M, IC}, DType::bf16, dy.device(), MemCategory::workspace);
          k::matmul_fp8_backward_input(dh.data<bf16>(), {dyq.raw(), bwd, &sdy->scale_inv},
                                       {st.weight_fp8_t.raw(), fwd, &slot(slots, Fp8Role::weight)->scale_inv}, m,
                                       ic, oc, /*accumulate=*/false, stream);
          const Tensor pre = pre_kept ? value_of(pre_kept) : fp8_restore(pre_saved, MemCategory::workspace);
          cuda_ops::gelu_backward(dx, pre, dh);
        } else {
          // dx (M, IC) (+)= dy (M, OC) @ w (OC, IC), with w^T (IC, OC) as the K-major operand
          k::matmul_fp8_backward_input(dx.data<bf16>(), {dyq.raw(), bwd, &sdy->scale_inv},
                                       {st.weight_fp8_t.raw(), fwd, &slot(slots, Fp8Role::weight)->scale_inv}, m,
                                       ic, oc, accumulate, stream);
        }
      }
      if (need_dw) {
        Tensor& dw = grad_of(w);
        FP8T_CHECK(dw.device().is_cuda() && (dw.dtype() == DType::f32 || dw.dtype() == DType::bf16),
                   "fp8_linear ({}): the weight gradient must be a CUDA f32 or bf16 tensor, got {}", st.name, dw.str());
        Tensor xt = xq_t;
        if (!xt.defined()) {  // bf16 storage or recast_xt: the forward's scale reproduces the forward's codes
          xt = Tensor::empty({IC, M}, fwd, dy.device(), MemCategory::workspace);
          if (recast_xt && prologue.kind == k::Fp8CastInput::layernorm) {
            const k::Fp8CastOperands ops{ln_mean.data<float>(), ln_rstd.data<float>(), prologue.ln_w->value.data<bf16>(),
                                         prologue.ln_b->value.data<bf16>()};
            k::fp8_cast(value_of(ln_x_kept).raw(), DType::bf16, M, IC, nullptr, xt.data<uint8_t>(),
                        st.formats.forward, x_scale, k::Fp8CastOutputs{}, stream, k::Fp8CastInput::layernorm, ops);
          } else if (recast_xt) {  // gelu of pre's FP8 round trip, read from its codes: what the forward's cast read
            k::Fp8CastOperands ops;
            ops.pre_codes = pre_saved.codes.data<uint8_t>();
            ops.row_scale_inv = pre_saved.row_scale_inv.data<float>();
            k::fp8_cast(nullptr, DType::bf16, M, IC, nullptr, xt.data<uint8_t>(), st.formats.forward, x_scale,
                        k::Fp8CastOutputs{}, stream, k::Fp8CastInput::saved_gelu, ops);
          } else {
            k::fp8_cast(value_of(x_kept).raw(), DType::bf16, M, IC, nullptr, xt.data<uint8_t>(), st.formats.forward,
                        x_scale, k::Fp8CastOutputs{}, stream);
          }
        }
        // dw (OC, IC) += dy^T (OC, M) @ x (M, IC), with dy^T and x^T as the K-major operands
        k::matmul_fp8_backward_weight(dw.raw(), dw.dtype(), {dyq_t.raw(), bwd, &sdy->scale_inv},
                                      {xt.raw(), fwd, x_scale_inv}, m, ic, oc, /*accumulate=*/true, stream);
      }
    } else if (db) {  // only the bias needs a gradient: no cast to ride on
      k::matmul_backward_bias(db, dy.data<bf16>(), m, oc, stream);
    }
    db_sink.commit();
    (void)x_scales;  // keeps the current-scaling copy of (scale, scale_inv) alive until here
  });
  if (serve_input && keep_xt) {  // x from x^T's codes, for x's other readers (fp8_linear.h)
    release_for_recompute(x, [xq_t, x_scales, x_scale_inv, fwd_format = st.formats.forward, shape = xv.shape(), M, IC] {
      Tensor v = Tensor::empty(shape, DType::bf16, xq_t.device(), MemCategory::workspace);
      k::fp8_dequantize_transposed(xq_t.data<uint8_t>(), fwd_format, IC, M, x_scale_inv, v.data<bf16>(),
                                   k::compute_stream());
      return v;
    });
  }
  watch_op(node, y, {&x, &w, &b, &input.ln_w, &input.ln_b});
  return y;
}

}  // namespace fp8t::detail
