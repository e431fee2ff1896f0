// One LayerNorm backward's inputs for the GPU tests of what the backward writes beside dinp (dy codes, column sums):
// random rows x (N, C), weight and bias, dout, a random dinp to start from (the backward accumulates), and the
// forward's mean and rstd; and the parameters of those tests' residual branches (bf16_param).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "util/gpu_test_util.h"

namespace fp8t::test {

struct LayerNormBackwardCase {
  int64_t N = 0;
  int C = 0;
  Tensor x, w, lb, dout, mean, rstd;
  std::vector<float> dinp0;

  struct Result {
    Tensor dinp, dw, db;  // on the device: dinp from dinp0, dw and db from zero
  };
  // The backward with dy (the codes or column sums asked for; null: the plain backward).
  Result run(const kernels::LayerNormDyCodes* dy) const {
    Result r{upload(dinp0, {N, C}, DType::bf16), Tensor::zeros({C}, DType::f32, kGpu),
             Tensor::zeros({C}, DType::f32, kGpu)};
    kernels::layernorm_backward(r.dinp.data<__nv_bfloat16>(), r.dw.data<float>(), r.db.data<float>(),
                                dout.data<__nv_bfloat16>(), x.data<__nv_bfloat16>(), w.data<__nv_bfloat16>(),
                                mean.data<float>(), rstd.data<float>(), N, C, kernels::compute_stream(), dy);
    return r;
  }
};

// A parameter of the residual-branch tests: bf16 values on the GPU (rounded from `v`), a zeroed f32 gradient.
inline Var bf16_param(std::vector<float> v, Shape s) {
  Var p = make_var(upload(round_bf16(std::move(v)), s, DType::bf16), true);
  p->grad = Tensor::zeros(s, DType::f32, kGpu, MemCategory::gradients);
  return p;
}

inline LayerNormBackwardCase make_layernorm_case(int64_t N, int C) {
  LayerNormBackwardCase l;
  l.N = N, l.C = C;
  l.x = upload(round_bf16(randn(N * C, 2.0f)), {N, C}, DType::bf16);
  l.w = upload(round_bf16(randn(C, 0.5f)), {C}, DType::bf16);
  l.lb = upload(round_bf16(randn(C, 0.1f)), {C}, DType::bf16);
  l.dout = upload(round_bf16(randn(N * C)), {N, C}, DType::bf16);
  l.dinp0 = round_bf16(randn(N * C, 0.5f));
  Tensor normed = poisoned({N, C}, DType::bf16);
  l.mean = poisoned({N}, DType::f32);
  l.rstd = poisoned({N}, DType::f32);
  kernels::layernorm_forward(normed.data<__nv_bfloat16>(), l.mean.data<float>(), l.rstd.data<float>(),
                             l.x.data<__nv_bfloat16>(), l.w.data<__nv_bfloat16>(), l.lb.data<__nv_bfloat16>(), N, C,
                             kernels::compute_stream());
  return l;
}

}  // namespace fp8t::test
