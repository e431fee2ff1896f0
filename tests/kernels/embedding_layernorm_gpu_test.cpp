// Embedding and LayerNorm kernels against the CPU reference (bf16 activations, f32 gradients).
#include <catch2/catch_test_macros.hpp>

#include <tuple>

#include "util/gpu_test_util.h"
#include "autograd/tape.h"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "ops/add_cuda.h"
#include "ops/cpu/embedding.h"
#include "ops/cpu/layernorm.h"
#include "ops/embedding_cuda.h"
#include "ops/layernorm_cuda.h"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("embedding forward and backward", "[gpu][embedding]") {
  struct Case { int B, T, C, Vp, maxT; };
  for (auto [B, T, C, Vp, maxT] : {Case{1, 1, 8, 5, 4}, Case{2, 77, 96, 1000, 128}, Case{4, 256, 768, 512, 1024}}) {
    const auto tokens = randint(size_t(B) * T, Vp);
    const auto wte = round_bf16(randn(size_t(Vp) * C)), wpe = round_bf16(randn(size_t(maxT) * C));
    Tensor out = poisoned({B, T, C}, DType::bf16);
    Tensor ttok = upload_i32(tokens, {B, T});
    cuda_ops::embedding_forward(out, ttok, upload(wte, {Vp, C}, DType::bf16), upload(wpe, {maxT, C}, DType::bf16));
    std::vector<float> ref(size_t(B) * T * C);
    cpu::embedding_forward(ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    CHECK(rel_err(download(out), ref) < 1e-2);

    const auto dout = round_bf16(randn(size_t(B) * T * C));
    auto dwte0 = randn(size_t(Vp) * C), dwpe0 = randn(size_t(maxT) * C);
    Tensor dwte = upload(dwte0, {Vp, C}, DType::f32), dwpe = upload(dwpe0, {maxT, C}, DType::f32);
    cuda_ops::embedding_backward(dwte, dwpe, upload(dout, {B, T, C}, DType::bf16), ttok);
    cpu::embedding_backward(dwte0.data(), dwpe0.data(), dout.data(), tokens.data(), B, T, C);
    CHECK(rel_err(download(dwte), dwte0) < 1e-5);
    CHECK(rel_err(download(dwpe), dwpe0) < 1e-5);
  }
}

TEST_CASE("layernorm forward and backward", "[gpu][layernorm]") {
  // C = 100: the scalar path; 4104: past the one-pass kernel's 4096 (two kernels); N = 3001 with C = 1600:
  // row groups looping over a grid of 3 blocks per SM, and a partial last group.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 32}, {77, 100}, {1024, 768}, {333, 1600}, {3001, 1600},
                      {64, 4104}, {40, 2056}}) {
    auto x = round_bf16(randn(N * C, 3.0f));
    for (int64_t i = 0; i < N * C; ++i) x[i] = bf16_to_float(float_to_bf16(x[i] + 0.5f));  // nonzero mean
    const auto w = round_bf16(randn(C, 1.0f)), b = round_bf16(randn(C, 1.0f));
    Tensor tx = upload(x, {N, C}, DType::bf16), tw = upload(w, {C}, DType::bf16), tb = upload(b, {C}, DType::bf16);
    Tensor out = poisoned({N, C}, DType::bf16), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
    cuda_ops::layernorm_forward(out, mean, rstd, tx, tw, tb);
    std::vector<float> ref(N * C), rmean(N), rrstd(N);
    cpu::layernorm_forward(ref.data(), rmean.data(), rrstd.data(), x.data(), w.data(), b.data(), N, C);
    CHECK(rel_err(download(out), ref) < 1e-2);
    CHECK(rel_err(download(mean), rmean) < 1e-4);
    CHECK(rel_err(download(rstd), rrstd) < 1e-4);

    const auto dout = round_bf16(randn(N * C));
    // Zero-start reference to size the accumulator's initial values like the gradient itself.
    std::vector<float> g(N * C, 0.0f), gw(C, 0.0f), gb(C, 0.0f);
    cpu::layernorm_backward(g.data(), gw.data(), gb.data(), dout.data(), x.data(), w.data(), rmean.data(), rrstd.data(),
                            N, C);
    auto dx0 = round_bf16(randn(N * C, float(rms(g)))), dw0 = randn(C, float(rms(gw))), db0 = randn(C, float(rms(gb)));
    Tensor dx = upload(dx0, {N, C}, DType::bf16), dw = upload(dw0, {C}, DType::f32), db = upload(db0, {C}, DType::f32);
    cuda_ops::layernorm_backward(dx, dw, db, upload(dout, {N, C}, DType::bf16), tx, tw, mean, rstd);
    cpu::layernorm_backward(dx0.data(), dw0.data(), db0.data(), dout.data(), x.data(), w.data(), rmean.data(),
                            rrstd.data(), N, C);
    CHECK(rel_err(download(dx), dx0) < 1e-2);
    CHECK(rel_err(download(dw), dw0) < 1e-4);
    CHECK(rel_err(download(db), db0) < 1e-4);
  }
}

TEST_CASE("add with LayerNorm statistics equals add then layernorm_stats bit for bit", "[gpu][layernorm]") {
  // The residual add that feeds an FP8 LayerNorm cast: out = a + b rounded as the add op rounds, and out's mean and
  // rstd exactly as layernorm_stats computes them from that sum, and near the CPU reference's. C = 100: the scalar
  // path; 1600 and 2056: rows of several chunks per lane; N = 333: a partial last block of 8 rows. The offset
  // case starts a and b one element in, so the kernel takes the scalar path where layernorm_stats takes the vector
  // one: the statistics must still agree.
  for (auto [N, C, offset] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 0}, {77, 100, 0}, {333, 1600, 0},
                              {40, 2056, 0}, {65, 768, 1}}) {
    INFO("N " << N << " C " << C << " offset " << offset);
    const auto a = round_bf16(randn(N * C + offset, 2.0f)), b = round_bf16(randn(N * C + offset, 1.0f));
    const Tensor ta = upload(a, {N * C + offset}, DType::bf16).slice_flat(offset, {N, C});
    const Tensor tb = upload(b, {N * C + offset}, DType::bf16).slice_flat(offset, {N, C});
    Tensor out = poisoned({N, C}, DType::bf16), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
    cuda_ops::add_forward_row_stats(out, mean, rstd, ta, tb);
    // The reference: the sum rounded as the add op rounds (f32 add, bf16 round to nearest even), uploaded aligned,
    // then layernorm_stats over it.
    std::vector<float> sum(N * C), norm(N * C), ones(C, 1.0f), zeros(C, 0.0f), rmean(N), rrstd(N);
    for (int64_t i = 0; i < N * C; ++i) sum[i] = bf16_to_float(float_to_bf16(a[offset + i] + b[offset + i]));
    const Tensor out_ref = upload(sum, {N, C}, DType::bf16);
    Tensor mean_ref = poisoned({N}, DType::f32), rstd_ref = poisoned({N}, DType::f32);
    kernels::layernorm_stats(mean_ref.data<float>(), rstd_ref.data<float>(), out_ref.data<__nv_bfloat16>(), N,
                             static_cast<int>(C), kernels::compute_stream());
    const auto got = download(out), got_mean = download(mean), got_rstd = download(rstd);
    CHECK(got == sum);
    CHECK(got_mean == download(mean_ref));
    CHECK(got_rstd == download(rstd_ref));
    cpu::layernorm_forward(norm.data(), rmean.data(), rrstd.data(), sum.data(), ones.data(), zeros.data(), N, C);
    CHECK(rel_err(got_mean, rmean) < 1e-5);
    CHECK(rel_err(got_rstd, rrstd) < 1e-5);
  }
  // out must be a new tensor: the kernel re-reads what it wrote.
  Tensor a = upload(randn(64), {2, 32}, DType::bf16), b = upload(randn(64), {2, 32}, DType::bf16);
  Tensor mean = poisoned({2}, DType::f32), rstd = poisoned({2}, DType::f32);
  CHECK_THROWS(cuda_ops::add_forward_row_stats(a, mean, rstd, a, b));
}

TEST_CASE("add with the LayerNorm output equals add then layernorm_forward bit for bit", "[gpu][layernorm]") {
  // The residual add that feeds a bf16 LayerNorm: the sum, its statistics and the LayerNorm output exactly as
  // layernorm_forward writes them from that sum (what train.recompute: layernorm recomputes), and near the CPU
  // reference. Shapes as above; the offset case takes the scalar path where layernorm_forward takes the vector one.
  for (auto [N, C, offset] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 0}, {77, 100, 0}, {333, 1600, 0},
                              {40, 2056, 0}, {65, 768, 1}}) {
    INFO("N " << N << " C " << C << " offset " << offset);
    const auto a = round_bf16(randn(N * C + offset, 2.0f)), b = round_bf16(randn(N * C + offset, 1.0f));
    const auto w = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 1.0f));
    const Tensor ta = upload(a, {N * C + offset}, DType::bf16).slice_flat(offset, {N, C});
    const Tensor tb = upload(b, {N * C + offset}, DType::bf16).slice_flat(offset, {N, C});
    const Tensor tw = upload(w, {C}, DType::bf16), tlb = upload(lb, {C}, DType::bf16);
    Tensor out = poisoned({N, C}, DType::bf16), normed = poisoned({N, C}, DType::bf16);
    Tensor mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
    cuda_ops::add_forward_row_stats(out, mean, rstd, ta, tb, nullptr, &normed, &tw, &tlb);
    std::vector<float> sum(N * C), norm(N * C), rmean(N), rrstd(N);
    for (int64_t i = 0; i < N * C; ++i) sum[i] = bf16_to_float(float_to_bf16(a[offset + i] + b[offset + i]));
    const Tensor out_ref = upload(sum, {N, C}, DType::bf16);
    Tensor normed_ref = poisoned({N, C}, DType::bf16);
    Tensor mean_ref = poisoned({N}, DType::f32), rstd_ref = poisoned({N}, DType::f32);
    cuda_ops::layernorm_forward(normed_ref, mean_ref, rstd_ref, out_ref, tw, tlb);
    const auto got_normed = download(normed);
    CHECK(download(out) == sum);
    CHECK(got_normed == download(normed_ref));
    CHECK(download(mean) == download(mean_ref));
    CHECK(download(rstd) == download(rstd_ref));
    cpu::layernorm_forward(norm.data(), rmean.data(), rrstd.data(), sum.data(), w.data(), lb.data(), N, C);
    CHECK(rel_err(got_normed, norm) < 1e-2);
  }
  // normed must not alias the sum or the inputs.
  Tensor a = upload(randn(64), {2, 32}, DType::bf16), b = upload(randn(64), {2, 32}, DType::bf16);
  Tensor out = poisoned({2, 32}, DType::bf16), w = upload(randn(32), {32}, DType::bf16);
  Tensor mean = poisoned({2}, DType::f32), rstd = poisoned({2}, DType::f32);
  CHECK_THROWS(cuda_ops::add_forward_row_stats(out, mean, rstd, a, b, nullptr, &out, &w, &w));
  CHECK_THROWS(cuda_ops::add_forward_row_stats(out, mean, rstd, a, b, nullptr, &a, &w, &w));
}

TEST_CASE("add with b's bias - plain, with statistics, with the LayerNorm output - a + (b + bias) bit for bit",
          "[gpu][layernorm]") {
  // The residual add after proj and fc2, whose linears leave their biases to it: out = bf16(a + (b + bias[c])) summed
  // in f32, from the host's own arithmetic, in all three add passes; the statistics and the LayerNorm output are those
  // of that sum (the passes without a bias, checked above, over the host's sum). C = 100: the scalar paths (the plain
  // add's too); 32 and 1600: the register path's 4 and 8 chunks; 2056: the re-reading path; 768 with offset 1: the
  // scalar path of the row passes against a 16-byte-aligned bias.
  for (auto [N, C, offset] : {std::tuple<int64_t, int64_t, int64_t>{3, 32, 0}, {77, 100, 0}, {333, 1600, 0},
                              {40, 2056, 0}, {65, 768, 1}}) {
    INFO("N " << N << " C " << C << " offset " << offset);
    const auto a = round_bf16(randn(N * C + offset, 2.0f)), b = round_bf16(randn(N * C + offset, 1.0f));
    const auto c = round_bf16(randn(C, 0.5f)), w = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 1.0f));
    const Tensor ta = upload(a, {N * C + offset}, DType::bf16).slice_flat(offset, {N, C});
    const Tensor tb = upload(b, {N * C + offset}, DType::bf16).slice_flat(offset, {N, C});
    const Tensor tc = upload(c, {C}, DType::bf16), tw = upload(w, {C}, DType::bf16), tlb = upload(lb, {C}, DType::bf16);
    std::vector<float> sum(N * C);
    for (int64_t i = 0; i < N * C; ++i)
      sum[i] = bf16_to_float(float_to_bf16(a[offset + i] + (b[offset + i] + c[i % C])));
    const Tensor sum_ref = upload(sum, {N, C}, DType::bf16);
    Tensor normed_ref = poisoned({N, C}, DType::bf16), mean_ref = poisoned({N}, DType::f32);
    Tensor rstd_ref = poisoned({N}, DType::f32);
    cuda_ops::layernorm_forward(normed_ref, mean_ref, rstd_ref, sum_ref, tw, tlb);

    Tensor plain = poisoned({N, C}, DType::bf16);
    if (offset == 0) {  // the plain add needs 16-byte-aligned operands
      cuda_ops::add_forward(plain, ta, tb, &tc);
      CHECK(download(plain) == sum);
    }
    Tensor out = poisoned({N, C}, DType::bf16), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
    cuda_ops::add_forward_row_stats(out, mean, rstd, ta, tb, nullptr, nullptr, nullptr, nullptr, &tc);
    CHECK(download(out) == sum);
    CHECK(download(mean) == download(mean_ref));
    CHECK(download(rstd) == download(rstd_ref));
    Tensor out2 = poisoned({N, C}, DType::bf16), normed = poisoned({N, C}, DType::bf16);
    Tensor mean2 = poisoned({N}, DType::f32), rstd2 = poisoned({N}, DType::f32);
    cuda_ops::add_forward_row_stats(out2, mean2, rstd2, ta, tb, nullptr, &normed, &tw, &tlb, &tc);
    CHECK(download(out2) == sum);
    CHECK(download(normed) == download(normed_ref));
    CHECK(download(mean2) == download(mean_ref));
  }
  // The bias must have one value per column.
  Tensor a = upload(randn(64), {2, 32}, DType::bf16), b = upload(randn(64), {2, 32}, DType::bf16);
  Tensor out = poisoned({2, 32}, DType::bf16), c = upload(randn(16), {16}, DType::bf16);
  Tensor mean = poisoned({2}, DType::f32), rstd = poisoned({2}, DType::f32);
  CHECK_THROWS(cuda_ops::add_forward(out, a, b, &c));
  CHECK_THROWS(cuda_ops::add_forward_row_stats(out, mean, rstd, a, b, nullptr, nullptr, nullptr, nullptr, &c));
}

namespace {
// z = sum + layernorm(sum, w, lb) with sum = a + b, the LayerNorm's output written by the add (fused) or by the
// layernorm op; returns [z, d a, d b, d w, d lb] for the seed dz.
std::vector<std::vector<float>> add_then_layernorm(bool fused, const std::vector<float>& a, const std::vector<float>& b,
                                                   const std::vector<float>& w, const std::vector<float>& lb,
                                                   const std::vector<float>& dz, int64_t N, int64_t C) {
  std::vector<Var> v = {make_var(upload(a, {N, C}, DType::bf16), true), make_var(upload(b, {N, C}, DType::bf16), true),
                        make_var(upload(w, {C}, DType::bf16), true), make_var(upload(lb, {C}, DType::bf16), true)};
  for (size_t i = 2; i < v.size(); ++i) v[i]->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
  Tape tape;
  Var z;
  {
    TapeScope scope(&tape);
    RowStats st;
    if (fused) {
      st.norm_w = v[2];
      st.norm_b = v[3];
    }
    const Var sum = add(v[0], v[1], &st);
    REQUIRE(static_cast<bool>(st.normed) == fused);
    z = add(sum, layernorm(sum, v[2], v[3], &st));
    REQUIRE(!st.normed);  // taken
  }
  grad_of(z).copy_from(upload(dz, {N, C}, DType::bf16));
  {
    TapeScope none(nullptr);
    tape.run_backward();
  }
  std::vector<std::vector<float>> out = {download(z->value)};
  for (const Var& x : v) out.push_back(download(x->grad));
  return out;
}
}  // namespace

TEST_CASE("add writing the next LayerNorm's output - forward and gradients as add then layernorm", "[gpu][layernorm]") {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{77, 100}, {333, 1600}}) {
    INFO("N " << N << " C " << C);
    const auto a = round_bf16(randn(N * C, 2.0f)), b = round_bf16(randn(N * C)), dz = round_bf16(randn(N * C));
    const auto w = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 1.0f));
    const auto fused = add_then_layernorm(true, a, b, w, lb, dz, N, C);
    const auto plain = add_then_layernorm(false, a, b, w, lb, dz, N, C);
    CHECK(fused[0] == plain[0]);  // the forward, bit for bit
    // The same kernels in the same order; d w and d lb add up row chunks with f32 atomics, in any order.
    CHECK(fused[1] == plain[1]);
    CHECK(fused[2] == plain[2]);
    CHECK(rel_err(fused[3], plain[3]) < 1e-5);
    CHECK(rel_err(fused[4], plain[4]) < 1e-5);
  }
}
