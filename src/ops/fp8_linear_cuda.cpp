// The CUDA path of the FP8 linear ops (declared in src/ops/fp8_linear_cuda.h), in stages: the forward stage (the
// FP8 weight cache of fp8_weight_cuda.cpp, the input cast with its prologue, the fprop GEMM, and what backward
// keeps, as an Fp8LinearSaved); the backward stage (the output-gradient cast, then dgrad by prologue, then wgrad).
// Every FP8 operand is a QuantizedTensor (fp8/quantized_tensor.h); the recipe (fp8/recipe.h) says whether a
// cast needs an amax pass first and whether the scale must be kept for backward.
#include "ops/fp8_linear_cuda.h"

#include <cuda_runtime.h>

#include <utility>

#include "autograd/finite_watch.h"
#include "core/check.h"
#include "core/cuda_check.h"
#include "core/launch_limits.h"
#include "fp8/saved.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_saved.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear_cuda_parts.h"
#include "ops/gelu_cuda.h"
#include "ops/grad_sink.h"
#include "ops/layernorm_cuda.h"
#include "ops/ops.h"

namespace fp8t::detail {
namespace {

namespace k = kernels;
using bf16 = __nv_bfloat16;

void expect_cuda(const Tensor& t, DType dtype, const char* what, const std::string& layer) {
  FP8T_CHECK(t.device().is_cuda() && t.dtype() == dtype, "fp8_linear ({}): {} must be a CUDA {} tensor, got {}", layer,
             what, dtype_name(dtype), t.str());
}

// What the backward stage reads, kept by the forward stage.
struct Fp8LinearSaved {
  Fp8LinearState* st = nullptr;
  GradRef x_grad;            // x's gradient only: x's value is not kept (but see x_kept, ln_x)
  bool x_needs_grad = false;  // with a LayerNorm prologue: x's, ln_w's or ln_b's
  Var w, b;
  GradRef yg;
  int64_t M = 0, IC = 0, OC = 0;
  InputPrologue prologue;     // its LayerNorm weight and bias only when x needs a gradient
  // x's codes for wgrad: codes_t (IC, M) when the forward kept them; always scale_inv, the forward's. x_scale
  // is the forward's scale (1 f32 on the device) for a re-cast from the inputs below.
  QuantizedTensor x_fp8;
  Tensor x_scale;
  bool recast_xt = false;     // fp8_all with a prologue whose operands backward keeps anyway: re-cast x^T
  Var x_kept;                 // bf16 storage: x, re-cast in backward
  Var pre_kept;               // GELU prologue: the pre-activation x for the GELU backward, or
  QuantizedTensor pre_saved;  //   with fp8_all its per-row codes
  Var ln_x;                   // LayerNorm prologue: the LayerNorm backward's input x, and its statistics
  Tensor ln_mean, ln_rstd;
};

// ---------------------------------------------------------------- backward stage

// d(prologue output) = dy @ w, written (beta 0) into a new (M, IC) tensor of category `cat`.
Tensor dgrad_into_new(const Fp8LinearSaved& s, const QuantizedTensor& dyq, MemCategory cat, cudaStream_t stream) {
  Tensor dh = Tensor::empty(s.x_grad.shape, DType::bf16, dyq.device(), cat);
  k::matmul_fp8_backward_input(dh.data<bf16>(), operand(dyq, false), operand(s.st->weight_fp8, true),
                               static_cast<int>(s.M), static_cast<int>(s.IC), static_cast<int>(s.OC),
                               /*accumulate=*/false, stream);
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
  cuda_ops::layernorm_backward(dx, dlw.tensor(), dlb.tensor(), dh, x_value, s.prologue.ln_w->value, s.ln_mean,
                               s.ln_rstd);
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
                               stream);
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

// dw (OC, IC) += dy^T (OC, M) @ x (M, IC), with dy^T and x^T as the K-major operands (dyq's codes_t, xt's codes_t).
void wgrad(const Fp8LinearSaved& s, const QuantizedTensor& dyq, const QuantizedTensor& xt, cudaStream_t stream) {
  Tensor& dw = grad_of(s.w);
  FP8T_CHECK(dw.device().is_cuda() && (dw.dtype() == DType::f32 || dw.dtype() == DType::bf16),
             "fp8_linear ({}): the weight gradient must be a CUDA f32 or bf16 tensor, got {}", s.st->name, dw.str());
  k::matmul_fp8_backward_weight(dw.raw(), dw.dtype(), operand(dyq, true), operand(xt, true), static_cast<int>(s.M),
                                static_cast<int>(s.IC), static_cast<int>(s.OC), /*accumulate=*/true, stream);
}

void backward_stage(const Fp8LinearSaved& s) {
  Fp8LinearState& st = *s.st;
  const bool need_dx = s.x_needs_grad, need_dw = s.w->requires_grad;
  // dy is the output's gradient (its value is not kept), or with a pending GELU backward (left by the FP8
  // linear with a GELU input that reads y) d gelu(y), which the dy cast turns into y's gradient with the dgelu
  // prologue: y's gradient is then never written. The bias-only path below has no cast and writes it.
  PendingGrad pending;
  if ((need_dx || need_dw) && s.yg.cell->pending.defined()) std::swap(pending, s.yg.cell->pending);
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
      const QuantizedTensor xt = per_tensor_codes(M, s.IC, fp8_dtype(st.formats.forward), dy.device(), false, true,
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
  db_sink.commit();
}

}  // namespace

// ---------------------------------------------------------------- forward stage

void add_ln_cast_ahead_cuda(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                            Fp8LnCastAhead& ahead) {
  FP8T_CHECK(ahead.st && ahead.ln_w && ahead.ln_b, "add: a cast ahead without its linear or LayerNorm parameters");
  Fp8LinearState& st = *ahead.st;
  const char* op = "add (with the FP8 LayerNorm cast ahead)";
  expect_cuda(a, DType::bf16, "a", st.name);
  expect_cuda(b, DType::bf16, "b", st.name);
  expect_cuda(out, DType::bf16, "out", st.name);
  expect_cuda(ahead.ln_w->value, DType::bf16, "the LayerNorm weight", st.name);
  expect_cuda(ahead.ln_b->value, DType::bf16, "the LayerNorm bias", st.name);
  const int64_t C = out.dim(-1), N = out.numel() / C;
  FP8T_CHECK(a.numel() == out.numel() && b.numel() == out.numel() && mean.numel() == N && rstd.numel() == N &&
                 ahead.ln_w->value.numel() == C && ahead.ln_b->value.numel() == C && out.raw() != a.raw() &&
                 out.raw() != b.raw(),
             "{} ({}): sizes out {}, a {}, b {}, mean {}, rstd {}, LayerNorm {} and {} do not match (or out aliases "
             "an input)", op, st.name, out.str(), a.str(), b.str(), mean.str(), rstd.str(), ahead.ln_w->value.str(),
             ahead.ln_b->value.str());
  const cudaStream_t stream = k::compute_stream();
  Fp8DeviceSlot* sx = slot(st.device.slots(out.device(), st.metas()), Fp8Role::input);
  Tensor codes = Tensor::empty({N, C}, fp8_dtype(st.formats.forward), out.device(), MemCategory::workspace);
  k::add_layernorm_cast(out.data<bf16>(), mean.data<float>(), rstd.data<float>(), codes.data<uint8_t>(),
                        a.data<bf16>(), b.data<bf16>(), ahead.ln_w->value.data<bf16>(), ahead.ln_b->value.data<bf16>(),
                        N, checked_int(C, op, "C"), st.formats.forward, &sx->scale,
                        grad_enabled() ? stats_into(sx) : k::Fp8CastOutputs{}, stream);
  ahead.codes = std::move(codes);
}

Var fp8_linear_cuda(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, const InputPrologue& input,
                    bool serve_input) {
  const Tensor& wv = w->value;
  expect_cuda(x->value, DType::bf16, "x", st.name);
  // w: the bf16 compute copy, or the f32 master where the weight has no compute copy (nn/params.h).
  // or, with a sharded master, this version's adopted codes (fp8_adopt_weight_codes_cuda).
  FP8T_CHECK(wv.device().is_cuda() && (wv.dtype() == DType::bf16 || wv.dtype() == DType::f32 ||
                                       wv.dtype() == fp8_dtype(st.formats.forward)),
             "fp8_linear ({}): w must be a CUDA bf16 or f32 tensor, got {}", st.name, wv.str());
  st.check_codes_adopted(wv);
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
  const bool fp8_all = st.cfg.activation_storage == ActivationStorage::fp8_all;
  FP8T_CHECK(input.kind == k::Fp8CastInput::as_is || store_fp8,
             "fp8_linear ({}): a fused GELU or LayerNorm input needs FP8 activation storage", st.name);
  FP8T_CHECK(!serve_input || input.kind == k::Fp8CastInput::as_is,
             "fp8_linear ({}): serve_input takes an input without a prologue", st.name);
  // gelu_input keeps the pre-activation x for the GELU backward: as x itself, or with fp8_all as FP8
  // codes, the forward then running on their round trip, written over x in place exactly as the gelu op
  // does (ops.h; a later reader of x sees it rounded). Where the scale is known before the cast, the cast
  // reads the codes (saved_gelu: 1 byte per element instead of 2), and with no later reader of x
  // (input.last_reader) the round trip is not written; a scale-from-tensor recipe's amax pass reads it.
  // With no later reader and the scale known, one kernel saves pre and casts GELU of the codes it wrote
  // (fp8_save_rows_gelu_cast: the same codes, without reading them back).
  const bool save_pre_fp8 = gelu_input && needs_grad(x) && fp8_all;
  const bool cast_from_codes = save_pre_fp8 && !st.input.recipe->scale_from_tensor();
  const bool save_with_cast = cast_from_codes && input.last_reader;
  QuantizedTensor pre_saved;
  if (save_with_cast) pre_saved = fp8_saved_rows_empty(x->value);
  else if (save_pre_fp8) pre_saved = fp8_save_inplace(x->value);
  const k::Fp8CastInput cast_input = cast_from_codes ? k::Fp8CastInput::saved_gelu : input.kind;
  const Tensor& xv = x->value;
  // wgrad needs x^T K-major: with fp8 storage the forward cast writes it alongside x. fp8_all with a
  // prologue whose operands backward keeps anyway (x, mean and rstd for LayerNorm's backward; pre's FP8
  // codes for GELU's) casts it again there instead, from the same values with the same scale.
  const bool recast_xt = fp8_all && ((ln_input && in_needs_grad) || save_pre_fp8);
  const bool keep_xt = train && w->requires_grad && store_fp8 && !recast_xt;
  const Tensor x2 = xv.view({M, IC});
  // The codes the residual add that wrote x cast ahead for this linear (fp8_ln_cast_ahead): the same cast as below,
  // already done. The add casts only where this linear keeps no transposed codes (x needs a gradient, or none is
  // recorded) and for a scale known before the cast.
  Tensor codes_ahead;
  if (ln_input && input.ln_stats.cast_ahead && input.ln_stats.cast_ahead->codes.defined()) {
    Fp8LnCastAhead& ahead = *input.ln_stats.cast_ahead;
    FP8T_CHECK(ahead.st == &st && ahead.ln_w == input.ln_w && ahead.ln_b == input.ln_b && !keep_xt &&
                   !st.input.recipe->scale_from_tensor() && ahead.codes.numel() == M * IC &&
                   ahead.codes.dtype() == fp8_dtype(st.formats.forward) && ahead.codes.device() == xv.device(),
               "fp8_linear ({}): the input codes cast ahead by the residual add are for another linear or cast "
               "(codes {}; keep_xt {})", st.name, ahead.codes.str(), keep_xt);
    codes_ahead = std::move(ahead.codes);
  }
  // layernorm_input: the (M) statistics the cast normalizes with, which the LayerNorm backward reads;
  // cast_from_codes: pre's saved codes, which the cast reads instead of x.
  Tensor ln_mean, ln_rstd;
  k::Fp8CastOperands cast_operands;
  if (ln_input) {
    const MemCategory cat = in_needs_grad ? MemCategory::activations : MemCategory::workspace;
    if (input.ln_stats.defined()) {
      const RowStats& given = input.ln_stats;
      FP8T_CHECK(given.mean.numel() == M && given.rstd.numel() == M && given.mean.dtype() == DType::f32 &&
                     given.rstd.dtype() == DType::f32 && given.mean.device() == xv.device() &&
                     given.rstd.device() == xv.device(),
                 "fp8_linear ({}): x's given LayerNorm statistics must be {} f32 values each on {}, got {} and {}",
                 st.name, M, xv.device().str(), given.mean.str(), given.rstd.str());
      ln_mean = given.mean.view({M});
      ln_rstd = given.rstd.view({M});
    } else {
      ln_mean = Tensor::empty({M}, DType::f32, xv.device(), cat);
      ln_rstd = Tensor::empty({M}, DType::f32, xv.device(), cat);
      k::layernorm_stats(ln_mean.data<float>(), ln_rstd.data<float>(), x2.data<bf16>(), M, static_cast<int>(IC),
                         stream);
    }
    cast_operands = {ln_mean.data<float>(), ln_rstd.data<float>(), input.ln_w->value.data<bf16>(),
                     input.ln_b->value.data<bf16>()};
  }
  if (cast_from_codes) {
    cast_operands.pre_codes = pre_saved.codes.data<uint8_t>();
    cast_operands.row_scale_inv = pre_saved.scale_inv.data<float>();
  }
  // Backward needs this cast's (scale_inv, scale). Known before the cast: the slot keeps them for the step.
  // From the tensor: the next cast overwrites the slot, so keep a copy.
  Fp8DeviceSlot* sx = slot(slots, Fp8Role::input);
  prepare_scale(st.input, sx, x2, stream, cast_input, cast_operands);
  Tensor x_scales = st.device.scales_view(Fp8Role::input);
  if (train && st.input.recipe->scale_from_tensor()) {
    Tensor copy = Tensor::empty({2}, DType::f32, xv.device(), MemCategory::activations);
    CUDA_CHECK(cudaMemcpyAsync(copy.raw(), x_scales.raw(), 2 * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    x_scales = std::move(copy);
  }
  QuantizedTensor xq = per_tensor_codes(M, IC, fp8_dtype(st.formats.forward), xv.device(), !codes_ahead.defined(),
                                        keep_xt, MemCategory::workspace, MemCategory::activations,
                                        x_scales.slice_flat(0, {1}));
  const k::Fp8CastOutputs x_stats = grad_enabled() ? stats_into(sx) : k::Fp8CastOutputs{};
  if (codes_ahead.defined())  // keep_xt is false
    xq.codes = std::move(codes_ahead).view({M, IC});
  else if (save_with_cast)  // keep_xt is false: recast_xt
    k::fp8_save_rows_gelu_cast(x2.data<bf16>(), M, IC, pre_saved.codes.data<uint8_t>(),
                               pre_saved.scale_inv.data<float>(), xq.codes.data<uint8_t>(), st.formats.forward,
                               &sx->scale, x_stats, stream);
  else
    k::fp8_cast(x2.raw(), DType::bf16, M, IC, xq.codes.data<uint8_t>(), keep_xt ? xq.codes_t.data<uint8_t>() : nullptr,
                st.formats.forward, &sx->scale, x_stats, stream, cast_input, cast_operands);
  if (grad_enabled()) st.device.mark_pending(Fp8Role::input);

  Shape oshape = xv.shape();
  oshape.back() = OC;
  Tensor out = Tensor::empty(oshape, DType::bf16, xv.device(), MemCategory::activations);
  k::matmul_fp8_forward(out.data<bf16>(), operand(xq, false), operand(st.weight_fp8, false),
                        b ? b->value.data<bf16>() : nullptr, static_cast<int>(M), static_cast<int>(IC),
                        static_cast<int>(OC), stream);
  xq.codes = Tensor();  // back to the pool once the stream passes the GEMM; codes_t stays for wgrad

  Var y = make_var(std::move(out));
  const char* node = gelu_input ? "fp8_linear_gelu" : ln_input ? "fp8_linear_ln" : "fp8_linear";
  if (!train) {
    watch_op(node, y, {&x, &w, &b, &input.ln_w, &input.ln_b});
    return y;
  }
  y->requires_grad = true;
  // The backward casts dy (for dgrad or wgrad) and can apply a pending GELU backward in that cast
  // (Fp8CastInput::dgelu): an FP8 linear with a GELU input that reads y leaves y's gradient so.
  y->grad_cell->takes_pending = in_needs_grad || w->requires_grad;
  Fp8LinearSaved s;
  s.st = &st;
  s.x_grad = grad_ref(x);
  s.x_needs_grad = in_needs_grad;
  s.w = w;
  s.b = b;
  s.yg = grad_ref(y);
  s.M = M;
  s.IC = IC;
  s.OC = OC;
  // The LayerNorm weight and bias when its backward runs (its statistics are kept as s.ln_mean, s.ln_rstd).
  s.prologue = ln_input && in_needs_grad ? InputPrologue{.kind = input.kind, .ln_w = input.ln_w, .ln_b = input.ln_b}
                                         : InputPrologue{.kind = input.kind};
  s.x_fp8 = xq;
  s.x_scale = x_scales.slice_flat(1, {1});
  s.recast_xt = recast_xt;
  s.x_kept = store_fp8 || !w->requires_grad ? Var() : x;  // bf16 storage: x is re-cast in backward
  s.pre_kept = gelu_input && in_needs_grad && !save_pre_fp8 ? x : Var();
  s.pre_saved = pre_saved;
  // LayerNorm prologue: the LayerNorm backward's input (the residual stream, which the unfused LayerNorm
  // keeps too) and its statistics.
  if (ln_input && in_needs_grad) {
    s.ln_x = x;
    s.ln_mean = ln_mean;
    s.ln_rstd = ln_rstd;
  }
  current_tape()->record(node, [s = std::move(s)] { backward_stage(s); });
  mark_gradient_read_only(y, {&x, &w, &b, &input.ln_w, &input.ln_b});
  if (serve_input && keep_xt) {  // x from x^T's codes, for x's other readers (fp8_linear.h), or the codes
    xq.shape = xv.shape();
    release_for_recompute(x, [xq] { return dequantize(xq, MemCategory::workspace); }, xq);
  }
  watch_op(node, y, {&x, &w, &b, &input.ln_w, &input.ln_b});
  return y;
}

}  // namespace fp8t::detail
