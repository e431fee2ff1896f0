// FP8 casts on the GPU, bit-exact against the host codec: every bf16 pattern (saturation, NaN, amax),
// f32 input and odd shapes, every output layout with misaligned input and column sums, and the GELU-
// and LayerNorm-fused casts against gelu_forward / layernorm_forward then the plain cast.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "fp8/quantize.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

const char* name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

}  // namespace

TEST_CASE("fp8 cast: every bf16 pattern bit-exact vs the host codec - with transpose - amax and saturation",
          "[gpu][fp8]") {
  // (256, 256): all 65536 bf16 bit patterns, including +-0, subnormals, +-inf and NaNs.
  std::vector<uint16_t> bits(65536);
  for (uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  Tensor hb = Tensor::empty({256, 256}, DType::bf16);
  std::memcpy(hb.raw(), bits.data(), bits.size() * 2);
  const Tensor x = hb.to(kGpu);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (float scale : {1.0f, 0.7310586f, 3.0e4f, 1.0f / 1024}) {
      std::vector<uint8_t> ref(65536);
      int64_t ref_sat = 0;
      for (uint32_t i = 0; i < 65536; ++i) {
        const float v = bf16_to_float(bits[i]) * scale;
        ref[i] = float_to_fp8(v, f);
        ref_sat += std::fabs(v) > fp8_max(f) ? 1 : 0;
      }
      Tensor d_scale = device_floats({scale});
      for (bool transpose : {false, true}) {
        Tensor out = poisoned({256, 256}, fp8_dtype(f)), out_t = poisoned({256, 256}, fp8_dtype(f));
        Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
        kernels::fp8_cast(x.raw(), DType::bf16, 256, 256, out.data<uint8_t>(),
                          transpose ? out_t.data<uint8_t>() : nullptr, f, d_scale.data<float>(),
                          {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2)},
                          kernels::compute_stream());
        const auto got = download_codes(out);
        int64_t bad = 0, first_bad = -1;
        for (uint32_t i = 0; i < 65536; ++i)
          if (got[i] != ref[i] && bad++ == 0) first_bad = i;
        if (transpose) {
          const auto got_t = download_codes(out_t);
          for (uint32_t r = 0; r < 256; ++r)
            for (uint32_t c = 0; c < 256; ++c)
              if (got_t[c * 256 + r] != ref[r * 256 + c] && bad++ == 0) first_bad = r * 256 + c;
        }
        INFO(name(f) << " scale " << scale << " transpose " << transpose << ": " << bad
                     << " mismatches, first at bf16 0x" << std::hex << first_bad);
        CHECK(bad == 0);
        const Tensor hs = stats.to(Device::cpu());
        CHECK(std::isnan(hs.data<float>()[0]));  // the NaN patterns make the amax NaN
        uint64_t sat = 0;
        std::memcpy(&sat, hs.data<float>() + 2, 8);
        CHECK(sat == static_cast<uint64_t>(ref_sat));
      }
    }
  }
}

TEST_CASE("fp8 cast: f32 input - odd shapes - transpose only - finite amax accumulates", "[gpu][fp8]") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{77, 50}, {64, 768}, {1, 8}, {333, 3}}) {
    auto x = randn(static_cast<size_t>(rows * cols), 3.0f);
    x[0] = 1.0e6f;  // saturates
    x[x.size() / 2] = -INFINITY;
    const Tensor dx = upload(x, {rows, cols}, DType::f32);
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const float scale = 11.0f;
      std::vector<uint8_t> ref(x.size());
      const Fp8CastStats rs = fp8_quantize(x.data(), rows * cols, scale, f, ref.data());
      Tensor d_scale = device_floats({scale});
      // Two casts into one amax: the plain cast and the transpose-only one.
      Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);
      Tensor out = poisoned({rows, cols}, fp8_dtype(f)), out_t = poisoned({cols, rows}, fp8_dtype(f));
      kernels::fp8_cast(dx.raw(), DType::f32, rows, cols, out.data<uint8_t>(), nullptr, f, d_scale.data<float>(),
                        {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2)},
                        kernels::compute_stream());
      kernels::fp8_cast(dx.raw(), DType::f32, rows, cols, nullptr, out_t.data<uint8_t>(), f, d_scale.data<float>(),
                        {stats.data<float>(), nullptr}, kernels::compute_stream());
      INFO(rows << "x" << cols << " " << name(f));
      CHECK(download_codes(out) == ref);
      CHECK(download_codes(out_t) == transpose_codes(ref, rows, cols));
      const Tensor hs = stats.to(Device::cpu());
      CHECK(hs.data<float>()[0] == INFINITY);  // |-inf|; the host amax is the same
      CHECK(std::isinf(rs.amax));
      uint64_t sat = 0;
      std::memcpy(&sat, hs.data<float>() + 2, 8);
      CHECK(sat == static_cast<uint64_t>(rs.saturated));
    }
  }
  // Finite data: the amax is exact, and the device scale update mirrors fp8_scale_from_amax.
  const auto x = randn(100003, 0.37f);
  const Tensor dx = upload(x, {100003}, DType::f32);
  Tensor slot = device_floats({0.0f, 5.0f, 0.0f});  // amax, scale, scale_inv
  kernels::fp8_amax(dx.raw(), DType::f32, 100003, slot.data<float>(), kernels::compute_stream());
  kernels::fp8_scale_from_amax(slot.data<float>(), 448.0f, 2, slot.data<float>() + 1, slot.data<float>() + 2,
                               kernels::compute_stream());
  const auto s = download(slot);
  const float host_amax = fp8_amax(x.data(), 100003);
  const float host_scale = fp8_scale_from_amax(host_amax, 448.0f, 2, 5.0f);
  CHECK(s[0] == host_amax);
  CHECK(s[1] == host_scale);
  CHECK(s[2] == 1.0f / host_scale);
}

TEST_CASE("fp8 cast: random bf16 and f32 - vector and ragged shapes - every output layout - misaligned input - "
          "column sums",
          "[gpu][fp8]") {
  // Full (128, 64) tiles with 16-byte loads and stores (4096x768); partial tiles on the vector path
  // with rows % 16 == 0 (272x200) or not (300x136, 33x4104); ragged shapes on the scalar path; rows or
  // cols of 1. The flat cast (no out_t) covers n % 8 != 0 tails; offset 1 misaligns the input. Each
  // cast runs without and with column sums (which take the tiled kernel also without out_t), added
  // to prior contents; the codes, amax and saturation must not change.
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 768}, {272, 200}, {300, 136}, {33, 4104}, {77, 333},
                                                {129, 65},   {1, 1},     {7, 1},     {1, 33}};
  const float scale = 16.0f;  // |x| > 28 saturates E4M3: ~0.05% of N(0, 8)
  for (auto [rows, cols] : shapes) {
    const int64_t n = rows * cols;
    for (bool specials : {false, true}) {
      auto x = round_bf16(randn(static_cast<size_t>(n), 8.0f));  // exact in bf16: both dtypes see the same x
      if (specials) {  // saturates E5M2 too, then -inf and NaN (overwriting each other when n < 3)
        x[0] = 20480.0f;
        x[n - 1] = -INFINITY;
        x[n / 2] = NAN;
      }
      std::vector<double> col_sum(static_cast<size_t>(cols)), col_abs(static_cast<size_t>(cols));
      for (int64_t i = 0; i < n; ++i) {
        col_sum[i % cols] += x[i];
        col_abs[i % cols] += std::fabs(x[i]);
      }
      const auto prior = randn(static_cast<size_t>(cols), 100.0f);
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        std::vector<uint8_t> ref(static_cast<size_t>(n));
        const Fp8CastStats rs = fp8_quantize(x.data(), n, scale, f, ref.data());
        const auto ref_t = transpose_codes(ref, rows, cols);
        Tensor d_scale = device_floats({scale});
        for (DType dt : {DType::bf16, DType::f32}) {
          for (int offset : {0, 1}) {  // 1: the input starts one element into its allocation
            std::vector<float> xs(static_cast<size_t>(offset), 0.0f);
            xs.insert(xs.end(), x.begin(), x.end());
            const Tensor dx = upload(xs, {n + offset}, dt);
            const char* in = static_cast<const char*>(dx.raw()) + offset * dtype_size(dt);
            for (int mode = 0; mode < 6; ++mode) {  // out only, out_t only, both; then each with column sums
              const bool want_out = mode % 3 != 1, want_t = mode % 3 != 0, want_sum = mode >= 3;
              INFO(rows << "x" << cols << " " << name(f) << " " << dtype_name(dt) << " offset " << offset << " mode "
                        << mode << " specials " << specials);
              Tensor out = poisoned({rows, cols}, fp8_dtype(f)), out_t = poisoned({cols, rows}, fp8_dtype(f));
              Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
              Tensor sums = upload(prior, {cols}, DType::f32);
              kernels::fp8_cast(in, dt, rows, cols, want_out ? out.data<uint8_t>() : nullptr,
                                want_t ? out_t.data<uint8_t>() : nullptr, f, d_scale.data<float>(),
                                {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2),
                                 want_sum ? sums.data<float>() : nullptr},
                                kernels::compute_stream());
              if (want_out) CHECK(code_mismatches(download_codes(out), ref) == 0);
              if (want_t) CHECK(code_mismatches(download_codes(out_t), ref_t) == 0);
              if (want_sum) CHECK(colsum_mismatches(download(sums), prior, col_sum, col_abs) == 0);
              else CHECK(download(sums) == prior);  // untouched
              const Tensor hs = stats.to(Device::cpu());
              const float amax = hs.data<float>()[0];
              if (std::isnan(rs.amax)) CHECK(std::isnan(amax));
              else CHECK(amax == rs.amax);
              uint64_t sat = 0;
              std::memcpy(&sat, hs.data<float>() + 2, 8);
              CHECK(sat == static_cast<uint64_t>(rs.saturated));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("fp8 cast: the GELU prologue equals gelu_forward then the cast bit for bit - ragged shapes - amax",
          "[gpu][fp8]") {
  // Reference: gelu_forward writes h (bf16), the plain cast casts h (flat kernel without out_t). The
  // fused cast reads pre (tiled kernel always, vector and scalar paths, offset 1 misaligned): codes,
  // transposed codes, amax bits and saturation count must be identical, and fp8_amax with the GELU
  // prologue must equal fp8_amax of h. Specials: a value whose GELU saturates both formats, +-inf
  // (gelu(-inf) is NaN in both paths) and NaN.
  const std::pair<int64_t, int64_t> shapes[] = {{1024, 768}, {272, 200}, {300, 136}, {77, 333},
                                                {129, 65},   {1, 1},     {7, 1}};
  const float scale = 16.0f;  // gelu(x) > 28 saturates E4M3
  for (auto [rows, cols] : shapes) {
    const int64_t n = rows * cols;
    for (bool specials : {false, true}) {
      auto pre = randn(static_cast<size_t>(n), 8.0f);
      if (specials) {
        pre[0] = 30000.0f;
        pre[n / 3] = INFINITY;
        pre[n - 1] = -INFINITY;
        pre[n / 2] = NAN;
      }
      const Tensor d_pre = upload(pre, {n}, DType::bf16);
      Tensor h = poisoned({n}, DType::bf16);
      kernels::gelu_forward(h.data<__nv_bfloat16>(), d_pre.data<__nv_bfloat16>(), static_cast<size_t>(n),
                            kernels::compute_stream());
      Tensor amax_pair = Tensor::zeros({2}, DType::f32, kGpu);
      kernels::fp8_amax(h.raw(), DType::bf16, n, amax_pair.data<float>(), kernels::compute_stream());
      kernels::fp8_amax(d_pre.raw(), DType::bf16, n, amax_pair.data<float>() + 1, kernels::compute_stream(),
                        kernels::Fp8CastInput::gelu);
      const std::vector<float> amaxes = download(amax_pair);
      INFO(rows << "x" << cols << " specials " << specials);
      CHECK(std::memcmp(&amaxes[0], &amaxes[1], sizeof(float)) == 0);
      // pre again at an offset of one element (misaligned for the 16-byte path)
      std::vector<float> pre_off(1, 0.0f);
      pre_off.insert(pre_off.end(), pre.begin(), pre.end());
      const Tensor d_pre_off = upload(pre_off, {n + 1}, DType::bf16);
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        Tensor d_scale = device_floats({scale});
        auto cast = [&](const void* in, bool want_out, bool want_t, kernels::Fp8CastInput input) {
          Tensor out = poisoned({rows, cols}, fp8_dtype(f)), out_t = poisoned({cols, rows}, fp8_dtype(f));
          Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
          kernels::fp8_cast(in, DType::bf16, rows, cols, want_out ? out.data<uint8_t>() : nullptr,
                            want_t ? out_t.data<uint8_t>() : nullptr, f, d_scale.data<float>(),
                            {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2)},
                            kernels::compute_stream(), input);
          return std::tuple{want_out ? download_codes(out) : std::vector<uint8_t>{},
                            want_t ? download_codes(out_t) : std::vector<uint8_t>{}, download(stats)};
        };
        for (int mode = 0; mode < 3; ++mode) {  // out only, out_t only, both
          const bool want_out = mode != 1, want_t = mode != 0;
          const auto [ref, ref_t, ref_stats] = cast(h.raw(), want_out, want_t, kernels::Fp8CastInput::as_is);
          for (int offset : {0, 1}) {
            INFO(name(f) << " mode " << mode << " offset " << offset);
            const void* in = offset ? static_cast<const void*>(d_pre_off.data<__nv_bfloat16>() + 1) : d_pre.raw();
            const auto [got, got_t, got_stats] = cast(in, want_out, want_t, kernels::Fp8CastInput::gelu);
            CHECK(code_mismatches(got, ref) == 0);
            CHECK(code_mismatches(got_t, ref_t) == 0);
            CHECK(std::memcmp(got_stats.data(), ref_stats.data(), 4 * sizeof(float)) == 0);  // amax and saturation
            CHECK(std::memcmp(&got_stats[0], &amaxes[0], sizeof(float)) == 0);
          }
        }
      }
    }
  }
  // The prologue takes bf16 only (the GELU kernel's dtype) and no column sums.
  Tensor f32_in = Tensor::zeros({16, 16}, DType::f32, kGpu), sums = Tensor::zeros({16}, DType::f32, kGpu);
  Tensor out = Tensor::empty({16, 16}, fp8_dtype(Fp8Format::e4m3), kGpu), d_scale = device_floats({1.0f});
  CHECK_THROWS(kernels::fp8_cast(f32_in.raw(), DType::f32, 16, 16, out.data<uint8_t>(), nullptr, Fp8Format::e4m3,
                                 d_scale.data<float>(), {}, kernels::compute_stream(), kernels::Fp8CastInput::gelu));
  Tensor bf16_in = Tensor::zeros({16, 16}, DType::bf16, kGpu);
  CHECK_THROWS(kernels::fp8_cast(bf16_in.raw(), DType::bf16, 16, 16, out.data<uint8_t>(), nullptr, Fp8Format::e4m3,
                                 d_scale.data<float>(), {nullptr, nullptr, sums.data<float>()},
                                 kernels::compute_stream(), kernels::Fp8CastInput::gelu));
}

TEST_CASE("fp8 cast: the LayerNorm prologue equals layernorm_forward then the cast bit for bit - ragged shapes - "
          "amax",
          "[gpu][fp8]") {
  // Reference: layernorm_forward writes ln (bf16), mean and rstd; the plain cast casts ln. The fused
  // path: layernorm_stats on x (aligned, and at an offset of one element, which takes the scalar paths),
  // then the cast with the LayerNorm prologue reading x: mean/rstd bits, codes, transposed codes, amax
  // bits and saturation count must be identical, and fp8_amax with the prologue must equal fp8_amax of
  // ln. C = 100 takes the scalar paths everywhere; no shape has rows a multiple of 128. Row 0 is
  // constant (variance 0, rstd = 1/sqrt(eps)). scale 64 saturates E4M3 (|ln| > 7).
  const std::pair<int64_t, int64_t> shapes[] = {{272, 768}, {77, 100}, {300, 64}, {129, 1600}, {1, 100}, {16, 1600}};
  const float scale = 64.0f;
  for (auto [rows, cols] : shapes) {
    const int64_t n = rows * cols;
    auto x = randn(static_cast<size_t>(n), 3.0f);
    for (int64_t c = 0; c < cols; ++c) x[c] = 3.0f;
    const auto lw = randn(static_cast<size_t>(cols), 2.0f), lb = randn(static_cast<size_t>(cols), 0.5f);
    const Tensor d_x = upload(x, {rows, cols}, DType::bf16), d_w = upload(lw, {cols}, DType::bf16);
    const Tensor d_b = upload(lb, {cols}, DType::bf16);
    std::vector<float> x_off(1, 0.0f);
    x_off.insert(x_off.end(), x.begin(), x.end());
    const Tensor d_x_off = upload(x_off, {n + 1}, DType::bf16);
    Tensor ln = poisoned({rows, cols}, DType::bf16);
    Tensor mean = poisoned({rows}, DType::f32), rstd = poisoned({rows}, DType::f32);
    kernels::layernorm_forward(ln.data<__nv_bfloat16>(), mean.data<float>(), rstd.data<float>(),
                               d_x.data<__nv_bfloat16>(), d_w.data<__nv_bfloat16>(), d_b.data<__nv_bfloat16>(), rows,
                               static_cast<int>(cols), kernels::compute_stream());
    const std::vector<float> ref_mean = download(mean), ref_rstd = download(rstd);
    for (int offset : {0, 1}) {
      INFO(rows << "x" << cols << " offset " << offset);
      const auto* in = offset ? d_x_off.data<__nv_bfloat16>() + 1 : d_x.data<__nv_bfloat16>();
      Tensor s_mean = poisoned({rows}, DType::f32), s_rstd = poisoned({rows}, DType::f32);
      kernels::layernorm_stats(s_mean.data<float>(), s_rstd.data<float>(), in, rows, static_cast<int>(cols),
                               kernels::compute_stream());
      const std::vector<float> got_mean = download(s_mean), got_rstd = download(s_rstd);
      CHECK(std::memcmp(got_mean.data(), ref_mean.data(), rows * sizeof(float)) == 0);
      CHECK(std::memcmp(got_rstd.data(), ref_rstd.data(), rows * sizeof(float)) == 0);
      const kernels::Fp8CastOperands ops{s_mean.data<float>(), s_rstd.data<float>(), d_w.data<__nv_bfloat16>(),
                                          d_b.data<__nv_bfloat16>()};
      Tensor amax_pair = Tensor::zeros({2}, DType::f32, kGpu);
      kernels::fp8_amax(ln.raw(), DType::bf16, n, amax_pair.data<float>(), kernels::compute_stream());
      kernels::fp8_amax(in, DType::bf16, n, amax_pair.data<float>() + 1, kernels::compute_stream(),
                        kernels::Fp8CastInput::layernorm, cols, ops);
      const std::vector<float> amaxes = download(amax_pair);
      CHECK(amaxes[0] > 0.0f);
      CHECK(std::memcmp(&amaxes[0], &amaxes[1], sizeof(float)) == 0);
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        Tensor d_scale = device_floats({scale});
        auto cast = [&](const void* src, bool want_out, bool want_t, kernels::Fp8CastInput input) {
          Tensor out = poisoned({rows, cols}, fp8_dtype(f)), out_t = poisoned({cols, rows}, fp8_dtype(f));
          Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
          kernels::fp8_cast(src, DType::bf16, rows, cols, want_out ? out.data<uint8_t>() : nullptr,
                            want_t ? out_t.data<uint8_t>() : nullptr, f, d_scale.data<float>(),
                            {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2)},
                            kernels::compute_stream(), input, ops);
          return std::tuple{want_out ? download_codes(out) : std::vector<uint8_t>{},
                            want_t ? download_codes(out_t) : std::vector<uint8_t>{}, download(stats)};
        };
        for (int mode = 0; mode < 3; ++mode) {  // out only, out_t only, both
          INFO(name(f) << " mode " << mode);
          const bool want_out = mode != 1, want_t = mode != 0;
          const auto [ref, ref_t, ref_stats] = cast(ln.raw(), want_out, want_t, kernels::Fp8CastInput::as_is);
          const auto [got, got_t, got_stats] = cast(in, want_out, want_t, kernels::Fp8CastInput::layernorm);
          CHECK(code_mismatches(got, ref) == 0);
          CHECK(code_mismatches(got_t, ref_t) == 0);
          CHECK(std::memcmp(got_stats.data(), ref_stats.data(), 4 * sizeof(float)) == 0);  // amax and saturation
          CHECK(std::memcmp(&got_stats[0], &amaxes[0], sizeof(float)) == 0);
          uint64_t saturated = 0;
          std::memcpy(&saturated, &got_stats[2], sizeof(saturated));
          if (f == Fp8Format::e4m3 && n >= 4096) CHECK(saturated > 0);  // the test does reach saturation
        }
      }
    }
  }
  // The prologue needs its operands, bf16 input and no column sums; the amax pass needs cols | n.
  Tensor bf16_in = Tensor::zeros({16, 16}, DType::bf16, kGpu), sums = Tensor::zeros({16}, DType::f32, kGpu);
  Tensor out = Tensor::empty({16, 16}, fp8_dtype(Fp8Format::e4m3), kGpu), d_scale = device_floats({1.0f});
  CHECK_THROWS(kernels::fp8_cast(bf16_in.raw(), DType::bf16, 16, 16, out.data<uint8_t>(), nullptr, Fp8Format::e4m3,
                                 d_scale.data<float>(), {}, kernels::compute_stream(),
                                 kernels::Fp8CastInput::layernorm));
  const kernels::Fp8CastOperands ops{sums.data<float>(), sums.data<float>(), bf16_in.data<__nv_bfloat16>(),
                                      bf16_in.data<__nv_bfloat16>()};
  CHECK_THROWS(kernels::fp8_cast(bf16_in.raw(), DType::bf16, 16, 16, out.data<uint8_t>(), nullptr, Fp8Format::e4m3,
                                 d_scale.data<float>(), {nullptr, nullptr, sums.data<float>()},
                                 kernels::compute_stream(), kernels::Fp8CastInput::layernorm, ops));
  CHECK_THROWS(kernels::fp8_amax(bf16_in.raw(), DType::bf16, 256, sums.data<float>(), kernels::compute_stream(),
                                 kernels::Fp8CastInput::layernorm, 15, ops));
}

TEST_CASE("fp8 cast: add_layernorm_cast equals add_layernorm_stats then the LayerNorm-prologue cast bit for bit - "
          "ragged shapes - NaN rows - amax and saturation",
          "[gpu][fp8][layernorm]") {
  // The residual add that casts its sum's LayerNorm ahead for an fp8_all linear. Reference: add_layernorm_stats
  // writes the sum and its statistics, then fp8_cast with the LayerNorm prologue casts from them. The fused kernel
  // must give the same sum, statistics, codes, amax bits and saturation count, with every output poisoned first.
  // C = 100: the scalar path; 1600 and 2056: several chunks per lane; N = 333: a partial last block of 8 rows;
  // offset 1: a, b and out one element in (the scalar path against the reference's vector one). Row 1 of the
  // larger cases has an inf in a (its statistics and codes NaN), row 0 is constant (rstd = 1/sqrt(eps)). scale 64
  // saturates E4M3. The cases of odd N add a bias to b (the linear's that left it to the add) in both.
  struct Case { int64_t N, C, offset; };
  for (auto [N, C, offset] : {Case{1, 32, 0}, Case{77, 100, 0}, Case{333, 1600, 0}, Case{40, 2056, 0},
                              Case{65, 768, 1}}) {
    const int64_t n = N * C;
    auto a = round_bf16(randn(static_cast<size_t>(n + offset), 2.0f));
    auto b = round_bf16(randn(static_cast<size_t>(n + offset), 1.0f));
    for (int64_t c = 0; c < C; ++c) a[offset + c] = 3.0f, b[offset + c] = 0.0f;  // row 0: constant
    if (N > 2) a[offset + C + 5] = INFINITY;
    const auto lw = round_bf16(randn(static_cast<size_t>(C), 2.0f)), lb = round_bf16(randn(static_cast<size_t>(C), 0.5f));
    const Tensor ta = upload(a, {n + offset}, DType::bf16), tb = upload(b, {n + offset}, DType::bf16);
    const Tensor tw = upload(lw, {C}, DType::bf16), tlb = upload(lb, {C}, DType::bf16);
    const Tensor tc = upload(round_bf16(randn(static_cast<size_t>(C), 0.5f)), {C}, DType::bf16);
    const auto* pa = ta.data<__nv_bfloat16>() + offset;
    const auto* pb = tb.data<__nv_bfloat16>() + offset;
    const auto* pc = N % 2 == 1 ? tc.data<__nv_bfloat16>() : nullptr;
    Tensor ref_out = poisoned({N, C}, DType::bf16), ref_mean = poisoned({N}, DType::f32);
    Tensor ref_rstd = poisoned({N}, DType::f32);
    kernels::add_layernorm_stats(ref_out.data<__nv_bfloat16>(), ref_mean.data<float>(), ref_rstd.data<float>(), pa, pb,
                                 N, static_cast<int>(C), kernels::compute_stream(), pc);
    const kernels::Fp8CastOperands ops{ref_mean.data<float>(), ref_rstd.data<float>(), tw.data<__nv_bfloat16>(),
                                        tlb.data<__nv_bfloat16>()};
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      INFO("N " << N << " C " << C << " offset " << offset << " " << name(f) << " bias " << (pc != nullptr));
      const Tensor d_scale = device_floats({64.0f});
      Tensor ref_codes = poisoned({N, C}, fp8_dtype(f)), ref_stats = Tensor::zeros({4}, DType::f32, kGpu);
      kernels::fp8_cast(ref_out.raw(), DType::bf16, N, C, ref_codes.data<uint8_t>(), nullptr, f, d_scale.data<float>(),
                        {ref_stats.data<float>(), reinterpret_cast<unsigned long long*>(ref_stats.data<float>() + 2)},
                        kernels::compute_stream(), kernels::Fp8CastInput::layernorm, ops);
      // The fused kernel's outputs, offset like its inputs (poisoned around them too).
      Tensor out = poisoned({n + offset}, DType::bf16), codes = poisoned({n + offset}, fp8_dtype(f));
      Tensor mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
      Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
      kernels::add_layernorm_cast(out.data<__nv_bfloat16>() + offset, mean.data<float>(), rstd.data<float>(),
                                  codes.data<uint8_t>() + offset, pa, pb, tw.data<__nv_bfloat16>(),
                                  tlb.data<__nv_bfloat16>(), N, static_cast<int>(C), f, d_scale.data<float>(),
                                  {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2)},
                                  kernels::compute_stream(), pc);
      const auto got_out = download(out), want_out = download(ref_out);
      CHECK(std::memcmp(got_out.data() + offset, want_out.data(), n * sizeof(float)) == 0);
      const auto got_mean = download(mean), got_rstd = download(rstd);
      CHECK(std::memcmp(got_mean.data(), download(ref_mean).data(), N * sizeof(float)) == 0);
      CHECK(std::memcmp(got_rstd.data(), download(ref_rstd).data(), N * sizeof(float)) == 0);
      auto got_codes = download_codes(codes);
      got_codes.erase(got_codes.begin(), got_codes.begin() + offset);
      const auto want_codes = download_codes(ref_codes);
      CHECK(code_mismatches(got_codes, want_codes) == 0);
      const auto got_stats = download(stats), want_stats = download(ref_stats);
      CHECK(std::memcmp(got_stats.data(), want_stats.data(), 4 * sizeof(float)) == 0);
      if (N > 2) CHECK(std::isnan(got_rstd[1]));  // the inf row reached the statistics
      uint64_t saturated = 0;
      std::memcpy(&saturated, &got_stats[2], sizeof(saturated));
      if (f == Fp8Format::e4m3 && n >= 4096) CHECK(saturated > 0);  // the test does reach saturation
    }
  }
  // No column sums; the codes and the scale are needed.
  Tensor x = Tensor::zeros({16, 16}, DType::bf16, kGpu), st = Tensor::zeros({16}, DType::f32, kGpu);
  Tensor codes = Tensor::empty({16, 16}, fp8_dtype(Fp8Format::e4m3), kGpu), d_scale = device_floats({1.0f});
  auto* p = x.data<__nv_bfloat16>();
  CHECK_THROWS(kernels::add_layernorm_cast(p, st.data<float>(), st.data<float>(), codes.data<uint8_t>(), p, p, p, p, 16,
                                           16, Fp8Format::e4m3, d_scale.data<float>(), {nullptr, nullptr, st.data<float>()},
                                           kernels::compute_stream()));
  CHECK_THROWS(kernels::add_layernorm_cast(p, st.data<float>(), st.data<float>(), nullptr, p, p, p, p, 16, 16,
                                           Fp8Format::e4m3, d_scale.data<float>(), {}, kernels::compute_stream()));
}
