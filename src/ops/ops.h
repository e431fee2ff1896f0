// Ops: check shapes and dtypes, allocate outputs, dispatch to the CPU reference (f32/f64) or a
// CUDA launcher (bf16/f32), and record the backward node on the current tape.
// Layout conventions (fixed alphabet): B batch, T time, C channels, OC out channels, NH heads,
// HS head size, V vocabulary (real), Vp padded vocabulary.
#pragma once
#include <memory>
#include <optional>

#include "autograd/tape.h"
#include "core/tensor.h"
#include "core/tensor_ops.h"  // the tensor utilities, for the ops' users

namespace fp8t {

// run.gemm_autotune: time cuBLASLt's candidate algorithms for each new GEMM shape on `device`
// (kernels/matmul.cuh, its GEMM context's options); a no-op for the CPU and in builds without CUDA.
void set_gemm_autotune(Device device, bool on);

// ---- Differentiable ops ----
// tokens: i32 (B, T); wte (Vp, C); wpe (maxT, C)  ->  (B, T, C)
Var embedding(const Tensor& tokens, const Var& wte, const Var& wpe);
// Where a linear adds its bias b: in its GEMM (cuBLASLt's bias epilogue on CUDA), or not at all (in_reader), leaving it
// to the op that reads the output, the residual add after proj and fc2 (add's b_bias): cuBLASLt's GEMMs ran 10-12%
// faster without the epilogue (docs/perf-notes.md, thirty-eighth session). The linear takes b's gradient either way
// (the column sums of its output gradient), so its output must have no other reader.
enum class LinearBias { in_gemm, in_reader };
// x (..., IC); w (OC, IC); b (OC) or nullptr  ->  (..., OC) = x @ w^T + b (x @ w^T with LinearBias::in_reader)
Var linear(const Var& x, const Var& w, const Var& b, LinearBias bias_at = LinearBias::in_gemm);
// x (..., C); w, b (C)  ->  (..., C); eps 1e-5
Var layernorm(const Var& x, const Var& w, const Var& b);
// tanh-approximate GELU, elementwise. store_fp8: the forward (recorded or not) runs on x's FP8 round trip, which
// overwrites x's value in place (pass an x that nothing else reads unrounded: in GPT, the fc output), and with a
// gradient to compute x is kept for backward as those FP8 codes (fp8/saved.h).
Var gelu(const Var& x, bool store_fp8 = false);
// linear(gelu(linear(x, w1, b1)), w2, b2). On CUDA in BF16 the GELU runs in the GEMM epilogues (forward:
// GELU with the pre-activation kept; backward: d(GELU) on the second GEMM's input gradient).
Var gelu_mlp(const Var& x, const Var& w1, const Var& b1, const Var& w2, const Var& b2,
             LinearBias b2_at = LinearBias::in_gemm);
// LayerNorm's statistics of each row (last dimension) of a tensor: mean and rstd (eps 1e-5), f32, one per row,
// as the LayerNorm ops compute them. Undefined tensors: not computed.
struct Fp8LnCastAhead;  // ops/fp8_linear.h
struct RowStats {
  Tensor mean, rstd;
  // Optional, set before add() (fp8_ln_cast_ahead): the FP8 LayerNorm linear that reads the sum next, whose input
  // cast the add then does in the same pass where it can (the codes are left in it for that linear).
  std::shared_ptr<Fp8LnCastAhead> cast_ahead = nullptr;
  // Optional, set before add() in place of cast_ahead: the bf16 LayerNorm (weight, bias) that reads the sum next.
  // On CUDA the add then writes that LayerNorm's output in the same pass and records its node, and leaves
  // `normed` = layernorm(sum, norm_w, norm_b), bit for bit, for the caller to use instead of calling layernorm
  // (elsewhere `normed` stays undefined). Its output counts under ActivationRole `norm_role` (if set).
  Var norm_w = nullptr, norm_b = nullptr;
  const char* norm_role = nullptr;
  Var normed = nullptr;
  bool defined() const { return mean.defined() && rstd.defined(); }
};
// a + b, same shape. stats (optional): on CUDA (bf16), the sum's RowStats computed in the same pass, bit for bit
// what fp8_linear_ln would compute from the sum (a residual add feeding an FP8 LayerNorm linear); elsewhere left
// undefined. With stats->cast_ahead set, the same pass also writes that linear's input codes where
// fp8_ln_cast_ahead's conditions hold (CUDA; where the sum needs a gradient or none is recorded). With
// stats->norm_w and norm_b set, it writes the LayerNorm's output instead (stats->normed).
// b_bias (optional, one value per column): the bias of the linear that wrote b and left it out (LinearBias::in_reader;
// cuBLASLt's GEMMs run 10-12% faster without the bias epilogue): out = a + (b + b_bias), summed in f32 (bf16 on CUDA)
// and rounded once. Its gradient is that linear's (the column sums of b's gradient), so none is taken here.
Var add(const Var& a, const Var& b, RowStats* stats = nullptr, const Var& b_bias = nullptr);
// layernorm(x, w, b), or the output the add that made x wrote (from_add->normed, taken from it) where it did.
Var layernorm(const Var& x, const Var& w, const Var& b, RowStats* from_add);
// qkv (B, T, 3C) laid out [q | k | v], heads contiguous in C  ->  causal attention output (B, T, C)
// store_fp8: forward (recorded or not) and backward run on qkv's FP8 round trip, and with a gradient to compute qkv
// is kept for backward as those FP8 codes. On CUDA with head size 64 on a Hopper the kernels read the codes
// themselves; elsewhere the dequantized values overwrite qkv's value in place, as in gelu.
Var attention(const Var& qkv, int n_head, bool store_fp8 = false);
// logits (B, T, Vp); targets i32 (B, T) in [0, V)  ->  scalar mean cross-entropy over the real
// vocabulary V (columns >= V never enter the softmax). Backward writes d(logits) in one pass.
Var cross_entropy(const Var& logits, const Tensor& targets, int64_t vocab_size);
// cross_entropy(linear(h, w, nullptr), targets, vocab_size) without ever holding the whole (B, T, Vp)
// logits: chunk_rows tokens at a time, and, when recording, the gradients for the loss-gradient seed
// `grad_scale` computed right away (d(w) into w's gradient, d(h) kept for the backward pass, which
// must then be seeded with grad_scale: the tape checks).
Var lm_head_loss(const Var& h, const Var& w, const Tensor& targets, int64_t vocab_size, int64_t chunk_rows,
                 float grad_scale = 1.0f);

}  // namespace fp8t
