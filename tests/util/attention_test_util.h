// The attention GPU tests' shared cases. One forward of a lab kernel beside the product's and the CPU reference.
// One attention backward's inputs for the GPU tests of what the backward writes beside (or instead of) dqkv: random
// qkv (B, T, 3C), head size 64, in the forms the kernels read (bf16 or its saved E4M3 codes; O bf16 or its transposed
// E4M3 codes), the forward's O and lse, a random dout, and the plain backward's dqkv as the reference.
#pragma once
#include <cstdint>
#include <vector>

#include "fp8/saved.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "ops/attention_cuda.h"
#include "ops/cpu/attention.h"
#include "util/gpu_test_util.h"

namespace fp8t::test {

struct AttentionBackwardCase {
  int B = 0, T = 0, NH = 0, C = 0;
  int64_t M = 0;  // B * T
  bool qkv_codes = false, out_codes = false;
  Tensor qkv, out, lse, dout;
  QuantizedTensor saved, out_q;  // qkv's codes (always made), O's transposed codes (where out_codes)

  // The forms the backward reads, as cuda_ops::attention_backward_dy_codes and _colsum take them.
  cuda_ops::AttentionSaved forms() const {
    return {.qkv = qkv_codes ? nullptr : &qkv, .qkv_codes = qkv_codes ? &saved : nullptr,
            .out = out_codes ? nullptr : &out, .out_codes = out_codes ? &out_q : nullptr};
  }
  // The plain backward (accumulate false) into a NaN-poisoned dqkv, downloaded.
  std::vector<float> plain_dqkv() const {
    Tensor dqkv = poisoned({B, T, 3 * C}, DType::bf16);
    if (qkv_codes && out_codes) cuda_ops::attention_backward(dqkv, dout, saved, out_q, lse, NH, false);
    else if (qkv_codes) cuda_ops::attention_backward(dqkv, dout, saved, out, lse, NH, false);
    else if (out_codes) cuda_ops::attention_backward(dqkv, dout, qkv, out_q, lse, NH, false);
    else cuda_ops::attention_backward(dqkv, dout, qkv, out, lse, NH, false);
    return download(dqkv);
  }
};

// out_codes needs B * T a multiple of 16 (O's transposed codes).
inline AttentionBackwardCase make_attention_case(int B, int T, int NH, bool qkv_codes, bool out_codes) {
  AttentionBackwardCase a;
  a.B = B, a.T = T, a.NH = NH, a.C = NH * 64, a.M = int64_t(B) * T;
  a.qkv_codes = qkv_codes, a.out_codes = out_codes;
  const int C = a.C;
  a.qkv = upload(round_bf16(randn(a.M * 3 * C, 1.0f)), {B, T, 3 * C}, DType::bf16);
  a.saved = fp8_save(a.qkv, nullptr);
  const Tensor qkv_read = qkv_codes ? fp8_restore(a.saved, MemCategory::workspace) : a.qkv;  // what the kernels read
  a.out = poisoned({B, T, C}, DType::bf16);
  a.lse = poisoned({B, NH, T}, DType::f32);
  cuda_ops::attention_forward(a.out, a.lse, qkv_read, NH);
  if (out_codes) {  // O's transposed E4M3 codes, as the projection keeps them (scale 1: values are small)
    a.out_q.codes_t = Tensor::empty({C, a.M}, DType::e4m3, kGpu);
    a.out_q.scale_inv = upload({1.0f}, {1}, DType::f32);
    a.out_q.layout = ScaleLayout::per_tensor;
    a.out_q.shape = {a.M, C};
    kernels::fp8_cast(a.out.raw(), DType::bf16, a.M, C, nullptr, a.out_q.codes_t.data<uint8_t>(), Fp8Format::e4m3,
                      a.out_q.scale_inv.data<float>(), {}, kernels::compute_stream());
  }
  a.dout = upload(round_bf16(randn(a.M * C)), {B, T, C}, DType::bf16);
  return a;
}

// A head-size-64 forward of a lab kernel, lab(out, lse, qkv) on device pointers, beside the product's
// (cuda_ops::attention_forward) on the same fresh bf16 qkv (B, T, 3C), both into NaN-poisoned outputs, downloaded
// with the CPU reference's.
struct AttentionForwardPair {
  std::vector<float> got, got_lse, want, want_lse, ref, ref_lse;  // the lab's, the product's, the CPU reference's
};
template <typename Lab>
AttentionForwardPair attention_forward_pair(int B, int T, int NH, Lab lab) {
  const int C = NH * 64;
  const auto qkv = round_bf16(randn(int64_t(B) * T * 3 * C));
  const Tensor tqkv = upload(qkv, {B, T, 3 * C}, DType::bf16);
  Tensor out = poisoned({B, T, C}, DType::bf16), lse = poisoned({B, NH, T}, DType::f32);
  Tensor pout = poisoned({B, T, C}, DType::bf16), plse = poisoned({B, NH, T}, DType::f32);
  lab(out.data<__nv_bfloat16>(), lse.data<float>(), tqkv.data<__nv_bfloat16>());
  cuda_ops::attention_forward(pout, plse, tqkv, NH);
  AttentionForwardPair r{download(out), download(lse), download(pout), download(plse), {}, {}};
  r.ref.resize(r.got.size());
  r.ref_lse.resize(r.got_lse.size());
  cpu::attention_forward(r.ref.data(), r.ref_lse.data(), qkv.data(), B, T, C, NH);
  return r;
}

}  // namespace fp8t::test
