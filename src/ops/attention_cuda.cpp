// CUDA launchers of the causal self-attention op (see attention_cuda.h): check devices, dtypes and shapes,
// take the backward's scratch from the caching allocator, then call kernels/attention.cuh on the compute stream.
#include "ops/attention_cuda.h"

#include "core/cuda_check.h"
#include "kernels/attention.cuh"
#include "kernels/stream.cuh"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

namespace {

// (B, T, C) of qkv (B, T, 3C), checked.
Shape out_shape(const char* op, const Tensor& qkv, int n_head) {
  FP8T_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, "{}: qkv must be (B, T, 3C), got {}", op, qkv.str());
  const int64_t C = qkv.dim(2) / 3;
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "{}: C={} is not divisible by n_head={}", op, C, n_head);
  return {qkv.dim(0), qkv.dim(1), C};
}

// Both forms of qkv (oshape: its (B, T, C), checked): checks out and lse, then runs the forward.
void forward(const char* op, Tensor& out, Tensor& lse, const k::AttentionQkv& qkv, const Shape& oshape, int n_head,
             const k::AttentionKernels& kernels) {
  expect(out, DType::bf16, op, "out");
  expect(lse, DType::f32, op, "lse");
  const int64_t B = oshape[0], T = oshape[1], C = oshape[2];
  expect_shape(out, oshape, op, "out");
  expect_numel(lse, B * n_head * T, op, "lse");
  k::attention_forward(out.data<bf16>(), lse.data<float>(), qkv, to_int(B, op, "B"), to_int(T, op, "T"), n_head,
                       to_int(C / n_head, op, "HS"), k::compute_stream(), kernels);
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head, const k::AttentionKernels& kernels) {
  const char* op = "attention_forward";
  expect(qkv, DType::bf16, op, "qkv");
  forward(op, out, lse, k::AttentionQkv{.bf16 = qkv.data<bf16>()}, out_shape(op, qkv, n_head), n_head, kernels);
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head) {
  attention_forward(out, lse, qkv, n_head, k::AttentionKernels{});
}

bool attention_reads_codes(const Tensor& qkv, int n_head) {
  if (qkv.ndim() != 3 || n_head <= 0 || qkv.dim(2) % (3 * int64_t{n_head}) != 0) return false;
  return k::attention_reads_codes(static_cast<int>(qkv.dim(2) / (3 * int64_t{n_head})));
}

namespace {

// qkv's saved codes as the kernels take them, checked: per-row E4M3 codes (B, T, 3C) with B * T f32 scales.
k::AttentionQkv codes_of(const char* op, const QuantizedTensor& qkv) {
  const Tensor& c = qkv.codes;
  FP8T_CHECK(c.defined() && c.dtype() == DType::e4m3 && c.ndim() == 3 && c.dim(2) % 3 == 0 &&
                 qkv.layout == ScaleLayout::per_row && qkv.scale_inv.defined() &&
                 qkv.scale_inv.dtype() == DType::f32 && qkv.scale_inv.numel() == c.dim(0) * c.dim(1) &&
                 qkv.scale_inv.device() == c.device() && c.device().is_cuda(),
             "{}: qkv's saved form must be E4M3 codes (B, T, 3C) with an f32 scale_inv per row (fp8_save) on one "
             "CUDA device, got {} layout, codes {}, scale_inv {}",
             op, scale_layout_name(qkv.layout), c.defined() ? c.str() : "(none)",
             qkv.scale_inv.defined() ? qkv.scale_inv.str() : "(none)");
  return {.e4m3 = c.data<uint8_t>(), .row_scale_inv = qkv.scale_inv.data<float>()};
}

// Both forms of qkv and out: checks the rest (qkv_shape (B, T, 3C) on `device`), takes the scratch from the caching
// allocator (served from the pool after the first step) and runs the backward, into dqkv or (dqkv null) dy's codes.
void backward(const char* op, Tensor* dqkv, const Tensor& dout, const k::AttentionQkv& qkv, const Shape& qkv_shape,
              Device device, const k::AttentionOut& out, const Tensor& lse, int n_head,
              const k::AttentionKernels& kernels, bool accumulate, const k::AttentionDyCodes* dy = nullptr) {
  expect(dout, DType::bf16, op, "dout");
  expect(lse, DType::f32, op, "lse");
  const int64_t B = qkv_shape[0], T = qkv_shape[1], C = qkv_shape[2] / 3;
  if (dqkv) {
    expect(*dqkv, DType::bf16, op, "dqkv");
    expect_shape(*dqkv, qkv_shape, op, "dqkv");
    FP8T_CHECK(dqkv->device() == device, "{}: dqkv is on {}, qkv on {}", op, dqkv->device().str(), device.str());
  }
  FP8T_CHECK(dqkv || dy, "{}: neither dqkv nor dy codes to write", op);
  expect_shape(dout, {B, T, C}, op, "dout");
  expect_numel(lse, B * n_head * T, op, "lse");
  const int64_t dq_floats = k::attention_dq_scratch_floats(to_int(B, op, "B"), to_int(T, op, "T"), n_head,
                                                          to_int(C / n_head, op, "HS"), kernels);
  Tensor dq_accum = Tensor::empty({dq_floats}, DType::f32, device, MemCategory::activations);
  Tensor delta = Tensor::empty({B, n_head, T}, DType::f32, device, MemCategory::activations);
  k::attention_backward(dqkv ? dqkv->data<bf16>() : nullptr, dq_accum.data<float>(), delta.data<float>(),
                        dout.data<bf16>(), qkv, out, lse.data<float>(), to_int(B, op, "B"), to_int(T, op, "T"),
                        n_head, to_int(C / n_head, op, "HS"), k::compute_stream(), kernels, accumulate, dy);
}
void backward(const char* op, Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const k::AttentionOut& out,
              const Tensor& lse, int n_head, const k::AttentionKernels& kernels, bool accumulate) {
  expect(qkv, DType::bf16, op, "qkv");
  backward(op, &dqkv, dout, k::AttentionQkv{.bf16 = qkv.data<bf16>()}, qkv.shape(), qkv.device(), out, lse, n_head,
           kernels, accumulate);
}

// out as the delta pass reads it: bf16 (B, T, C), or the next linear's transposed per-tensor E4M3 codes.
k::AttentionOut out_of(const char* op, const Tensor& out, const Shape& oshape) {
  expect(out, DType::bf16, op, "out");
  expect_shape(out, oshape, op, "out");
  return {.bf16 = out.data<bf16>()};
}
k::AttentionOut out_of(const char* op, const QuantizedTensor& out, const Shape& oshape, Device device) {
  const int64_t M = oshape[0] * oshape[1], C = oshape[2];
  FP8T_CHECK(out.codes_t.defined() && out.layout == ScaleLayout::per_tensor && out.codes_t.dtype() == DType::e4m3 &&
                 out.codes_t.shape() == Shape({C, M}) && out.codes_t.device() == device &&
                 out.scale_inv.numel() == 1 && out.scale_inv.dtype() == DType::f32 &&
                 out.scale_inv.device() == device,
             "{}: out's FP8 form must be per-tensor E4M3 codes transposed to ({}, {}) with one f32 scale_inv on {}, "
             "got {} codes_t {} scale_inv {}",
             op, C, M, device.str(), scale_layout_name(out.layout),
             out.codes_t.defined() ? out.codes_t.str() : "(none)",
             out.scale_inv.defined() ? out.scale_inv.str() : "(none)");
  return {.e4m3_t = out.codes_t.data<uint8_t>(), .scale_inv = out.scale_inv.data<float>()};
}

}  // namespace

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, const k::AttentionKernels& kernels, bool accumulate) {
  const char* op = "attention_backward";
  backward(op, dqkv, dout, qkv, out_of(op, out, out_shape(op, qkv, n_head)), lse, n_head, kernels, accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, const k::AttentionKernels& kernels, bool accumulate) {
  const char* op = "attention_backward";
  backward(op, dqkv, dout, qkv, out_of(op, out, out_shape(op, qkv, n_head), qkv.device()), lse, n_head, kernels,
           accumulate);
}

void attention_forward(Tensor& out, Tensor& lse, const QuantizedTensor& qkv, int n_head) {
  const char* op = "attention_forward";
  const k::AttentionQkv codes = codes_of(op, qkv);
  forward(op, out, lse, codes, out_shape(op, qkv.codes, n_head), n_head, k::AttentionKernels{});
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const QuantizedTensor& qkv, const Tensor& out,
                        const Tensor& lse, int n_head, bool accumulate) {
  const char* op = "attention_backward";
  const k::AttentionQkv codes = codes_of(op, qkv);
  backward(op, &dqkv, dout, codes, qkv.codes.shape(), qkv.device(),
           out_of(op, out, out_shape(op, qkv.codes, n_head)), lse, n_head, k::AttentionKernels{}, accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const QuantizedTensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, bool accumulate) {
  const char* op = "attention_backward";
  const k::AttentionQkv codes = codes_of(op, qkv);
  backward(op, &dqkv, dout, codes, qkv.codes.shape(), qkv.device(),
           out_of(op, out, out_shape(op, qkv.codes, n_head), qkv.device()), lse, n_head, k::AttentionKernels{},
           accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, bool accumulate) {
  attention_backward(dqkv, dout, qkv, out, lse, n_head, k::AttentionKernels{}, accumulate);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const QuantizedTensor& out,
                        const Tensor& lse, int n_head, bool accumulate) {
  attention_backward(dqkv, dout, qkv, out, lse, n_head, k::AttentionKernels{}, accumulate);
}

bool attention_writes_dy_codes(const Shape& qkv_shape, int n_head) {
  if (qkv_shape.size() != 3 || n_head <= 0 || qkv_shape[2] % (3 * int64_t{n_head}) != 0) return false;
  return k::attention_writes_dy_codes(static_cast<int>(qkv_shape[2] / (3 * int64_t{n_head})));
}

namespace {

// AttentionSaved's forms as the kernels take them, checked.
struct SavedForms {
  const Tensor& qkv_t;  // qkv's tensor (B, T, 3C): bf16, or the codes
  k::AttentionQkv qkv;
  k::AttentionOut out;
};
SavedForms forms_of(const char* op, const AttentionSaved& saved, int n_head) {
  FP8T_CHECK((saved.qkv != nullptr) != (saved.qkv_codes != nullptr) &&
                 (saved.out != nullptr) != (saved.out_codes != nullptr),
             "{}: qkv and out must each be given in one form", op);
  if (saved.qkv) expect(*saved.qkv, DType::bf16, op, "qkv");
  const Tensor& qkv_t = saved.qkv ? *saved.qkv : saved.qkv_codes->codes;
  const Shape oshape = out_shape(op, qkv_t, n_head);
  FP8T_CHECK(attention_writes_dy_codes(qkv_t.shape(), n_head),
             "{}: these kernels cannot write dy codes or column sums (attention_writes_dy_codes)", op);
  return {.qkv_t = qkv_t,
          .qkv = saved.qkv ? k::AttentionQkv{.bf16 = saved.qkv->data<bf16>()} : codes_of(op, *saved.qkv_codes),
          .out = saved.out ? out_of(op, *saved.out, oshape) : out_of(op, *saved.out_codes, oshape, qkv_t.device())};
}

}  // namespace

void attention_backward_colsum(Tensor& dqkv, Tensor& colsum, const Tensor& dout, const AttentionSaved& saved,
                               const Tensor& lse, int n_head) {
  const char* op = "attention_backward (column sums)";
  const SavedForms f = forms_of(op, saved, n_head);
  expect(colsum, DType::f32, op, "colsum");
  expect_numel(colsum, f.qkv_t.dim(2), op, "colsum");
  FP8T_CHECK(colsum.device() == f.qkv_t.device(), "{}: colsum is on {}, qkv on {}", op, colsum.device().str(),
             f.qkv_t.device().str());
  CUDA_CHECK(cudaMemsetAsync(colsum.raw(), 0, colsum.nbytes(), k::compute_stream()));
  const k::AttentionDyCodes dy{.stats = {.colsum = colsum.data<float>()}};
  backward(op, &dqkv, dout, f.qkv, f.qkv_t.shape(), f.qkv_t.device(), f.out, lse, n_head, k::AttentionKernels{},
           false, &dy);
}

PendingGrad attention_backward_dy_codes(const Fp8DyRequest& request, const Tensor& dout, const AttentionSaved& saved,
                                        const Tensor& lse, int n_head) {
  const char* op = "attention_backward (dy codes)";
  FP8T_CHECK(request.scale && (request.codes || request.codes_t), "{}: the request asks for no codes", op);
  const SavedForms f = forms_of(op, saved, n_head);
  const Tensor& qkv_t = f.qkv_t;
  const k::AttentionQkv& qkv = f.qkv;
  const k::AttentionOut& out = f.out;
  const Device device = qkv_t.device();
  const int64_t M = qkv_t.dim(0) * qkv_t.dim(1), cols = qkv_t.dim(2);
  PendingGrad p;
  if (request.codes) p.dy_codes = Tensor::empty({M, cols}, DType::e5m2, device, MemCategory::workspace);
  if (request.codes_t) p.dy_codes_t = Tensor::empty({cols, M}, DType::e5m2, device, MemCategory::workspace);
  p.dy_stats = Tensor::empty({k::cast_stats_floats(cols)}, DType::f32, device, MemCategory::workspace);
  CUDA_CHECK(cudaMemsetAsync(p.dy_stats.raw(), 0, p.dy_stats.nbytes(), k::compute_stream()));
  float* stats = p.dy_stats.data<float>();
  k::AttentionDyCodes dy{.codes = request.codes ? p.dy_codes.data<uint8_t>() : nullptr,
                         .codes_t = request.codes_t ? p.dy_codes_t.data<uint8_t>() : nullptr,
                         .scale = request.scale,
                         .stats = {.amax = stats + k::cast_stats_amax_index(cols),
                                   .saturated = reinterpret_cast<unsigned long long*>(
                                       stats + k::cast_stats_amax_index(cols) + 2),
                                   .colsum = stats}};
  backward(op, nullptr, dout, qkv, qkv_t.shape(), device, out, lse, n_head, k::AttentionKernels{}, false, &dy);
  return p;
}

}  // namespace fp8t::cuda_ops
