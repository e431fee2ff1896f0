// Tensor-level CUDA ops: check devices, dtypes and shapes, then call the kernels/ launchers on the
// compute stream. Compiled only in CUDA builds.
#ifdef FP8T_HAVE_CUDA
#include "ops/cuda_ops.h"

#include "core/launch_limits.h"
#include "core/tensor_ops.h"
#include "kernels/attention.cuh"
#include "kernels/classifier.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"

namespace fp8t::cuda_ops {
namespace {

using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

void expect(const Tensor& t, DType dtype, const char* op, const char* name) {
  FP8T_CHECK(t.defined(), "{}: {} is undefined", op, name);
  FP8T_CHECK(t.device().is_cuda(), "{}: {} must be on a CUDA device, got {}", op, name, t.str());
  FP8T_CHECK(t.dtype() == dtype, "{}: {} must be {}, got {}", op, name, dtype_name(dtype), t.str());
}

void expect_float(const Tensor& t, const char* op, const char* name) {
  FP8T_CHECK(t.defined() && t.device().is_cuda(), "{}: {} must be a CUDA tensor", op, name);
  FP8T_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "{}: {} must be f32 or bf16, got {}", op, name,
             t.str());
}

void expect_shape(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  FP8T_CHECK(t.shape() == shape, "{}: {} has shape {}, expected {}", op, name, shape_str(t.shape()), shape_str(shape));
}

void expect_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  FP8T_CHECK(t.numel() == n, "{}: {} has {} elements ({}), expected {}", op, name, t.numel(), shape_str(t.shape()), n);
}

// A single dimension the kernels take as int (their offsets are 64-bit: only each dimension must fit).
int to_int(int64_t v, const char* op, const char* what) { return checked_int(v, op, what); }

// Leading dimensions flattened: (..., last) -> rows.
int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.numel() / std::max<int64_t>(t.dim(-1), 1); }

}  // namespace

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  const char* op = "embedding_forward";
  expect(tokens, DType::i32, op, "tokens");
  expect(wte, DType::bf16, op, "wte");
  expect(wpe, DType::bf16, op, "wpe");
  expect(out, DType::bf16, op, "out");
  FP8T_CHECK(tokens.ndim() == 2 && wte.ndim() == 2 && wpe.ndim() == 2, "{}: tokens (B, T), wte (Vp, C), wpe (maxT, C)",
             op);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = wte.dim(1);
  FP8T_CHECK(wpe.dim(1) == C && wpe.dim(0) >= T, "{}: wpe {} does not cover T={} with C={}", op, wpe.str(), T, C);
  expect_shape(out, {B, T, C}, op, "out");
  k::embedding_forward(out.data<bf16>(), tokens.data<int32_t>(), wte.data<bf16>(), wpe.data<bf16>(), to_int(B, op, "B"),
                       to_int(T, op, "T"), to_int(C, op, "C"), k::compute_stream());
}

void embedding_backward(Tensor& dwte, Tensor& dwpe, const Tensor& dout, const Tensor& tokens) {
  const char* op = "embedding_backward";
  expect(tokens, DType::i32, op, "tokens");
  expect(dwte, DType::f32, op, "dwte");
  expect(dwpe, DType::f32, op, "dwpe");
  expect(dout, DType::bf16, op, "dout");
  FP8T_CHECK(tokens.ndim() == 2 && dwte.ndim() == 2 && dwpe.ndim() == 2, "{}: tokens (B, T), dwte (Vp, C), dwpe (maxT, C)",
             op);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dwte.dim(1);
  FP8T_CHECK(dwpe.dim(1) == C && dwpe.dim(0) >= T, "{}: dwpe {} does not cover T={} with C={}", op, dwpe.str(), T, C);
  expect_shape(dout, {B, T, C}, op, "dout");
  k::embedding_backward(dwte.data<float>(), dwpe.data<float>(), dout.data<bf16>(), tokens.data<int32_t>(),
                        to_int(B, op, "B"), to_int(T, op, "T"), to_int(C, op, "C"), k::compute_stream());
}

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias) {
  const char* op = "matmul_forward";
  expect(inp, DType::bf16, op, "inp");
  expect(weight, DType::bf16, op, "weight");
  expect_float(out, op, "out");
  FP8T_CHECK(weight.ndim() == 2, "{}: weight must be (N, K), got {}", op, weight.str());
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(inp);
  FP8T_CHECK(inp.dim(-1) == K, "{}: inp {} does not match weight {}", op, inp.str(), weight.str());
  FP8T_CHECK(out.dim(-1) == N && rows_of(out) == M, "{}: out {} should be ({} rows, {})", op, out.str(), M, N);
  if (bias) {
    expect(*bias, out.dtype(), op, "bias");
    expect_numel(*bias, N, op, "bias");
  }
  k::matmul_forward(out.raw(), out.dtype(), inp.data<bf16>(), weight.data<bf16>(), bias ? bias->raw() : nullptr,
                    to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), k::compute_stream());
}

void matmul_forward_gelu(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const char* op = "matmul_forward_gelu";
  expect(inp, DType::bf16, op, "inp");
  expect(weight, DType::bf16, op, "weight");
  expect(bias, DType::bf16, op, "bias");
  expect(out, DType::bf16, op, "out");
  expect(pre, DType::bf16, op, "pre");
  FP8T_CHECK(weight.ndim() == 2, "{}: weight must be (N, K), got {}", op, weight.str());
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(inp);
  FP8T_CHECK(inp.dim(-1) == K, "{}: inp {} does not match weight {}", op, inp.str(), weight.str());
  FP8T_CHECK(out.dim(-1) == N && rows_of(out) == M, "{}: out {} should be ({} rows, {})", op, out.str(), M, N);
  expect_numel(pre, M * N, op, "pre");
  expect_numel(bias, N, op, "bias");
  k::matmul_forward_gelu(out.data<bf16>(), pre.data<bf16>(), inp.data<bf16>(), weight.data<bf16>(), bias.data<bf16>(),
                         to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), k::compute_stream());
}

void matmul_backward_dgelu(Tensor& dpre, const Tensor& dout, const Tensor& weight, const Tensor& pre) {
  const char* op = "matmul_backward_dgelu";
  expect(dpre, DType::bf16, op, "dpre");
  expect(dout, DType::bf16, op, "dout");
  expect(weight, DType::bf16, op, "weight");
  expect(pre, DType::bf16, op, "pre");
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(dout);
  FP8T_CHECK(dout.dim(-1) == N, "{}: dout {} does not match weight {}", op, dout.str(), weight.str());
  expect_numel(dpre, M * K, op, "dpre");
  expect_numel(pre, M * K, op, "pre");
  k::matmul_backward_input_dgelu(dpre.data<bf16>(), dout.data<bf16>(), weight.data<bf16>(), pre.data<bf16>(),
                                 to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), k::compute_stream());
}

void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, bool accumulate_dinp) {
  const char* op = "matmul_backward";
  expect(dout, DType::bf16, op, "dout");
  expect(inp, DType::bf16, op, "inp");
  expect(weight, DType::bf16, op, "weight");
  const int64_t N = weight.dim(0), K = weight.dim(1), M = rows_of(inp);
  FP8T_CHECK(inp.dim(-1) == K && dout.dim(-1) == N && rows_of(dout) == M, "{}: dout {}, inp {}, weight {} disagree", op,
             dout.str(), inp.str(), weight.str());
  const cudaStream_t s = k::compute_stream();
  if (dinp) {
    expect(*dinp, DType::bf16, op, "dinp");
    expect_numel(*dinp, M * K, op, "dinp");
    k::matmul_backward_input(dinp->data<bf16>(), dout.data<bf16>(), weight.data<bf16>(), to_int(M, op, "M"),
                             to_int(K, op, "K"), to_int(N, op, "N"), accumulate_dinp, s);
  }
  if (dweight) {
    FP8T_CHECK(dweight->device().is_cuda() && (dweight->dtype() == DType::f32 || dweight->dtype() == DType::bf16),
               "{}: dweight must be a CUDA f32 or bf16 tensor, got {}", op, dweight->str());
    expect_numel(*dweight, N * K, op, "dweight");
    k::matmul_backward_weight(dweight->raw(), dweight->dtype(), dout.data<bf16>(), inp.data<bf16>(),
                              to_int(M, op, "M"), to_int(K, op, "K"), to_int(N, op, "N"), /*accumulate=*/true, s);
  }
  if (dbias) {
    expect_numel(*dbias, N, op, "dbias");
    // The column sums accumulate in f32: a bf16 gradient gets them through an f32 temporary.
    const bool direct = dbias->dtype() == DType::f32;
    FP8T_CHECK(direct || dbias->dtype() == DType::bf16, "{}: dbias must be f32 or bf16, got {}", op, dbias->str());
    Tensor sums = direct ? *dbias : Tensor::zeros({N}, DType::f32, dbias->device(), MemCategory::workspace);
    k::matmul_backward_bias(sums.data<float>(), dout.data<bf16>(), to_int(M, op, "M"), to_int(N, op, "N"), s);
    if (!direct) add_(*dbias, sums);
  }
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b) {
  const char* op = "layernorm_forward";
  expect(inp, DType::bf16, op, "inp");
  expect(out, DType::bf16, op, "out");
  expect(w, DType::bf16, op, "w");
  expect(b, DType::bf16, op, "b");
  expect(mean, DType::f32, op, "mean");
  expect(rstd, DType::f32, op, "rstd");
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  expect_shape(out, inp.shape(), op, "out");
  expect_numel(w, C, op, "w");
  expect_numel(b, C, op, "b");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  k::layernorm_forward(out.data<bf16>(), mean.data<float>(), rstd.data<float>(), inp.data<bf16>(), w.data<bf16>(),
                       b.data<bf16>(), N, to_int(C, op, "C"), k::compute_stream());
}

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  expect(dinp, DType::bf16, op, "dinp");
  expect(dout, DType::bf16, op, "dout");
  expect(inp, DType::bf16, op, "inp");
  expect(w, DType::bf16, op, "w");
  expect(dw, DType::f32, op, "dw");
  expect(db, DType::f32, op, "db");
  expect(mean, DType::f32, op, "mean");
  expect(rstd, DType::f32, op, "rstd");
  const int64_t C = inp.dim(-1), N = rows_of(inp);
  expect_shape(dinp, inp.shape(), op, "dinp");
  expect_shape(dout, inp.shape(), op, "dout");
  expect_numel(w, C, op, "w");
  expect_numel(dw, C, op, "dw");
  expect_numel(db, C, op, "db");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  k::layernorm_backward(dinp.data<bf16>(), dw.data<float>(), db.data<float>(), dout.data<bf16>(), inp.data<bf16>(),
                        w.data<bf16>(), mean.data<float>(), rstd.data<float>(), N, to_int(C, op, "C"),
                        k::compute_stream());
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  expect(inp, DType::bf16, "gelu_forward", "inp");
  expect(out, DType::bf16, "gelu_forward", "out");
  expect_numel(out, inp.numel(), "gelu_forward", "out");
  k::gelu_forward(out.data<bf16>(), inp.data<bf16>(), inp.numel(), k::compute_stream());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  expect(inp, DType::bf16, "gelu_backward", "inp");
  expect(dout, DType::bf16, "gelu_backward", "dout");
  expect(dinp, DType::bf16, "gelu_backward", "dinp");
  expect_numel(dout, inp.numel(), "gelu_backward", "dout");
  expect_numel(dinp, inp.numel(), "gelu_backward", "dinp");
  k::gelu_backward(dinp.data<bf16>(), inp.data<bf16>(), dout.data<bf16>(), inp.numel(), k::compute_stream());
}

void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  expect(a, DType::bf16, "residual_forward", "a");
  expect(b, DType::bf16, "residual_forward", "b");
  expect(out, DType::bf16, "residual_forward", "out");
  expect_numel(b, a.numel(), "residual_forward", "b");
  expect_numel(out, a.numel(), "residual_forward", "out");
  k::residual_forward(out.data<bf16>(), a.data<bf16>(), b.data<bf16>(), a.numel(), k::compute_stream());
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int n_head, const k::AttentionKernels& kernels) {
  const char* op = "attention_forward";
  expect(qkv, DType::bf16, op, "qkv");
  expect(out, DType::bf16, op, "out");
  expect(lse, DType::f32, op, "lse");
  FP8T_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, "{}: qkv must be (B, T, 3C), got {}", op, qkv.str());
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "{}: C={} is not divisible by n_head={}", op, C, n_head);
  expect_shape(out, {B, T, C}, op, "out");
  expect_numel(lse, B * n_head * T, op, "lse");
  k::attention_forward(out.data<bf16>(), lse.data<float>(), qkv.data<bf16>(), to_int(B, op, "B"), to_int(T, op, "T"),
                       n_head, to_int(C / n_head, op, "HS"), k::compute_stream(), kernels);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        int n_head, const k::AttentionKernels& kernels) {
  const char* op = "attention_backward";
  expect(qkv, DType::bf16, op, "qkv");
  expect(dqkv, DType::bf16, op, "dqkv");
  expect(dout, DType::bf16, op, "dout");
  expect(out, DType::bf16, op, "out");
  expect(lse, DType::f32, op, "lse");
  FP8T_CHECK(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, "{}: qkv must be (B, T, 3C), got {}", op, qkv.str());
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  FP8T_CHECK(n_head > 0 && C % n_head == 0, "{}: C={} is not divisible by n_head={}", op, C, n_head);
  expect_shape(dqkv, qkv.shape(), op, "dqkv");
  expect_shape(dout, {B, T, C}, op, "dout");
  expect_shape(out, {B, T, C}, op, "out");
  expect_numel(lse, B * n_head * T, op, "lse");
  // Scratch from the caching allocator: served from the pool after the first step.
  const int64_t dq_floats = k::attention_dq_scratch_floats(to_int(B, op, "B"), to_int(T, op, "T"), n_head,
                                                          to_int(C / n_head, op, "HS"), kernels);
  Tensor dq_accum = Tensor::empty({dq_floats}, DType::f32, qkv.device(), MemCategory::activations);
  Tensor delta = Tensor::empty({B, n_head, T}, DType::f32, qkv.device(), MemCategory::activations);
  k::attention_backward(dqkv.data<bf16>(), dq_accum.data<float>(), delta.data<float>(), dout.data<bf16>(),
                        qkv.data<bf16>(), out.data<bf16>(), lse.data<float>(), to_int(B, op, "B"), to_int(T, op, "T"),
                        n_head, to_int(C / n_head, op, "HS"), k::compute_stream(), kernels);
}

void crossentropy_forward(Tensor& losses, Tensor& lse, Tensor* mean, const Tensor& logits, const Tensor& targets,
                          int64_t vocab_size) {
  const char* op = "crossentropy_forward";
  expect(logits, DType::bf16, op, "logits");
  expect(targets, DType::i32, op, "targets");
  expect(losses, DType::f32, op, "losses");
  expect(lse, DType::f32, op, "lse");
  const int64_t Vp = logits.dim(-1), BT = rows_of(logits);
  FP8T_CHECK(vocab_size > 0 && vocab_size <= Vp, "{}: vocab_size {} outside (0, {}]", op, vocab_size, Vp);
  expect_numel(targets, BT, op, "targets");
  expect_numel(losses, BT, op, "losses");
  expect_numel(lse, BT, op, "lse");
  if (mean) {
    expect(*mean, DType::f32, op, "mean");
    expect_numel(*mean, 1, op, "mean");
  }
  k::crossentropy_forward(losses.data<float>(), lse.data<float>(), mean ? mean->data<float>() : nullptr,
                          logits.data<bf16>(), targets.data<int32_t>(), BT, to_int(vocab_size, op, "vocab_size"),
                          to_int(Vp, op, "Vp"), k::compute_stream());
}

void mean_of(Tensor& mean, const Tensor& values) {
  expect(mean, DType::f32, "mean_of", "mean");
  expect(values, DType::f32, "mean_of", "values");
  expect_numel(mean, 1, "mean_of", "mean");
  k::mean_reduce(mean.data<float>(), values.data<float>(), values.numel(), k::compute_stream());
}

void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                           const Tensor& dloss, float dloss_scale, int64_t vocab_size) {
  const char* op = "crossentropy_backward";
  expect(logits, DType::bf16, op, "logits");
  expect(dlogits, DType::bf16, op, "dlogits");
  expect(targets, DType::i32, op, "targets");
  expect(lse, DType::f32, op, "lse");
  expect(dloss, DType::f32, op, "dloss");
  const int64_t Vp = logits.dim(-1), BT = rows_of(logits);
  FP8T_CHECK(vocab_size > 0 && vocab_size <= Vp, "{}: vocab_size {} outside (0, {}]", op, vocab_size, Vp);
  expect_shape(dlogits, logits.shape(), op, "dlogits");
  expect_numel(targets, BT, op, "targets");
  expect_numel(lse, BT, op, "lse");
  expect_numel(dloss, 1, op, "dloss");
  k::crossentropy_backward(dlogits.data<bf16>(), logits.data<bf16>(), lse.data<float>(), targets.data<int32_t>(),
                           dloss.data<float>(), dloss_scale, BT, to_int(vocab_size, op, "vocab_size"),
                           to_int(Vp, op, "Vp"), k::compute_stream());
}

}  // namespace fp8t::cuda_ops
#endif  // FP8T_HAVE_CUDA
