// The CUDA path of the FP8 linear ops (declared in src/ops/fp8_linear_cuda.h), in stages: here the forward stage (the
// FP8 weight cache of fp8_weight_cuda.cpp, the input cast with its prologue, the fprop GEMM, and what backward
// keeps, as an Fp8LinearSaved); the backward stage (the output-gradient cast, then dgrad by prologue, then wgrad) is
// in fp8_linear_backward_cuda.cpp.
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
#include "ops/ops.h"

namespace fp8t::detail {
namespace {

namespace k = kernels;
using bf16 = __nv_bfloat16;

}  // namespace

// ---------------------------------------------------------------- forward stage

Var fp8_linear_cuda(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, const InputPrologue& input,
                    bool serve_input, LinearBias bias_at) {
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
  // Without a gradient (a checkpoint's first pass, evaluation) the forward runs on the round trip all the same.
  const bool round_pre = gelu_input && fp8_all;
  const bool save_pre_fp8 = round_pre && needs_grad(x);
  const bool cast_from_codes = save_pre_fp8 && !st.input.recipe->scale_from_tensor();
  const bool save_with_cast = cast_from_codes && input.last_reader;
  QuantizedTensor pre_saved;
  if (save_with_cast) pre_saved = fp8_saved_rows_empty(x->value);
  else if (save_pre_fp8) pre_saved = fp8_save_inplace(x->value);
  else if (round_pre) fp8_save_inplace(x->value);  // nothing kept
  const k::Fp8CastInput cast_input = cast_from_codes ? k::Fp8CastInput::saved_gelu : input.kind;
  const Tensor& xv = x->value;
  // wgrad needs x^T K-major: with fp8 storage the forward cast writes it alongside x. fp8_all with a
  // prologue whose operands backward keeps anyway (x, mean and rstd for LayerNorm's backward; pre's FP8
  // codes for GELU's) casts it again there instead, from the same values with the same scale.
  const bool recast_xt = fp8_all && ((ln_input && in_needs_grad) || save_pre_fp8);
  const bool keep_xt = train && w->requires_grad && store_fp8 && !recast_xt;
  const Tensor x2 = xv.view({M, IC});
  // The codes the residual add that wrote x cast ahead for this linear (fp8_ln_cast_ahead): the cast below, done.
  Tensor codes_ahead;
  if (const auto& ahead = input.ln_stats.cast_ahead; ln_input && ahead && ahead->codes.defined()) {
    FP8T_CHECK(ahead->st == &st && ahead->ln_w == input.ln_w && ahead->ln_b == input.ln_b && !keep_xt &&
                   ahead->codes.numel() == M * IC && ahead->codes.device() == xv.device(),
               "fp8_linear ({}): the codes the residual add cast ahead ({}) are not this cast's", st.name,
               ahead->codes.str());
    codes_ahead = std::move(ahead->codes);
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
                        b && bias_at == LinearBias::in_gemm ? b->value.data<bf16>() : nullptr, static_cast<int>(M),
                        static_cast<int>(IC), static_cast<int>(OC), stream, st.cfg.fast_accum_in("forward"));
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
  // The op that computes y's gradient may write it as this backward's dy codes itself (Fp8DyRequest, the
  // attention backward does): where the dy scale is known before the cast and the backward format is E5M2.
  if (y->grad_cell->takes_pending && st.formats.backward == Fp8Format::e5m2 &&
      !st.grad_output.recipe->scale_from_tensor())
    y->grad_cell->fp8_dy = std::make_shared<const Fp8DyRequest>(
        Fp8DyRequest{.scale = &slot(slots, Fp8Role::grad_output)->scale, .codes = in_needs_grad,
                     .codes_t = w->requires_grad, .colsum = b && b->requires_grad});
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
    s.ln_residual = residual_dy_cell(x);
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
