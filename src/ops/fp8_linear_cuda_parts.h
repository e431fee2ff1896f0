// The pieces of the FP8 linear's CUDA path that its forward and backward stages (fp8_linear_cuda.cpp,
// fp8_linear_backward_cuda.cpp) share with its weight handling (fp8_weight_cuda.cpp: the per-version weight cache and
// the sharded-master publishing) and with the residual add that casts ahead (add_cuda.cpp): device scale slots, the
// current-scaling amax pass, GEMM operands and per-tensor code buffers; and what the forward stage keeps for the
// backward stage (Fp8LinearSaved).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "fp8/quantized_tensor.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/matmul.cuh"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_cuda.h"

namespace fp8t::detail {

// Role r's slot among a state's device slots (fp8/device_meta.h).
inline Fp8DeviceSlot* slot(Fp8DeviceSlot* slots, Fp8Role r) { return slots + static_cast<int>(r); }

// Scale-from-tensor recipes (current scaling): the amax of t (of what the cast reads: the prologue's values
// with those operands) and the scale from it, on the device, into the slot before the cast. Otherwise the
// slot already holds the step's scale.
void prepare_scale(const Fp8TensorMeta& meta, Fp8DeviceSlot* s, const Tensor& t, cudaStream_t stream,
                   kernels::Fp8CastInput input = kernels::Fp8CastInput::as_is, kernels::Fp8CastOperands ops = {});

// Where a cast records its statistics: the slot's amax and saturation count.
inline kernels::Fp8CastOutputs stats_into(Fp8DeviceSlot* s) { return {&s->amax, &s->saturated}; }

// q as a cuBLASLt operand: its codes (or, transposed, codes_t) and the device pointer to its scale_inv.
kernels::MatmulOperand operand(const QuantizedTensor& q, bool transposed);

// Per-tensor FP8 codes (rows, cols), optionally with their transposed copy, scaled by `scale_inv` (1 f32).
QuantizedTensor per_tensor_codes(int64_t rows, int64_t cols, DType dt, Device dev, bool row_major, bool transposed,
                                 MemCategory cat, MemCategory cat_t, Tensor scale_inv);

// The (OC, IC) and (IC, OC) FP8 copies of the weight w (its bf16 compute copy or f32 master) for st's
// weight_version, cast in one pass; nothing when they are current.
void cache_weight_cuda(Fp8LinearState& st, const Tensor& w, Fp8DeviceSlot* slots, cudaStream_t stream);

// A tensor the FP8 linear reads or writes on the device: CUDA, of this dtype (layer: the linear's name).
inline void expect_cuda(const Tensor& t, DType dtype, const char* what, const std::string& layer) {
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
  std::weak_ptr<GradCell> ln_residual;  // residual_dy_cell(x) (autograd/tape.h)
};

// The backward stage (fp8_linear_backward_cuda.cpp): the node the forward stage records.
void backward_stage(const Fp8LinearSaved& s);

}  // namespace fp8t::detail
