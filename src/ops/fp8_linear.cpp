// FP8 linear op: argument checks, device dispatch (CPU emulation or cuBLASLt FP8 GEMMs), the
// per-step FP8 weight cache and the backward nodes.
#include "ops/fp8_linear.h"

#include <cmath>
#include <memory>
#include <utility>

#include "core/check.h"
#include "ops/cpu/reference.h"
#include "ops/ops.h"

#ifdef FP8T_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/launch_limits.h"
#include "fp8/saved.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/cuda_ops.h"
#endif

namespace fp8t {

// ---------------------------------------------------------------- state

Fp8LinearState::Fp8LinearState(std::string n, const Fp8Config& c)
    : name(std::move(n)), cfg(c), formats(Fp8FormatRecipe::from(c.format)), input(formats.forward, c),
      weight(formats.forward, c), grad_output(formats.backward, c) {}

const Fp8Tensor& Fp8LinearState::weight_for_step(const Tensor& w) {
  if (cache_valid && cached_version == weight_version) return weight_fp8;
  FP8T_CHECK(w.device().is_cpu() && w.dtype() == DType::f32, "fp8_linear ({}): weight must be host f32, got {}",
             name, w.str());
  const float scale = weight.scaling == Fp8Scaling::current
                          ? weight.scale_for_cast(fp8_amax(w.data<float>(), w.numel()))
                          : weight.scale;
  Fp8CastStats stats;
  weight_fp8 = fp8_quantize(w, scale, formats.forward, MemCategory::fp8_cache, &stats);
  // The cached copy serves this whole step (evaluation included), so its amax belongs to the step
  // whatever the grad mode of the forward that happened to cast it.
  weight.record(stats.amax, stats.saturated);
  cached_version = weight_version;
  cache_valid = true;
  ++weight_casts;
  return weight_fp8;
}

void Fp8LinearState::on_optimizer_step() {
  collect_device_stats();
  ++weight_version;
  input.end_step();
  weight.end_step();
  grad_output.end_step();
}

double Fp8LinearState::weight_error(const Tensor& w) const {
  const std::vector<float> v = w.to_float_vector();
  Fp8TensorMeta m = weight;  // a copy: scale_for_cast may change it under current scaling
  const float scale = m.scaling == Fp8Scaling::current
                          ? m.scale_for_cast(fp8_amax(v.data(), static_cast<int64_t>(v.size())))
                          : m.scale;
  const float scale_inv = 1.0f / scale;
  double err = 0.0, ref = 0.0;
  for (float a : v) {
    const double d = double(fp8_to_float(float_to_fp8(a * scale, m.format), m.format) * scale_inv) - a;
    err += d * d;
    ref += double(a) * a;
  }
  return ref > 0 ? std::sqrt(err / ref) : 0.0;
}

// ---------------------------------------------------------------- op

namespace {

// dst (n) += tmp (n) * s: the GEMM result scaled by both operands' scale_inv, accumulated as a GEMM
// with beta = 1 would.
void add_scaled(Tensor& dst, const Tensor& tmp, float s) {
  float* d = dst.data<float>();
  const float* t = tmp.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) d[i] += t[i] * s;
}

float cast_scale(Fp8TensorMeta& meta, const Tensor& t) {
  return meta.scaling == Fp8Scaling::current ? meta.scale_for_cast(fp8_amax(t.data<float>(), t.numel()))
                                             : meta.scale;
}

Tensor& host_f32_grad(const GradRef& gr, const char* what, const std::string& layer) {
  Tensor& g = grad_of(gr);
  FP8T_CHECK(g.device().is_cpu() && g.dtype() == DType::f32 && g.numel() == shape_numel(gr.shape),
             "fp8_linear ({}): gradient of {} must be host f32 like its value, got {}", layer, what, g.str());
  return g;
}

Tensor& host_f32_grad(const Var& v, const char* what, const std::string& layer) {
  Tensor& g = grad_of(v);
  FP8T_CHECK(g.device().is_cpu() && g.dtype() == DType::f32 && g.numel() == v->value.numel(),
             "fp8_linear ({}): gradient of {} must be host f32 like its value, got {}", layer, what, g.str());
  return g;
}

Var fp8_linear_cpu(const Var& x, const Var& w, const Var& b, Fp8LinearState& st) {
  const Tensor& xv = x->value;
  const int64_t IC = w->value.dim(1), OC = w->value.dim(0), M = xv.numel() / IC;
  const Tensor x2 = xv.view({M, IC});

  // (OC, IC) FP8 weight of this step, and (M, IC) FP8 input.
  const Fp8Tensor wq = st.weight_for_step(w->value);
  const bool store_fp8 = st.cfg.activation_storage != ActivationStorage::bf16;
  Fp8CastStats xstats;
  const float x_scale = cast_scale(st.input, x2);
  const Fp8Tensor xq = fp8_quantize(x2, x_scale, st.formats.forward,
                                    store_fp8 ? MemCategory::activations : MemCategory::workspace, &xstats);
  if (grad_enabled()) st.input.record(xstats.amax, xstats.saturated);

  // (M, OC) = (q(x) @ q(w)^T) * (sx_inv * sw_inv) + b
  Shape oshape = xv.shape();
  oshape.back() = OC;
  Tensor out = Tensor::empty(oshape, DType::f32, Device::cpu(), MemCategory::activations);
  {
    const Tensor xd = fp8_decode(xq), wd = fp8_decode(wq);
    cpu::matmul_forward<float>(out.data<float>(), xd.data<float>(), wd.data<float>(), nullptr, M, IC, OC);
  }
  const float s = xq.scale_inv * wq.scale_inv;
  float* o = out.data<float>();
  const float* bias = b ? b->value.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (M * OC > (1 << 16))
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < OC; ++n) o[m * OC + n] = o[m * OC + n] * s + (bias ? bias[n] : 0.0f);

  Var y = make_var(std::move(out));
  if (!needs_grad(x, w, b)) return y;
  y->requires_grad = true;
  // fp8 storage keeps x's codes and only a weak handle on x (for its gradient): the node must not
  // keep x's f32 value alive. bf16 storage keeps x itself.
  const bool x_needs_grad = x->requires_grad;
  const GradRef x_grad = grad_ref(x);  // the gradient only: x's value is not kept
  Var x_kept = store_fp8 ? Var() : x;
  Fp8Tensor x_saved = store_fp8 ? xq : Fp8Tensor{Tensor(), xq.scale_inv};
  current_tape()->record("fp8_linear", [&st, x_grad, x_kept, x_saved, x_scale, x_needs_grad, w, b, yg = grad_ref(y), wq, M, IC,
                                        OC] {
    const Tensor dy = host_f32_grad(yg, "the output", st.name).view({M, OC});
    Fp8CastStats dstats;
    const Fp8Tensor dyq = fp8_quantize(dy, cast_scale(st.grad_output, dy), st.formats.backward,
                                       MemCategory::workspace, &dstats);
    st.grad_output.record(dstats.amax, dstats.saturated);
    const Tensor dyd = fp8_decode(dyq);  // (M, OC)
    if (x_needs_grad) {
      {
        // dx (M, IC) += (q(dy) @ q(w)) * (sdy_inv * sw_inv)
        const Tensor wd = fp8_decode(wq);
        Tensor tmp = Tensor::zeros({M, IC}, DType::f32, Device::cpu(), MemCategory::workspace);
        cpu::matmul_backward<float>(tmp.data<float>(), nullptr, nullptr, dyd.data<float>(), nullptr,
                                    wd.data<float>(), M, IC, OC);
        add_scaled(host_f32_grad(x_grad, "the input", st.name), tmp, dyq.scale_inv * wq.scale_inv);
      }
    }
    if (w->requires_grad) {
      // dw (OC, IC) += (q(dy)^T @ q(x)) * (sdy_inv * sx_inv); bf16 storage re-quantizes x with the
      // forward's scale, which reproduces the forward's codes.
      const Fp8Tensor xq2 = x_saved.codes.defined()
                                ? x_saved
                                : fp8_quantize(value_of(x_kept).view({M, IC}), x_scale, st.formats.forward,
                                               MemCategory::workspace);
      const Tensor xd = fp8_decode(xq2);
      Tensor tmp = Tensor::zeros({OC, IC}, DType::f32, Device::cpu(), MemCategory::workspace);
      cpu::matmul_backward<float>(nullptr, tmp.data<float>(), nullptr, dyd.data<float>(), xd.data<float>(),
                                  nullptr, M, IC, OC);
      add_scaled(host_f32_grad(w, "the weight", st.name), tmp, dyq.scale_inv * xq2.scale_inv);
    }
    if (b && b->requires_grad) {
      // Bias gradient from the unquantized dy, as Transformer Engine does.
      cpu::matmul_backward<float>(nullptr, nullptr, host_f32_grad(b, "the bias", st.name).data<float>(),
                                  dy.data<float>(), nullptr, nullptr, M, IC, OC);
    }
  });
  return y;
}


#ifdef FP8T_HAVE_CUDA
// ---------------------------------------------------------------- CUDA

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

// The linear's input as a function of the Var x that fp8_linear_cuda takes, computed inside x's FP8
// cast (kernels/fp8_cast.cuh, Fp8CastInput) and never stored: x itself; gelu(x), x the MLP's
// pre-activation; or layernorm(x, ln_w, ln_b), x the residual stream.
struct InputPrologue {
  k::Fp8CastInput kind = k::Fp8CastInput::as_is;
  Var ln_w, ln_b;  // layernorm: (IC) bf16 weight and bias
};

// x (..., IC) -> (..., OC), the linear applied to input.kind of x. Backward turns the dgrad output (the
// gradient of the prologue's output) into x's gradient with the GELU or LayerNorm backward kernel
// (the latter also adds ln_w's and ln_b's). A prologue needs FP8 storage (checked by the callers):
// bf16 storage would keep the prologue's output to re-cast it in backward.
Var fp8_linear_cuda(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, const InputPrologue& input = {}) {
  const Tensor& wv = w->value;
  expect_cuda(x->value, DType::bf16, "x", st.name);
  expect_cuda(wv, DType::bf16, "w (the bf16 compute copy)", st.name);
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
  const k::Fp8CastInput cast_input = input.kind;
  // gelu_input keeps the pre-activation x for the GELU backward: as x itself, or with fp8_all as FP8
  // codes, the forward then running on their round trip, written over x in place exactly as the gelu
  // op does (ops.h).
  const bool save_pre_fp8 = gelu_input && needs_grad(x) && st.cfg.activation_storage == ActivationStorage::fp8_all;
  Fp8Saved pre_saved;
  if (save_pre_fp8) pre_saved = fp8_save_inplace(x->value);
  const Tensor& xv = x->value;
  // wgrad needs x^T K-major: with fp8 storage the forward cast writes it alongside x.
  const bool keep_xt = train && w->requires_grad && store_fp8;
  const DType fwd = fp8_dtype(st.formats.forward), bwd = fp8_dtype(st.formats.backward);
  const Tensor x2 = xv.view({M, IC});
  // layernorm_input: the (M) statistics the cast normalizes with, which the LayerNorm backward reads.
  Tensor ln_mean, ln_rstd;
  k::Fp8CastOperands ln_operands;
  if (ln_input) {
    const MemCategory cat = in_needs_grad ? MemCategory::activations : MemCategory::workspace;
    ln_mean = Tensor::empty({M}, DType::f32, xv.device(), cat);
    ln_rstd = Tensor::empty({M}, DType::f32, xv.device(), cat);
    k::layernorm_stats(ln_mean.data<float>(), ln_rstd.data<float>(), x2.data<bf16>(), M, static_cast<int>(IC),
                       stream);
    ln_operands = {ln_mean.data<float>(), ln_rstd.data<float>(), input.ln_w->value.data<bf16>(),
                   input.ln_b->value.data<bf16>()};
  }
  Tensor xq = Tensor::empty({M, IC}, fwd, xv.device(), MemCategory::workspace);
  Tensor xq_t = keep_xt ? Tensor::empty({IC, M}, fwd, xv.device(), MemCategory::activations) : Tensor();
  Fp8DeviceSlot* sx = slot(slots, Fp8Role::input);
  prepare_scale(st.input, sx, x2, stream, cast_input, ln_operands);
  k::fp8_cast(x2.raw(), DType::bf16, M, IC, xq.data<uint8_t>(), keep_xt ? xq_t.data<uint8_t>() : nullptr,
              st.formats.forward, &sx->scale, grad_enabled() ? stats_into(sx) : k::Fp8CastOutputs{}, stream,
              cast_input, ln_operands);
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
  if (!train) return y;
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
                                OC, fwd, bwd] {
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
    const Tensor dy_pre = pending.defined() ? pending.input() : Tensor();  // (M, OC) gelu's input y
    k::Fp8CastOperands dy_ops;
    if (dy_pre.defined()) {
      expect_cuda(dy_pre, DType::bf16, "the GELU input of a pending gradient", st.name);
      FP8T_CHECK(dy_pre.numel() == M * OC, "fp8_linear ({}): a pending GELU gradient's input has {} elements, not {}",
                 st.name, dy_pre.numel(), M * OC);
      dy_ops.pre = dy_pre.data<bf16>();
    }
    const k::Fp8CastInput dy_input = dy_pre.defined() ? k::Fp8CastInput::dgelu : k::Fp8CastInput::as_is;
    const cudaStream_t stream = k::compute_stream();
    Fp8DeviceSlot* slots = st.device.slots(dy.device(), st.metas());
    Fp8DeviceSlot* sdy = slot(slots, Fp8Role::grad_output);
    const int m = static_cast<int>(M), ic = static_cast<int>(IC), oc = static_cast<int>(OC);
    // Bias gradient (OC) += column sums of the unquantized dy, as Transformer Engine does.
    float* db = nullptr;
    if (b && b->requires_grad) {
      Tensor& g = grad_of(b);
      expect_cuda(g, DType::f32, "the bias gradient", st.name);
      db = g.data<float>();
    }
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
        auto grad_or_zeros = [](const Var& v, DType dtype) {  // grad_of zero-fills a new gradient
          const Tensor& value = value_of(v);
          return v->requires_grad ? grad_of(v)
                                  : Tensor::zeros(value.shape(), dtype, value.device(), MemCategory::workspace);
        };
        Tensor dx = grad_or_zeros(x_in, DType::bf16);
        Tensor dlw = grad_or_zeros(prologue.ln_w, DType::f32), dlb = grad_or_zeros(prologue.ln_b, DType::f32);
        expect_cuda(dx, DType::bf16, "the input gradient", st.name);
        expect_cuda(dlw, DType::f32, "the LayerNorm weight gradient", st.name);
        expect_cuda(dlb, DType::f32, "the LayerNorm bias gradient", st.name);
        cuda_ops::layernorm_backward(dx, dlw, dlb, dh, value_of(x_in), prologue.ln_w->value, ln_mean, ln_rstd);
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
        expect_cuda(dw, DType::f32, "the weight gradient", st.name);
        Tensor xt = xq_t;
        if (!xt.defined()) {  // bf16 storage: the forward's scale reproduces the forward's codes
          xt = Tensor::empty({IC, M}, fwd, dy.device(), MemCategory::workspace);
          k::fp8_cast(value_of(x_kept).raw(), DType::bf16, M, IC, nullptr, xt.data<uint8_t>(), st.formats.forward,
                      x_scale, k::Fp8CastOutputs{}, stream);
        }
        // dw (OC, IC) += dy^T (OC, M) @ x (M, IC), with dy^T and x^T as the K-major operands
        k::matmul_fp8_backward_weight(dw.data<float>(), {dyq_t.raw(), bwd, &sdy->scale_inv},
                                      {xt.raw(), fwd, x_scale_inv}, m, ic, oc, /*accumulate=*/true, stream);
      }
    } else if (db) {  // only the bias needs a gradient: no cast to ride on
      k::matmul_backward_bias(db, dy.data<bf16>(), m, oc, stream);
    }
    (void)x_scales;  // keeps the current-scaling copy of (scale, scale_inv) alive until here
  });
  return y;
}
#endif  // FP8T_HAVE_CUDA

// The argument checks shared by fp8_linear and fp8_linear_gelu (x is the pre-activation there).
void check_args(const Var& x, const Var& w, const Var& b, const Fp8LinearState& st) {
  const Tensor& xv = x->value;
  const Tensor& wv = w->value;
  FP8T_CHECK(xv.ndim() >= 1 && wv.ndim() == 2 && xv.dim(-1) == wv.dim(1),
             "fp8_linear ({}): x (..., IC) = {} does not match w (OC, IC) = {}", st.name, xv.str(), wv.str());
  FP8T_CHECK(!b || b->value.numel() == wv.dim(0), "fp8_linear ({}): bias {} must have OC = {} elements", st.name,
             b ? b->value.str() : "", wv.dim(0));
  FP8T_CHECK(xv.device() == wv.device() && (!b || b->value.device() == xv.device()),
             "fp8_linear ({}): x {} and w {} are on different devices", st.name, xv.str(), wv.str());
  if (xv.device().is_cuda()) {
#ifndef FP8T_HAVE_CUDA
    FP8T_FAIL("fp8_linear ({}): tensor is on a CUDA device but this build has no CUDA", st.name);
#endif
    return;
  }
  FP8T_CHECK(xv.dtype() == DType::f32 && wv.dtype() == DType::f32 && (!b || b->value.dtype() == DType::f32),
             "fp8_linear ({}): the CPU emulation takes f32 x, w and b, got {} and {}", st.name, xv.str(), wv.str());
}
}  // namespace

Var fp8_linear(const Var& x, const Var& w, const Var& b, Fp8LinearState& st) {
  check_args(x, w, b, st);
  if (x->value.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    return fp8_linear_cuda(x, w, b, st);
#endif
  }
  return fp8_linear_cpu(x, w, b, st);
}

Var fp8_linear_gelu(const Var& pre, const Var& w, const Var& b, Fp8LinearState& st) {
  check_args(pre, w, b, st);
  const bool fp8_all = st.cfg.activation_storage == ActivationStorage::fp8_all;
#ifdef FP8T_HAVE_CUDA
  if (pre->value.device().is_cuda() && st.cfg.activation_storage != ActivationStorage::bf16)
    return fp8_linear_cuda(pre, w, b, st, {k::Fp8CastInput::gelu, {}, {}});
#endif
  // The CPU emulation, and bf16 storage (which keeps the linear's input, here gelu(pre), to re-cast it
  // in backward): the composition itself.
  return fp8_linear(gelu(pre, fp8_all), w, b, st);
}

Var fp8_linear_ln(const Var& x, const Var& ln_w, const Var& ln_b, const Var& w, const Var& b, Fp8LinearState& st) {
  check_args(x, w, b, st);
  const int64_t C = x->value.dim(-1);
  FP8T_CHECK(ln_w && ln_b && ln_w->value.numel() == C && ln_b->value.numel() == C,
             "fp8_linear_ln ({}): the LayerNorm weight {} and bias {} must have C = {} elements", st.name,
             ln_w ? ln_w->value.str() : "(none)", ln_b ? ln_b->value.str() : "(none)", C);
#ifdef FP8T_HAVE_CUDA
  if (x->value.device().is_cuda() && st.cfg.activation_storage != ActivationStorage::bf16)
    return fp8_linear_cuda(x, w, b, st, {k::Fp8CastInput::layernorm, ln_w, ln_b});
#endif
  // The CPU emulation, and bf16 storage (which keeps the linear's input, here layernorm(x), to re-cast
  // it in backward): the composition itself.
  return fp8_linear(layernorm(x, ln_w, ln_b), w, b, st);
}
}  // namespace fp8t
