// The GELU backward fused into an FP8 cast (Fp8CastInput::dgelu) against gelu_backward into a zeroed
// gradient then the plain cast, bit for bit; and the FP8 MLP whose fc casts its output gradient with it
// (fp8_linear_gelu leaving d gelu(pre) pending on pre) against the unfused composition.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>

#include "config/config.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/gelu.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear.h"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;
using bf16_t = __nv_bfloat16;

namespace {

const char* name_of(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

}  // namespace

TEST_CASE("fp8 cast: the dgelu prologue equals gelu_backward into zeros then the cast bit for bit - ragged shapes - "
          "colsum - amax",
          "[gpu][fp8]") {
  // Reference: gelu_backward adds gelu'(pre) * dh into a zero-filled bf16 dx, then the plain cast casts
  // dx (tiled kernel, with or without column sums). The fused cast reads dh and pre (vector path, and
  // the scalar path with dh, pre or both one element off 16-byte alignment): codes, transposed codes,
  // amax bits and saturation count must be identical, column sums within reordered-f32 tolerance of
  // dx's double sums, and fp8_amax with the prologue must equal fp8_amax of dx. dh holds +0 and -0
  // (a zero product must give +0, as the zeroed gradient's +0 addend does); specials: a gradient that
  // saturates both formats, pre = +-inf (gelu' NaN or 0) and NaN.
  const std::pair<int64_t, int64_t> shapes[] = {{1024, 768}, {272, 200}, {300, 136}, {77, 333},
                                                {129, 65},   {1, 1},     {7, 1}};
  const float scale = 16.0f;
  const auto stream = kernels::compute_stream();
  for (auto [rows, cols] : shapes) {
    const int64_t n = rows * cols;
    for (bool specials : {false, true}) {
      auto pre = randn(static_cast<size_t>(n), 3.0f), dh = randn(static_cast<size_t>(n), 1.0f);
      for (int64_t i = 0; i < n; i += 7) dh[i] = i % 14 ? -0.0f : 0.0f;
      if (specials) {
        dh[0] = 30000.0f;  // * gelu'(pre) * 16 beyond E5M2's 57344 unless gelu'(pre) is tiny
        pre[0] = 5.0f;
        pre[n / 3] = INFINITY;
        pre[n - 1] = -INFINITY;
        pre[n / 2] = NAN;
      }
      // Each input also one element past a 16-byte boundary (the scalar path).
      auto shifted = [](const std::vector<float>& v) {
        std::vector<float> s(1, 0.0f);
        s.insert(s.end(), v.begin(), v.end());
        return s;
      };
      const Tensor d_pre = upload(pre, {n}, DType::bf16), d_dh = upload(dh, {n}, DType::bf16);
      const Tensor d_pre_off = upload(shifted(pre), {n + 1}, DType::bf16);
      const Tensor d_dh_off = upload(shifted(dh), {n + 1}, DType::bf16);
      Tensor dx = Tensor::zeros({n}, DType::bf16, kGpu);
      kernels::gelu_backward(dx.data<bf16_t>(), d_pre.data<bf16_t>(), d_dh.data<bf16_t>(), static_cast<size_t>(n),
                             stream);
      std::vector<double> sum, abs_sum;
      column_sums(download(dx), cols, sum, abs_sum);
      kernels::Fp8CastOperands ops;
      ops.pre = d_pre.data<bf16_t>();
      Tensor amax_pair = Tensor::zeros({2}, DType::f32, kGpu);
      kernels::fp8_amax(dx.raw(), DType::bf16, n, amax_pair.data<float>(), stream);
      kernels::fp8_amax(d_dh.raw(), DType::bf16, n, amax_pair.data<float>() + 1, stream, kernels::Fp8CastInput::dgelu,
                        cols, ops);
      const std::vector<float> amaxes = download(amax_pair);
      INFO(rows << "x" << cols << " specials " << specials);
      CHECK(std::memcmp(&amaxes[0], &amaxes[1], sizeof(float)) == 0);
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        Tensor d_scale = upload({scale}, {1}, DType::f32);
        struct Cast {
          std::vector<uint8_t> out, out_t;
          std::vector<float> stats, colsum;
        };
        auto cast = [&](const void* in, const bf16_t* pre_ptr, bool want_out, bool want_t, bool want_sum,
                        kernels::Fp8CastInput input) {
          Tensor out = poisoned({rows, cols}, fp8_dtype(f)), out_t = poisoned({cols, rows}, fp8_dtype(f));
          Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
          Tensor colsum = Tensor::zeros({cols}, DType::f32, kGpu);
          kernels::Fp8CastOperands cast_ops;
          cast_ops.pre = pre_ptr;
          kernels::fp8_cast(in, DType::bf16, rows, cols, want_out ? out.data<uint8_t>() : nullptr,
                            want_t ? out_t.data<uint8_t>() : nullptr, f, d_scale.data<float>(),
                            {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2),
                             want_sum ? colsum.data<float>() : nullptr},
                            stream, input, cast_ops);
          return Cast{want_out ? download_codes(out) : std::vector<uint8_t>{},
                      want_t ? download_codes(out_t) : std::vector<uint8_t>{}, download(stats), download(colsum)};
        };
        for (int mode = 0; mode < 3; ++mode) {  // out only, out_t only, both
          for (bool want_sum : {false, true}) {
            const bool want_out = mode != 1, want_t = mode != 0;
            const Cast ref = cast(dx.raw(), nullptr, want_out, want_t, want_sum, kernels::Fp8CastInput::as_is);
            for (int offsets = 0; offsets < 4; ++offsets) {  // bit 0: dh one element off, bit 1: pre
              INFO(name_of(f) << " mode " << mode << " colsum " << want_sum << " offsets " << offsets);
              const void* in = offsets & 1 ? static_cast<const void*>(d_dh_off.data<bf16_t>() + 1) : d_dh.raw();
              const bf16_t* pre_ptr = offsets & 2 ? d_pre_off.data<bf16_t>() + 1 : d_pre.data<bf16_t>();
              const Cast got = cast(in, pre_ptr, want_out, want_t, want_sum, kernels::Fp8CastInput::dgelu);
              CHECK(code_mismatches(got.out, ref.out) == 0);
              CHECK(code_mismatches(got.out_t, ref.out_t) == 0);
              CHECK(std::memcmp(got.stats.data(), ref.stats.data(), 4 * sizeof(float)) == 0);  // amax, saturation
              CHECK(std::memcmp(&got.stats[0], &amaxes[0], sizeof(float)) == 0);
              if (want_sum) {
                CHECK(colsum_mismatches(got.colsum, sum, abs_sum) == 0);
                CHECK(colsum_mismatches(ref.colsum, sum, abs_sum) == 0);
              } else {
                CHECK(got.colsum == std::vector<float>(static_cast<size_t>(cols), 0.0f));
              }
            }
          }
        }
      }
    }
  }
  // The prologue takes bf16 input and needs pre; column sums go with it but not with gelu or layernorm.
  Tensor f32_in = Tensor::zeros({16, 16}, DType::f32, kGpu), bf16_in = Tensor::zeros({16, 16}, DType::bf16, kGpu);
  Tensor out = Tensor::empty({16, 16}, fp8_dtype(Fp8Format::e5m2), kGpu), d_scale = upload({1.0f}, {1}, DType::f32);
  kernels::Fp8CastOperands ops;
  ops.pre = bf16_in.data<bf16_t>();
  const auto dgelu = kernels::Fp8CastInput::dgelu;
  CHECK_THROWS(kernels::fp8_cast(f32_in.raw(), DType::f32, 16, 16, out.data<uint8_t>(), nullptr, Fp8Format::e5m2,
                                 d_scale.data<float>(), {}, kernels::compute_stream(), dgelu, ops));
  CHECK_THROWS(kernels::fp8_cast(bf16_in.raw(), DType::bf16, 16, 16, out.data<uint8_t>(), nullptr, Fp8Format::e5m2,
                                 d_scale.data<float>(), {}, kernels::compute_stream(), dgelu, {}));
  Tensor amax = Tensor::zeros({1}, DType::f32, kGpu);
  CHECK_THROWS(kernels::fp8_amax(bf16_in.raw(), DType::bf16, 256, amax.data<float>(), kernels::compute_stream(), dgelu,
                                 16, {}));
}

TEST_CASE("fp8 linear: the GELU backward fused into fc's dy cast equals the unfused MLP - scalings - storages - "
          "readers - steps",
          "[gpu][fp8]") {
  // fc = fp8_linear_ln or fp8_linear, then fp8_linear_gelu (fused: pre's gradient stays pending and fc
  // casts its dy with the dgelu prologue) against fp8_linear(gelu(pre)) (gelu's backward writes pre's
  // gradient, fc casts it). Separate, identically configured states; two optimizer steps (delayed
  // scaling then runs on scales from the history). Readers: 0 the plain MLP; 1 a third FP8 linear reads
  // pre and is recorded before fc2 (its backward runs after fc2's and must find pre's gradient written
  // first: the generic fallback); 2 recorded after fc2 (pre's gradient exists when fc2's backward runs:
  // the accumulating path); 3 only fc's bias needs a gradient (no dy cast: the bias-only path). Forward
  // bits, x's, w1's, w2's (and w3's) gradients and every recorded statistic must be identical; the bias
  // and LayerNorm parameter gradients come from atomics whose f32 order varies run to run, so they are
  // compared within reordered-f32-sum tolerance. M = 272 and H = 208 leave partial tiles.
  const int64_t M = 272, C = 96, H = 208, O3 = 32;
  const auto x = round_bf16(randn(M * C, 1.0f)), lw = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 0.3f));
  const auto w1 = round_bf16(randn(H * C, 0.1f)), b1 = round_bf16(randn(H, 0.5f));
  const auto w2 = round_bf16(randn(C * H, 0.05f)), b2 = round_bf16(randn(C, 0.1f));
  const auto w3 = round_bf16(randn(O3 * H, 0.05f)), b3 = round_bf16(randn(O3, 0.1f));
  const auto dy = round_bf16(randn(M * C, 1e-3f)), dy3 = round_bf16(randn(M * O3, 1e-3f));
  struct Result {
    std::vector<float> y, dx, dlw, dlb, dw1, db1, dw2, db2, dw3, dpre;
    bool pre_grad_written = false;
  };
  for (bool ln : {true, false}) {
    for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
      for (ActivationStorage storage :
           {ActivationStorage::fp8, ActivationStorage::fp8_all, ActivationStorage::bf16}) {
        for (int readers = 0; readers < 4; ++readers) {
          Fp8Config cfg;
          cfg.scaling = scaling;
          cfg.activation_storage = storage;
          Fp8LinearState fc_f("fc", cfg), fc2_f("fc2", cfg), fc3_f("fc3", cfg);
          Fp8LinearState fc_u("fc", cfg), fc2_u("fc2", cfg), fc3_u("fc3", cfg);
          auto run = [&](Fp8LinearState& fc, Fp8LinearState& fc2, Fp8LinearState& fc3, bool fuse) {
            const bool train_in = readers != 3;  // x, ln and w1 (with readers 3 only b1 trains in fc)
            Var xv = make_var(upload(x, {M / 16, 16, C}, DType::bf16), train_in);
            Var lwv = make_var(upload(lw, {C}, DType::bf16), train_in);
            Var lbv = make_var(upload(lb, {C}, DType::bf16), train_in);
            Var w1v = make_var(upload(w1, {H, C}, DType::bf16), train_in);
            Var b1v = make_var(upload(b1, {H}, DType::bf16), true);
            Var w2v = make_var(upload(w2, {C, H}, DType::bf16), true), b2v = make_var(upload(b2, {C}, DType::bf16), true);
            Var w3v = make_var(upload(w3, {O3, H}, DType::bf16), true);
            Var b3v = make_var(upload(b3, {O3}, DType::bf16), true);
            for (const Var* v : {&lwv, &lbv, &w1v, &b1v, &w2v, &b2v, &w3v, &b3v})
              (*v)->grad = Tensor::zeros((*v)->value.shape(), DType::f32, kGpu, MemCategory::gradients);
            Tape tape;
            Var y, y3, pre;
            {
              TapeScope scope(&tape);
              pre = ln ? fp8_linear_ln(xv, lwv, lbv, w1v, b1v, fc) : fp8_linear(xv, w1v, b1v, fc);
              if (readers == 1) y3 = fp8_linear(pre, w3v, b3v, fc3);
              y = fuse ? fp8_linear_gelu(pre, w2v, b2v, fc2)
                       : fp8_linear(gelu(pre, storage == ActivationStorage::fp8_all), w2v, b2v, fc2);
              if (readers == 2) y3 = fp8_linear(pre, w3v, b3v, fc3);
            }
            grad_of(y).copy_from(upload(dy, {M / 16, 16, C}, DType::bf16));
            if (y3) grad_of(y3).copy_from(upload(dy3, {M / 16, 16, O3}, DType::bf16));
            {
              TapeScope none(nullptr);
              tape.run_backward();
            }
            CUDA_CHECK(cudaDeviceSynchronize());
            Result r;
            r.pre_grad_written = pre->grad.defined();
            CHECK(!pre->grad_cell->pending.defined());  // consumed, or written by a reader
            r.y = download(y->value);
            if (train_in) {
              r.dx = download(grad_of(xv));
              r.dw1 = download(w1v->grad);
              if (ln) r.dlw = download(lwv->grad), r.dlb = download(lbv->grad);
            }
            r.db1 = download(b1v->grad);
            r.dw2 = download(w2v->grad);
            r.db2 = download(b2v->grad);
            if (y3) r.dw3 = download(w3v->grad);
            if (pre->grad.defined()) r.dpre = download(pre->grad);
            for (Fp8LinearState* st : {&fc, &fc2, &fc3}) st->on_optimizer_step();
            return r;
          };
          for (int step = 0; step < 2; ++step) {
            INFO("ln " << ln << " current scaling " << (scaling == Fp8Scaling::current) << " storage "
                       << static_cast<int>(storage) << " readers " << readers << " step " << step);
            const Result f = run(fc_f, fc2_f, fc3_f, true), u = run(fc_u, fc2_u, fc3_u, false);
            // The fused path ran (pre's gradient never written) exactly when it may.
            const bool fusable = storage != ActivationStorage::bf16 && readers == 0;
            CHECK(f.pre_grad_written == !fusable);
            REQUIRE(u.pre_grad_written);
            if (!fusable) CHECK(f.dpre == u.dpre);
            CHECK(f.y == u.y);
            CHECK(f.dx == u.dx);
            CHECK(f.dw1 == u.dw1);
            CHECK(f.dw2 == u.dw2);
            CHECK(f.dw3 == u.dw3);
            CHECK(reordered_mismatches(f.dlw, u.dlw) == 0);
            CHECK(reordered_mismatches(f.dlb, u.dlb) == 0);
            // b1: the column sums of d(pre), which the unfused run wrote out.
            std::vector<double> sum, abs_sum;
            column_sums(u.dpre, H, sum, abs_sum);
            CHECK(colsum_mismatches(f.db1, sum, abs_sum) == 0);
            CHECK(colsum_mismatches(u.db1, sum, abs_sum) == 0);
            CHECK(rms(f.db1) > 0.0);
            column_sums(dy, C, sum, abs_sum);
            CHECK(colsum_mismatches(f.db2, sum, abs_sum) == 0);
            for (auto [mf, mu] : {std::pair{&fc_f.input, &fc_u.input}, std::pair{&fc_f.grad_output, &fc_u.grad_output},
                                  std::pair{&fc2_f.input, &fc2_u.input},
                                  std::pair{&fc2_f.grad_output, &fc2_u.grad_output},
                                  std::pair{&fc3_f.grad_output, &fc3_u.grad_output}})
              check_same_meta(*mf, *mu);
          }
          // readers 3: fc casts no dy (only its bias trains), so its gradient statistics stay unrecorded.
          if (readers == 3) CHECK(fc_f.grad_output.last_amax == 0.0f);
          else CHECK(fc_f.grad_output.last_amax > 0.0f);
        }
      }
    }
  }
}
