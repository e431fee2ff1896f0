// Variable: a tensor in the autograd graph, with its gradient and whether it needs one.
#pragma once
#include <any>
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace fp8t {

// A gradient not written yet: the GELU backward of d gelu(v), left for the backward of v's producer to
// apply inside its own pass over it (an FP8 linear's output-gradient cast, ops/fp8_linear.h), so that
// v's gradient is never stored. Whoever else touches v's gradient gets it written first (settle_grad),
// so correctness never depends on who reads it.
struct PendingGrad {
  Tensor operand;                 // d gelu(v), v's shape and dtype; undefined: nothing pending
  std::function<Tensor()> input;  // v's value (or its FP8 round trip) for gelu'(v)
  // Optionally that round trip's compact form: (rows, cols) E4M3 codes and an f32 scale_inv per row
  // (fp8/saved.h), which a producer's fused pass may read instead of calling input().
  Tensor input_codes, input_row_scale_inv;
  // v's gradient gelu'(v) * operand in a fresh tensor, bit for bit what the producer's fused pass reads.
  std::function<Tensor(const Tensor& operand, const Tensor& input)> materialize;
  // Work the op that left the gradient pending deferred to whoever takes it (fp8_all's FP8 MLP: fc2's wgrad, whose
  // operand, gelu(v)'s transposed E4M3 codes, fc's fused pass over input_codes can write on the way): `gelu_t`
  // ((cols, rows) codes) and `gelu_scale` (1 f32) say where and with which scale; then(written) runs the deferred
  // work, written saying whether the taker wrote gelu_t (else then() casts it itself). Whoever takes the pending
  // gradient calls then() exactly once (settle_grad does, with false).
  Tensor gelu_t, gelu_scale;
  std::function<void(bool written)> then;
  // Or v's gradient already cast as its producer asked (GradCell::fp8_dy): E5M2 codes (rows, cols) and / or codes_t
  // (cols, rows) with the producer's scale, and `dy_stats`, what that cast would have added to its statistics
  // (kernels/fp8_cast.cuh: cast_stats_floats), for the producer to add into its own. operand and input are then
  // undefined, and materialize(Tensor(), Tensor()) writes the bf16 gradient instead, exactly (it runs the op's
  // backward again).
  Tensor dy_codes, dy_codes_t, dy_stats;
  bool defined() const { return operand.defined() || dy_codes.defined() || dy_codes_t.defined(); }
};

// Set by an FP8 linear's forward on its output v's cell where its backward would cast v's gradient to E5M2 with a
// scale known before the cast (ops/fp8_linear_cuda.cpp): the op that computes that gradient may leave it pending as
// those codes (PendingGrad::dy_codes) instead of bf16; the attention backward does (ops/attention.cpp).
struct Fp8DyRequest {
  const float* scale = nullptr;          // on the device, valid for the step: codes = to_fp8(bf16(dy) * *scale)
  bool codes = false, codes_t = false;   // what the linear's backward reads: dgrad's operand, wgrad's
  bool colsum = false;                   // whether its bias takes dy's column sums (PendingGrad::dy_stats)
};

// A Var's gradient, in a cell of its own so a backward closure can hold it (GradRef) without keeping
// the Var's value alive: an op's output is then freed as soon as no node saved it for backward.
struct GradCell {
  Tensor grad;               // allocated on first accumulation, or a view of the flat gradient buffer
  PendingGrad pending;       // a gradient kept unwritten (grad is then undefined)
  bool takes_pending = false;  // set by the Var's producer in forward: its backward consumes `pending`
  std::shared_ptr<const Fp8DyRequest> fp8_dy;  // set by the Var's producer in forward, with takes_pending
  // Set by add(a, b) on its output's cell where b's producer takes b's gradient as dy codes (b's fp8_dy) or its column
  // sums (dy_colsum_request) and runs its backward right after the add's (ops/add.cpp: b gets the sum's gradient as
  // it is): b's cell, and the add's node.
  // The op recorded right after the add, whose backward is the last to add into the sum's gradient, may leave that
  // gradient's final value in b's cell as those dy codes (residual_dy_cell, autograd/tape.h: the LayerNorm backward
  // of an FP8 LayerNorm linear does, ops/layernorm_cuda.h).
  std::weak_ptr<GradCell> residual_b;
  uint64_t residual_tape = 0;
  size_t residual_node = 0;
  // Set by a BF16 linear (or gelu_mlp) with a bias on its output's cell in forward (ops/linear.cpp): the op that
  // finishes this gradient may also sum its columns, (C) f32, into `dy_colsum` (the LayerNorm backward after a residual
  // add does, as with fp8_dy above, and the attention backward for qkv, ops/attention.cpp); the linear's backward then
  // adds those into its bias gradient instead of summing dy itself (take_dy_colsum, ops/op_common.h).
  bool dy_colsum_request = false;
  Tensor dy_colsum;
  // Where set, supplies `grad` (zero-filled) when it is first needed instead of a fresh tensor: a
  // parameter whose gradient lives in a staging bucket allocated on demand (ZeRO-2, dist/zero.h).
  // Such a gradient counts as existing (grad_exists), so ops accumulate into it and never assign one.
  std::function<Tensor()> make_grad;
  // Set on a parameter by ParameterStore::zero_grads_deferred: `grad` still holds the last step's values. The first
  // op that writes it this step either overwrites it (grad_for_write: a weight-gradient GEMM with beta 0) or, through
  // grad_of / grad_exists, finds it zeroed first; ParameterStore::zero_stale_grads zeroes any left untouched.
  bool stale = false;
  // A parameter's persistent accumulator (ParameterStore::arm_accumulators, where the gradient is not f32): an op
  // that sums into f32 and adds that into the gradient once (ops/grad_sink.h) takes it instead of a zero-filled
  // temporary while `accumulator_armed` says it is zero and unused in this micro-step. `accumulator_deferred`: that
  // add is left to ParameterStore::commit_accumulators (`accumulator_pending` until then).
  Tensor accumulator;
  bool accumulator_armed = false, accumulator_deferred = false, accumulator_pending = false;
  // Set by the Var's producer right after recording its node (mark_gradient_read_only, autograd/tape.h): the
  // tape (by id; 0: not marked) and index of that node, which reads this gradient and never writes into it, and
  // the gradient cells it writes (a fixed array: this is set for several ops per layer on the host's hot path). An
  // add recorded right after may hand this Var its own output's gradient buffer instead of a copy (ops/add.cpp).
  static constexpr size_t kMaxReadOnlyWrites = 5;
  uint64_t read_only_tape = 0;
  size_t read_only_node = 0;
  size_t read_only_n_writes = 0;
  std::array<const GradCell*, kMaxReadOnlyWrites> read_only_writes{};
};

struct VarImpl {
  Tensor value;
  std::shared_ptr<GradCell> grad_cell = std::make_shared<GradCell>();
  Tensor& grad = grad_cell->grad;  // read it through grad_of, which writes a pending gradient first
  bool requires_grad = false;
  std::string name;
  // Set when `value` was released after the forward pass to save memory: rebuilds it (without
  // recording) the first time a backward closure asks for it (value_of in autograd/tape.h).
  std::function<Tensor()> recompute;
  // Set beside `recompute` where the released value is rebuilt from a compact form that an op keeps anyway
  // (an FP8 linear's input codes for its weight gradient, a QuantizedTensor): a backward that can read that
  // form takes it here (std::any_cast) instead of asking value_of for the rebuilt value. Empty otherwise.
  std::any released_form;
};
using Var = std::shared_ptr<VarImpl>;

// A handle on a Var's gradient alone (shape, dtype and device to create it lazily).
struct GradRef {
  std::shared_ptr<GradCell> cell;
  Shape shape;
  DType dtype;
  Device device;
  bool requires_grad;
};
inline GradRef grad_ref(const Var& v) {
  return {v->grad_cell, v->value.shape(), v->value.dtype(), v->value.device(), v->requires_grad};
}

inline Var make_var(Tensor value, bool requires_grad = false, std::string name = {}) {
  auto v = std::make_shared<VarImpl>();
  v->value = std::move(value);
  v->requires_grad = requires_grad;
  v->name = std::move(name);
  return v;
}

// The gradient buffer of v, zero-filled on first use (category activations for intermediates, or what
// the cell's make_grad supplies); a pending gradient is written first.
Tensor& grad_of(const Var& v);
Tensor& grad_of(const GradRef& g);

// Writes a pending gradient into cell.grad (which must be undefined then); a no-op when none is pending.
void settle_grad(GradCell& cell);
// Whether the gradient exists, a pending one written first (and one with make_grad made): an op that can
// write a new gradient instead of accumulating into a zero-filled one asks this.
bool grad_exists(const GradRef& g);
bool grad_exists(const Var& v);
// Clears a stale mark (GradCell::stale) where its gradient is being written; inside a CUDA graph capture, at every
// replay too (a replay writes the gradient again without the host code that cleared the mark).
void clear_stale(GradCell& cell);

}  // namespace fp8t
