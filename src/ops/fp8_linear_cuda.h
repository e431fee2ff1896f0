// The CUDA path of the FP8 linear ops (src/ops/fp8_linear.cpp dispatches to it): cuBLASLt FP8 GEMMs, the
// fused casts with their input prologues, FP8 activation storage and the backward node.
#pragma once
#include "autograd/variable.h"
#include "kernels/fp8_cast.cuh"
#include "ops/fp8_linear.h"
#include "ops/ops.h"

namespace fp8t::detail {

// The linear's input as a function of the Var x that fp8_linear_cuda takes, computed inside x's FP8
// cast (kernels/fp8_cast.cuh, Fp8CastInput) and never stored: x itself; gelu(x), x the MLP's
// pre-activation; or layernorm(x, ln_w, ln_b), x the residual stream.
struct InputPrologue {
  kernels::Fp8CastInput kind = kernels::Fp8CastInput::as_is;
  Var ln_w{}, ln_b{};  // layernorm: (IC) bf16 weight and bias
  // gelu: nothing reads x after this op (the caller gave up its last handle), so a cast that reads x's saved
  // codes leaves x's value as it was instead of writing the round trip over it.
  bool last_reader = false;
  // layernorm: x's statistics where the add that wrote x computed them (add's RowStats); else the forward
  // computes them.
  RowStats ln_stats{};
};

// x (..., IC) -> (..., OC), the linear applied to input.kind of x. Backward turns the dgrad output (the
// gradient of the prologue's output) into x's gradient with the GELU or LayerNorm backward kernel
// (the latter also adds ln_w's and ln_b's). A prologue needs FP8 storage (checked by the callers):
// bf16 storage would keep the prologue's output to re-cast it in backward. Arguments checked by the caller.
// serve_input: as fp8_linear's (src/ops/fp8_linear.h), for an as_is input.
Var fp8_linear_cuda(const Var& x, const Var& w, const Var& b, Fp8LinearState& st, const InputPrologue& input = {},
                    bool serve_input = false, LinearBias bias_at = LinearBias::in_gemm);

// The CUDA side of Fp8LinearState's sharded-master weight publishing (src/ops/fp8_linear.h): the amax of a
// piece of the master into *amax, the weight's device scale from a reduced amax, a piece's cast into codes
// (statistics into the weight's device slot), and the adopted codes' transposed copy.
void fp8_weight_piece_amax_cuda(const Tensor& piece, float* amax);
void fp8_weight_scale_from_amax_cuda(Fp8LinearState& st, const Tensor& amax, int64_t index);
void fp8_cast_weight_piece_cuda(Fp8LinearState& st, const Tensor& piece, Tensor& codes);
void fp8_adopt_weight_codes_cuda(Fp8LinearState& st, const Tensor& codes);

}  // namespace fp8t::detail
