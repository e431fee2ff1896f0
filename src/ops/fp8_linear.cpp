// FP8 linear op: argument checks, device dispatch (CPU emulation here; cuBLASLt FP8 GEMMs in
// src/ops/fp8_linear_cuda.cpp), the per-step FP8 weight cache and the CPU backward node.
#include "ops/fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "autograd/finite_watch.h"
#include "core/check.h"
#include "ops/cpu/linear.h"
#include "ops/grad_sink.h"
#include "ops/ops.h"

#ifdef FP8T_HAVE_CUDA
#include "ops/fp8_linear_cuda.h"
#endif

namespace fp8t {

// ---------------------------------------------------------------- state

void Fp8LinearState::check_codes_adopted(const Tensor& w) const {
  FP8T_CHECK(!is_fp8_dtype(w.dtype()) || (cache_valid && cached_version == weight_version),
             "fp8_linear ({}): the weight is given as FP8 codes (a ZeRO-sharded master) but no codes were adopted "
             "for this weight version: GPT::publish_weights must run after every optimizer step", name);
}

Fp8LinearState::Fp8LinearState(std::string n, const Fp8Config& c)
    : name(std::move(n)), cfg(c), formats(Fp8RoleFormats::from(c.format)), input(formats.forward, c),
      weight(formats.forward, c), grad_output(formats.backward, c) {}

const QuantizedTensor& Fp8LinearState::weight_for_step(const Tensor& w) {
  if (cache_valid && cached_version == weight_version) return weight_fp8;
  check_codes_adopted(w);
  FP8T_CHECK(w.device().is_cpu() && w.dtype() == DType::f32, "fp8_linear ({}): weight must be host f32, got {}",
             name, w.str());
  const float scale = weight.host_cast_scale(w.data<float>(), w.numel());
  Fp8CastStats stats;
  weight_fp8 = quantize(w, ScaleLayout::per_tensor, formats.forward, scale, MemCategory::fp8_cache, &stats);
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

void Fp8LinearState::weight_piece_amax(const Tensor& piece, Tensor& amax, int64_t index) {
  FP8T_CHECK(piece.dtype() == DType::f32 && amax.dtype() == DType::f32 && index >= 0 && index < amax.numel() &&
                 piece.device() == amax.device(),
             "fp8_linear ({}): weight_piece_amax takes an f32 piece and an f32 amax on its device, got {} and {}[{}]",
             name, piece.str(), amax.str(), index);
  if (piece.numel() == 0) return;
#ifdef FP8T_HAVE_CUDA
  if (piece.device().is_cuda()) return detail::fp8_weight_piece_amax_cuda(piece, amax.data<float>() + index);
#endif
  float& a = amax.data<float>()[index];
  const float* p = piece.data<float>();
  for (int64_t i = 0; i < piece.numel(); ++i)  // NaN sticks, as in the device amax
    a = std::isnan(p[i]) || std::isnan(a) ? NAN : std::max(a, std::fabs(p[i]));
}

void Fp8LinearState::weight_scale_from_amax(const Tensor& amax, int64_t index) {
#ifdef FP8T_HAVE_CUDA
  if (amax.device().is_cuda()) return detail::fp8_weight_scale_from_amax_cuda(*this, amax, index);
#endif
  (void)weight.scale_for_cast(amax.data<float>()[index]);
}

void Fp8LinearState::cast_weight_piece(const Tensor& piece, Tensor codes) {
  FP8T_CHECK(piece.dtype() == DType::f32 && codes.dtype() == fp8_dtype(formats.forward) &&
                 piece.numel() == codes.numel() && piece.device() == codes.device(),
             "fp8_linear ({}): cast_weight_piece takes f32 values and as many {} codes on one device, got {} and {}",
             name, dtype_name(fp8_dtype(formats.forward)), piece.str(), codes.str());
#ifdef FP8T_HAVE_CUDA
  if (piece.device().is_cuda()) return detail::fp8_cast_weight_piece_cuda(*this, piece, codes);
#endif
  Fp8CastStats stats;
  if (piece.numel() > 0) {
    const QuantizedTensor q =
        quantize(piece, ScaleLayout::per_tensor, formats.forward, weight.scale, MemCategory::workspace, &stats);
    codes.copy_from(q.codes);
  }
  weight.record(stats.amax, stats.saturated);
}

void Fp8LinearState::adopt_weight_codes(const Tensor& codes) {
  FP8T_CHECK(codes.ndim() == 2 && codes.dtype() == fp8_dtype(formats.forward),
             "fp8_linear ({}): adopt_weight_codes takes (OC, IC) {} codes, got {}", name,
             dtype_name(fp8_dtype(formats.forward)), codes.str());
#ifdef FP8T_HAVE_CUDA
  if (codes.device().is_cuda()) detail::fp8_adopt_weight_codes_cuda(*this, codes);
#endif
  if (codes.device().is_cpu()) {
    weight_fp8 = QuantizedTensor{};
    weight_fp8.codes = codes;
    weight_fp8.scale_inv = Tensor::from_vector({weight.scale_inv}, {1});
    weight_fp8.layout = ScaleLayout::per_tensor;
    weight_fp8.shape = codes.shape();
  }
  cached_version = weight_version;
  cache_valid = true;
  ++weight_casts;
}

double Fp8LinearState::weight_error(const Tensor& w) const {
  const std::vector<float> v = w.to_float_vector();
  Fp8TensorMeta m = weight;  // a copy: scale_for_cast may change it under current scaling
  const float scale = m.host_cast_scale(v.data(), static_cast<int64_t>(v.size()));
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

// (M, C) host f32 -> per-tensor codes, the scale from meta's recipe.
QuantizedTensor quantize_with(Fp8TensorMeta& meta, const Tensor& t, MemCategory cat, Fp8CastStats* stats = nullptr) {
  return quantize(t, ScaleLayout::per_tensor, meta.format, meta.host_cast_scale(t.data<float>(), t.numel()), cat,
                  stats);
}

Tensor& host_f32_grad(const GradRef& gr, const char* what, const std::string& layer) {
  Tensor& g = grad_of(gr);
  FP8T_CHECK(g.device().is_cpu() && g.dtype() == DType::f32 && g.numel() == shape_numel(gr.shape),
             "fp8_linear ({}): gradient of {} must be host f32 like its value, got {}", layer, what, g.str());
  return g;
}

Var fp8_linear_cpu(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, bool serve_input,
                   LinearBias bias_at) {
  const Tensor& xv = x->value;
  const int64_t IC = w->value.dim(1), OC = w->value.dim(0), M = xv.numel() / IC;
  const Tensor x2 = xv.view({M, IC});

  // (OC, IC) FP8 weight of this step, and (M, IC) FP8 input.
  const QuantizedTensor wq = st.weight_for_step(w->value);
  const bool store_fp8 = st.cfg.activation_storage != ActivationStorage::bf16;
  Fp8CastStats xstats;
  const float x_scale = st.input.host_cast_scale(x2.data<float>(), x2.numel());  // backward re-casts with it
  const QuantizedTensor xq = quantize(x2, ScaleLayout::per_tensor, st.formats.forward, x_scale,
                                      store_fp8 ? MemCategory::activations : MemCategory::workspace, &xstats);
  if (grad_enabled()) st.input.record(xstats.amax, xstats.saturated);

  // (M, OC) = (q(x) @ q(w)^T) * (sx_inv * sw_inv) + b
  Shape oshape = xv.shape();
  oshape.back() = OC;
  Tensor out = Tensor::empty(oshape, DType::f32, Device::cpu(), MemCategory::activations);
  {
    const Tensor xd = decode(xq), wd = decode(wq);
    cpu::matmul_forward<float>(out.data<float>(), xd.data<float>(), wd.data<float>(), nullptr, M, IC, OC);
  }
  const float s = xq.tensor_scale_inv() * wq.tensor_scale_inv();
  float* o = out.data<float>();
  const float* bias = b && bias_at == LinearBias::in_gemm ? b->value.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (M * OC > (1 << 16))
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < OC; ++n) o[m * OC + n] = o[m * OC + n] * s + (bias ? bias[n] : 0.0f);

  Var y = make_var(std::move(out));
  if (!needs_grad(x, w, b)) {
    watch_op("fp8_linear", y, {&x, &w, &b});
    return y;
  }
  y->requires_grad = true;
  // fp8 storage keeps x's codes and only a weak handle on x (for its gradient): the node must not
  // keep x's f32 value alive. bf16 storage keeps x itself.
  const bool x_needs_grad = x->requires_grad;
  const GradRef x_grad = grad_ref(x);  // the gradient only: x's value is not kept
  Var x_kept = store_fp8 ? Var() : x;
  const QuantizedTensor x_saved = store_fp8 ? xq : QuantizedTensor{};
  current_tape()->record("fp8_linear", [&st, x_grad, x_kept, x_saved, x_scale, x_needs_grad, w, b, yg = grad_ref(y),
                                        wq, M, IC, OC] {
    const Tensor dy = host_f32_grad(yg, "the output", st.name).view({M, OC});
    Fp8CastStats dstats;
    const QuantizedTensor dyq = quantize_with(st.grad_output, dy, MemCategory::workspace, &dstats);
    st.grad_output.record(dstats.amax, dstats.saturated);
    const Tensor dyd = decode(dyq);  // (M, OC)
    if (x_needs_grad) {
      {
        // dx (M, IC) += (q(dy) @ q(w)) * (sdy_inv * sw_inv)
        const Tensor wd = decode(wq);
        Tensor tmp = Tensor::zeros({M, IC}, DType::f32, Device::cpu(), MemCategory::workspace);
        cpu::matmul_backward<float>(tmp.data<float>(), nullptr, nullptr, dyd.data<float>(), nullptr,
                                    wd.data<float>(), M, IC, OC);
        add_scaled(host_f32_grad(x_grad, "the input", st.name), tmp, dyq.tensor_scale_inv() * wq.tensor_scale_inv());
      }
    }
    if (w->requires_grad) {
      // dw (OC, IC) += (q(dy)^T @ q(x)) * (sdy_inv * sx_inv); bf16 storage re-quantizes x with the
      // forward's scale, which reproduces the forward's codes.
      const QuantizedTensor xq2 = x_saved.defined() ? x_saved
                                                     : quantize(value_of(x_kept).view({M, IC}), ScaleLayout::per_tensor,
                                                                st.formats.forward, x_scale, MemCategory::workspace);
      const Tensor xd = decode(xq2);
      Tensor tmp = Tensor::zeros({OC, IC}, DType::f32, Device::cpu(), MemCategory::workspace);
      cpu::matmul_backward<float>(nullptr, tmp.data<float>(), nullptr, dyd.data<float>(), xd.data<float>(),
                                  nullptr, M, IC, OC);
      ops_detail::GradSink dw(w, DType::f32);  // a bf16 gradient is added to once, rounded (grad_sink.h)
      add_scaled(dw.tensor(), tmp, dyq.tensor_scale_inv() * xq2.tensor_scale_inv());
      dw.commit();
    }
    if (b && b->requires_grad) {
      // Bias gradient from the unquantized dy, as Transformer Engine does.
      ops_detail::GradSink db(b, DType::f32);
      cpu::matmul_backward<float>(nullptr, nullptr, db.ptr<float>(), dy.data<float>(), nullptr, nullptr, M, IC, OC);
      db.commit();
    }
  });
  mark_gradient_read_only(y, {&x, &w, &b});
  // x from its codes for x's other readers (fp8_linear.h); after the node took what it needs of x.
  if (serve_input && store_fp8)
    release_for_recompute(x, [xq, shape = x->value.shape()] {
      return dequantize(xq, MemCategory::workspace).view(shape);
    });
  watch_op("fp8_linear", y, {&x, &w, &b});
  return y;
}

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
  // w may be this weight version's codes where the master is sharded (adopt_weight_codes).
  st.check_codes_adopted(wv);
  const bool w_ok = wv.dtype() == DType::f32 || is_fp8_dtype(wv.dtype());
  FP8T_CHECK(xv.dtype() == DType::f32 && w_ok && (!b || b->value.dtype() == DType::f32),
             "fp8_linear ({}): the CPU emulation takes f32 x, w and b, got {} and {}", st.name, xv.str(), wv.str());
}
}  // namespace

Var fp8_linear(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, bool serve_input, LinearBias bias_at) {
  check_args(x, w, b, st);
  if (x->value.device().is_cuda()) {
#ifdef FP8T_HAVE_CUDA
    return detail::fp8_linear_cuda(x, w, b, st, {}, serve_input, bias_at);
#endif
  }
  return fp8_linear_cpu(x, w, b, st, serve_input, bias_at);
}

Var fp8_linear_gelu(Var pre, const Var& w, const Var& b, Fp8LinearState& st, LinearBias bias_at) {
  check_args(pre, w, b, st);
  const bool fp8_all = st.cfg.activation_storage == ActivationStorage::fp8_all;
#ifdef FP8T_HAVE_CUDA
  if (pre->value.device().is_cuda() && st.cfg.activation_storage != ActivationStorage::bf16) {
    // This handle is the only one on pre and its storage: nothing reads pre once the op returns.
    const bool last_reader = pre.use_count() == 1 && pre->value.storage_use_count() == 1;
    return detail::fp8_linear_cuda(pre, w, b, st, {.kind = kernels::Fp8CastInput::gelu, .last_reader = last_reader},
                                   false, bias_at);
  }
#endif
  // The CPU emulation, and bf16 storage (which keeps the linear's input, here gelu(pre), to re-cast it
  // in backward): the composition itself.
  return fp8_linear(gelu(pre, fp8_all), w, b, st, false, bias_at);
}

Var fp8_linear_ln(const Var& x, const Var& ln_w, const Var& ln_b, const Var& w, const Var& b, Fp8LinearState& st,
                  const RowStats* x_stats) {
  check_args(x, w, b, st);
  const int64_t C = x->value.dim(-1);
  FP8T_CHECK(ln_w && ln_b && ln_w->value.numel() == C && ln_b->value.numel() == C,
             "fp8_linear_ln ({}): the LayerNorm weight {} and bias {} must have C = {} elements", st.name,
             ln_w ? ln_w->value.str() : "(none)", ln_b ? ln_b->value.str() : "(none)", C);
#ifdef FP8T_HAVE_CUDA
  if (x->value.device().is_cuda() && st.cfg.activation_storage != ActivationStorage::bf16)
    return detail::fp8_linear_cuda(x, w, b, st,
                                   {.kind = kernels::Fp8CastInput::layernorm,
                                    .ln_w = ln_w,
                                    .ln_b = ln_b,
                                    .ln_stats = x_stats && x_stats->defined() ? *x_stats : RowStats{}});
#endif
  // The CPU emulation, and bf16 storage (which keeps the linear's input, here layernorm(x), to re-cast
  // it in backward): the composition itself.
  return fp8_linear(layernorm(x, ln_w, ln_b), w, b, st);
}

std::shared_ptr<Fp8LnCastAhead> fp8_ln_cast_ahead(Fp8LinearState& st, const Var& ln_w, const Var& ln_b) {
#ifdef FP8T_HAVE_CUDA
  if (st.cfg.activation_storage == ActivationStorage::fp8_all && !st.input.recipe->scale_from_tensor() && ln_w && ln_b)
    return std::make_shared<Fp8LnCastAhead>(Fp8LnCastAhead{.st = &st, .ln_w = ln_w, .ln_b = ln_b, .codes = {}});
#endif
  (void)st, (void)ln_w, (void)ln_b;
  return nullptr;
}

Var fp8_lm_head_loss(const Var& h, const Var& w, Fp8LinearState& st, const Tensor& targets, int64_t vocab_size,
                     int64_t chunk_rows, float grad_scale) {
  const Tensor& hv = h->value;
  FP8T_CHECK(hv.ndim() == 3, "fp8_lm_head_loss ({}): h must be (B, T, C), got {}", st.name, hv.str());
  const int64_t BT = hv.dim(0) * hv.dim(1), C = hv.dim(2);
  FP8T_CHECK(targets.dtype() == DType::i32 && targets.numel() == BT && targets.device() == hv.device(),
             "fp8_lm_head_loss ({}): targets must be i32 (B, T) matching h {} on its device, got {}", st.name,
             hv.str(), targets.str());
  FP8T_CHECK(chunk_rows > 0, "fp8_lm_head_loss ({}): chunk_rows must be positive, got {}", st.name, chunk_rows);
  const bool train = needs_grad(h, w);
  const Tensor h2 = hv.view({BT, C}), t2 = targets.view({BT});
  // d(h) for the assumed seed, added chunk by chunk during the forward pass (each chunk's leaf has its rows of
  // dh as its gradient).
  Tensor dh = train && h->requires_grad ? Tensor::zeros({BT, C}, hv.dtype(), hv.device(), MemCategory::activations)
                                        : Tensor();
  Tensor loss;  // the mean over all BT tokens: each chunk's mean weighted by its share of the tokens
  for (int64_t r0 = 0; r0 < BT; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, BT - r0);
    // The chunk's rows as a leaf of a tape of its own: its backward runs right away, so its logits, their
    // gradient and FP8 copies are freed before the next chunk's exist.
    Var hc = make_var(h2.slice_flat(r0 * C, {1, rows, C}), train && h->requires_grad);
    if (dh.defined()) hc->grad = dh.slice_flat(r0 * C, {1, rows, C});
    const Tensor tc = t2.slice_flat(r0, {1, rows});
    Tape tape;
    Var lc;
    {
      TapeScope scope(train ? &tape : nullptr);
      lc = cross_entropy(fp8_linear(hc, w, Var(), st), tc, vocab_size);
    }
    const float share = static_cast<float>(static_cast<double>(rows) / static_cast<double>(BT));
    if (train) {
      tape.backward(lc, grad_scale * share);  // d(loss_c) = seed * rows / BT: the chunk's part of the mean
    }
    Tensor part = lc->value;
    scale_(part, share);
    if (!loss.defined())
      loss = part;
    else
      add_(loss, part);
  }
  Var y = make_var(std::move(loss));
  if (train) {
    y->requires_grad = true;
    current_tape()->require_seed(grad_scale);
    // d(w) is already in w's gradient; d(h) waits here for the backward pass.
    current_tape()->record("fp8_lm_head_loss", [hg = grad_ref(h), dh] {
      if (!hg.requires_grad) return;
      if (!grad_exists(hg))
        hg.cell->grad = dh.view(hg.shape);
      else
        add_(grad_of(hg), dh.view(hg.shape));
    });
  }
  watch_op("fp8_lm_head_loss", y, {&h, &w});
  return y;
}

}  // namespace fp8t
