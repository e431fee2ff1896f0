// CUDA launcher of the add op (see add_cuda.h): check devices, dtypes and sizes, then call kernels/add.cuh on
// the compute stream.
#include "ops/add_cuda.h"

#include "kernels/add.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_cuda_parts.h"
#include "ops/op_checks.h"

namespace fp8t::cuda_ops {

using namespace ops_detail;
using bf16 = __nv_bfloat16;
namespace k = fp8t::kernels;

namespace {

// b_bias's data (null without one), checked against out's row length C, which the caller has checked is positive.
const bf16* bias_of(const Tensor* b_bias, int64_t C, const char* op) {
  if (!b_bias) return nullptr;
  expect(*b_bias, DType::bf16, op, "b_bias");
  expect_numel(*b_bias, C, op, "b_bias");
  return b_bias->data<bf16>();
}

}  // namespace

void add_forward(Tensor& out, const Tensor& a, const Tensor& b, const Tensor* b_bias) {
  expect(a, DType::bf16, "add_forward", "a");
  expect(b, DType::bf16, "add_forward", "b");
  expect(out, DType::bf16, "add_forward", "out");
  expect_numel(b, a.numel(), "add_forward", "b");
  expect_numel(out, a.numel(), "add_forward", "out");
  // Only a bias needs out in rows; without one any shape adds.
  FP8T_CHECK(!b_bias || (out.ndim() >= 1 && out.dim(-1) > 0), "add_forward: out {} has no rows for a bias", out.str());
  const int64_t C = b_bias ? out.dim(-1) : 0;
  const bf16* bias = bias_of(b_bias, C, "add_forward");
  k::add_forward(out.data<bf16>(), a.data<bf16>(), b.data<bf16>(), a.numel(), k::compute_stream(), bias,
                 to_int(C, "add_forward", "C"));
}

void add_forward_row_stats(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           Fp8LnCastAhead* ahead, Tensor* normed, const Tensor* norm_w, const Tensor* norm_b,
                           const Tensor* b_bias) {
  const char* op = "add_forward_row_stats";
  expect(a, DType::bf16, op, "a");
  expect(b, DType::bf16, op, "b");
  expect(out, DType::bf16, op, "out");
  expect(mean, DType::f32, op, "mean");
  expect(rstd, DType::f32, op, "rstd");
  FP8T_CHECK(out.ndim() >= 1 && out.dim(-1) > 0, "{}: out {} has no rows", op, out.str());
  const int64_t C = out.dim(-1), N = out.numel() / C;
  expect_numel(a, out.numel(), op, "a");
  expect_numel(b, out.numel(), op, "b");
  expect_numel(mean, N, op, "mean");
  expect_numel(rstd, N, op, "rstd");
  FP8T_CHECK(out.raw() != a.raw() && out.raw() != b.raw(), "{}: out must not alias a or b", op);
  const bf16* bias = bias_of(b_bias, C, op);
  if (normed) {
    FP8T_CHECK(!ahead && norm_w && norm_b, "{}: the LayerNorm output needs its weight and bias and no cast ahead", op);
    expect(*normed, DType::bf16, op, "normed");
    expect_numel(*normed, out.numel(), op, "normed");
    for (const Tensor* t : {norm_w, norm_b}) {
      expect(*t, DType::bf16, op, "the LayerNorm weight or bias");
      expect_numel(*t, C, op, "the LayerNorm weight or bias");
    }
    FP8T_CHECK(normed->raw() != out.raw() && normed->raw() != a.raw() && normed->raw() != b.raw(),
               "{}: normed must not alias out, a or b", op);
    k::add_layernorm_forward(out.data<bf16>(), normed->data<bf16>(), mean.data<float>(), rstd.data<float>(),
                             a.data<bf16>(), b.data<bf16>(), norm_w->data<bf16>(), norm_b->data<bf16>(), N,
                             to_int(C, op, "C"), k::compute_stream(), bias);
    return;
  }
  if (!ahead) {
    k::add_layernorm_stats(out.data<bf16>(), mean.data<float>(), rstd.data<float>(), a.data<bf16>(), b.data<bf16>(),
                           N, to_int(C, op, "C"), k::compute_stream(), bias);
    return;
  }
  FP8T_CHECK(ahead->st && ahead->ln_w && ahead->ln_b, "{}: a cast ahead without its linear or LayerNorm", op);
  const Tensor &ln_w = ahead->ln_w->value, &ln_b = ahead->ln_b->value;
  expect(ln_w, DType::bf16, op, "the LayerNorm weight");
  expect(ln_b, DType::bf16, op, "the LayerNorm bias");
  expect_numel(ln_w, C, op, "the LayerNorm weight");
  expect_numel(ln_b, C, op, "the LayerNorm bias");
  Fp8LinearState& st = *ahead->st;
  Fp8DeviceSlot* sx = detail::slot(st.device.slots(out.device(), st.metas()), Fp8Role::input);
  Tensor codes = Tensor::empty({N, C}, fp8_dtype(st.formats.forward), out.device(), MemCategory::workspace);
  k::add_layernorm_cast(out.data<bf16>(), mean.data<float>(), rstd.data<float>(), codes.data<uint8_t>(),
                        a.data<bf16>(), b.data<bf16>(), ln_w.data<bf16>(), ln_b.data<bf16>(), N, to_int(C, op, "C"),
                        st.formats.forward, &sx->scale, grad_enabled() ? detail::stats_into(sx) : k::Fp8CastOutputs{},
                        k::compute_stream(), bias);
  ahead->codes = std::move(codes);
}

}  // namespace fp8t::cuda_ops
