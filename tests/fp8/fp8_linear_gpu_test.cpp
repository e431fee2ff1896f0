// FP8 on the GPU: the cast kernels bit-exact against the host codec (every bf16 pattern, saturation,
// NaN, transpose, amax), each FP8 GEMM against a double GEMM over the same codes and scales, the
// CUDA fp8_linear against its CPU emulation, the GELU- and LayerNorm-fused casts and fp8_linear_gelu /
// fp8_linear_ln against gelu / layernorm then the cast / fp8_linear (bit for bit), and a short FP8 GPT
// training run.
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>

#include "config/config.h"
#include "data/shard.h"
#include "dist/comm.h"
#include "fp8/quantize.h"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/stream.cuh"
#include "ops/fp8_linear.h"
#include "ops/ops.h"
#include "train/trainer.h"

using namespace fp8t;
using namespace fp8t::test;
namespace fs = std::filesystem;

namespace {

Tensor upload_codes(const std::vector<uint8_t>& codes, Shape shape, Fp8Format f) {
  Tensor h = Tensor::empty(std::move(shape), fp8_dtype(f));
  std::memcpy(h.raw(), codes.data(), codes.size());
  return h.to(kGpu);
}

Tensor device_floats(std::vector<float> v) { return upload(v, {static_cast<int64_t>(v.size())}, DType::f32); }

const char* name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

// Host-quantized random matrix: codes, their decoded values (unscaled) and scale_inv.
struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<double> values;
  float scale_inv;
};

Quantized quantize_random(int64_t n, float stdev, Fp8Format f) {
  const auto x = randn(static_cast<size_t>(n), stdev);
  const float scale = fp8_max(f) / fp8_amax(x.data(), n);
  Quantized q{std::vector<uint8_t>(static_cast<size_t>(n)), std::vector<double>(static_cast<size_t>(n)), 1.0f / scale};
  fp8_quantize(x.data(), n, scale, f, q.codes.data());
  for (int64_t i = 0; i < n; ++i) q.values[i] = fp8_to_float(q.codes[i], f);
  return q;
}

std::vector<uint8_t> transpose_codes(const std::vector<uint8_t>& c, int64_t rows, int64_t cols) {
  std::vector<uint8_t> t(c.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) t[k * rows + r] = c[r * cols + k];
  return t;
}

// bf16 outputs: cuBLASLt rounds the scaled product and adds the bias / C (beta = 1) around a bf16
// rounding, so an element may differ from the exact value by half a bf16 ulp of each of the product,
// the addend and the result (an ulp is at most 2^-7 relative), plus the tensor cores' FP8
// accumulation error (~1e-4). Counted per element with a 2x margin; the f32-output runs of the same
// GEMMs carry the 1e-3 norm check.
int64_t beyond_bf16_rounding(const std::vector<float>& out, const std::vector<double>& ref,
                             const std::vector<double>& addend) {
  std::vector<float> ref_f(ref.begin(), ref.end());
  const double floor = 1e-4 * rms(ref_f);
  int64_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double product = ref[i] - addend[i];
    const double bound = std::ldexp(std::fabs(product) + std::fabs(addend[i]) + std::fabs(ref[i]), -7) + floor;
    if (!(std::fabs(double(out[i]) - ref[i]) <= bound)) ++bad;
  }
  return bad;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }


struct Dims { int M, K, N; };
const Dims kGemmShapes[] = {{16, 16, 16}, {128, 768, 2304}, {1024, 256, 768}, {48, 1600, 80}};

}  // namespace

// ------------------------------------------------------------------------------------------------ casts

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
        INFO(name(f) << " scale " << scale << " transpose " << transpose << ": " << bad << " mismatches, first at bf16 0x"
                     << std::hex << first_bad);
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

// ------------------------------------------------------------------------------------------------ GEMMs

TEST_CASE("fp8 gemm: fprop dgrad wgrad match a double GEMM on the same codes and scales", "[gpu][fp8]") {
  const cudaStream_t s = kernels::compute_stream();
  for (auto [M, K, N] : kGemmShapes) {
    INFO("M=" << M << " K=" << K << " N=" << N);
    const Quantized x = quantize_random(int64_t{M} * K, 1.0f, Fp8Format::e4m3);
    const Quantized w = quantize_random(int64_t{N} * K, 0.02f, Fp8Format::e4m3);
    const Quantized dy = quantize_random(int64_t{M} * N, 1e-4f, Fp8Format::e5m2);
    const auto bias = round_bf16(randn(N, 0.5f));
    Tensor sx = device_floats({x.scale_inv}), sw = device_floats({w.scale_inv}), sdy = device_floats({dy.scale_inv});

    {  // fprop: out (M, N) = x (M, K) @ w (N, K)^T * sx * sw + bias, bf16 out, fast accumulation
      std::vector<double> ref(size_t(M) * N);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          double acc = 0;
          for (int k = 0; k < K; ++k) acc += x.values[size_t(m) * K + k] * w.values[size_t(n) * K + k];
          ref[size_t(m) * N + n] = acc * x.scale_inv * w.scale_inv + bias[n];
        }
      Tensor tx = upload_codes(x.codes, {M, K}, Fp8Format::e4m3), tw = upload_codes(w.codes, {N, K}, Fp8Format::e4m3);
      Tensor tb = upload(bias, {N}, DType::bf16), out = poisoned({M, N}, DType::bf16);
      kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(), {tx.raw(), DType::e4m3, sx.data<float>()},
                                  {tw.raw(), DType::e4m3, sw.data<float>()}, tb.data<__nv_bfloat16>(), M, K, N, s);
      const auto got = download(out);
      std::vector<double> bias_rows(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) bias_rows[i] = bias[i % N];
      CHECK(rel_err(got, to_float(ref)) < 5e-3);
      // Fast accumulation (fprop only, as in Transformer Engine) keeps partial sums at reduced
      // precision between promotions: on the H200 about 1 element in 25,000 lands just beyond the
      // bf16-rounding bound (12 of 294,912 seen). Allow 1 in 1,000; the norm bound above holds.
      CHECK(beyond_bf16_rounding(got, ref, bias_rows) <= static_cast<int64_t>(ref.size() / 1000));
      // The same GEMM (same layout) with an f32 output: the 1e-3 norm check.
      std::vector<double> ref_nb(ref);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) ref_nb[size_t(m) * N + n] -= bias[n];
      Tensor out32 = poisoned({M, N}, DType::f32);
      kernels::matmul_cublaslt(out32.raw(), DType::f32, {tw.raw(), DType::e4m3, sw.data<float>()}, true,
                               {tx.raw(), DType::e4m3, sx.data<float>()}, false, N, M, K, 1.0f, 0.0f,
                               kernels::MatmulEpilogue::none, nullptr, nullptr, s);
      CHECK(rel_err(download(out32), to_float(ref_nb)) < 1e-3);
    }
    {  // dgrad: dx (M, K) += dy (M, N) @ w (N, K), from w^T (K, N); bf16 out
      const auto dx0 = round_bf16(randn(size_t(M) * K, 1e-4f));
      std::vector<double> ref(size_t(M) * K);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < K; ++k) {
          double acc = 0;
          for (int n = 0; n < N; ++n) acc += dy.values[size_t(m) * N + n] * w.values[size_t(n) * K + k];
          ref[size_t(m) * K + k] = dx0[size_t(m) * K + k] + acc * dy.scale_inv * w.scale_inv;
        }
      Tensor tdy = upload_codes(dy.codes, {M, N}, Fp8Format::e5m2);
      Tensor twt = upload_codes(transpose_codes(w.codes, N, K), {K, N}, Fp8Format::e4m3);
      Tensor dx = upload(dx0, {M, K}, DType::bf16);
      kernels::matmul_fp8_backward_input(dx.data<__nv_bfloat16>(), {tdy.raw(), DType::e5m2, sdy.data<float>()},
                                         {twt.raw(), DType::e4m3, sw.data<float>()}, M, K, N, true, s);
      const auto got = download(dx);
      CHECK(rel_err(got, to_float(ref)) < 5e-3);
      // The f32 sum in a different order than the double reference can tip a value lying within
      // ~1e-7 of a bf16 rounding boundary to the other side (seen: 1 of 262,144 on the H200).
      // Allow 1 in 10,000; the norm bound above holds.
      CHECK(beyond_bf16_rounding(got, ref, std::vector<double>(dx0.begin(), dx0.end())) <=
            static_cast<int64_t>(ref.size() / 10000));
      // The same GEMM with an f32 output accumulated onto dx0: the 1e-3 norm check.
      Tensor dx32 = upload(dx0, {M, K}, DType::f32);
      kernels::matmul_cublaslt(dx32.raw(), DType::f32, {twt.raw(), DType::e4m3, sw.data<float>()}, true,
                               {tdy.raw(), DType::e5m2, sdy.data<float>()}, false, K, M, N, 1.0f, 1.0f,
                               kernels::MatmulEpilogue::none, nullptr, nullptr, s);
      CHECK(rel_err(download(dx32), to_float(ref)) < 1e-3);
    }
    {  // wgrad: dw (N, K) += dy^T (N, M) @ x (M, K), from dy^T and x^T (K, M); f32 out, beta = 1
      const auto dw0 = randn(size_t(N) * K, 1e-4f);
      std::vector<float> ref(size_t(N) * K);
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {
          double acc = 0;
          for (int m = 0; m < M; ++m) acc += dy.values[size_t(m) * N + n] * x.values[size_t(m) * K + k];
          ref[size_t(n) * K + k] = static_cast<float>(dw0[size_t(n) * K + k] + acc * dy.scale_inv * x.scale_inv);
        }
      Tensor tdyt = upload_codes(transpose_codes(dy.codes, M, N), {N, M}, Fp8Format::e5m2);
      Tensor txt = upload_codes(transpose_codes(x.codes, M, K), {K, M}, Fp8Format::e4m3);
      Tensor dw = upload(dw0, {N, K}, DType::f32);
      kernels::matmul_fp8_backward_weight(dw.data<float>(), DType::f32, {tdyt.raw(), DType::e5m2, sdy.data<float>()},
                                          {txt.raw(), DType::e4m3, sx.data<float>()}, M, K, N, true, s);
      CHECK(rel_err(download(dw), ref) < 1e-3);
    }
  }
}

TEST_CASE("fp8 gemm: rejects sizes that are not multiples of 16 - E5M2 x E5M2 - unaligned scales - block scales", "[gpu][fp8]") {
  Tensor a = Tensor::zeros({32, 32}, DType::e4m3, kGpu), b = Tensor::zeros({32, 32}, DType::e5m2, kGpu);
  Tensor out = Tensor::zeros({32, 32}, DType::bf16, kGpu), one = device_floats({1.0f, 1.0f});
  const cudaStream_t s = kernels::compute_stream();
  CHECK_THROWS_WITH(kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(), {a.raw(), DType::e4m3, one.data<float>()},
                                                {a.raw(), DType::e4m3, one.data<float>()}, nullptr, 24, 32, 32, s),
                    Catch::Matchers::ContainsSubstring("multiple of 16"));
  CHECK_THROWS_WITH(kernels::matmul_fp8_backward_input(out.data<__nv_bfloat16>(),
                                                       {b.raw(), DType::e5m2, one.data<float>()},
                                                       {b.raw(), DType::e5m2, one.data<float>()}, 32, 32, 32, true, s),
                    Catch::Matchers::ContainsSubstring("E5M2 x E5M2"));
  // Seen on the H200 (cuBLASLt 13): scale pointers at a 4-byte offset make cublasLtMatmul return
  // "not supported"; the wrapper says why instead.
  CHECK_THROWS_WITH(kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(),
                                                {a.raw(), DType::e4m3, one.data<float>() + 1},
                                                {a.raw(), DType::e4m3, one.data<float>()}, nullptr, 32, 32, 32, s),
                    Catch::Matchers::ContainsSubstring("16-byte aligned"));
  // Scale layouts other than per-tensor are part of the operand (and of the plan key) but not wired yet.
  CHECK_THROWS_WITH(
      kernels::matmul_fp8_forward(out.data<__nv_bfloat16>(),
                                  {a.raw(), DType::e4m3, one.data<float>(), ScaleLayout::block_1x128},
                                  {a.raw(), DType::e4m3, one.data<float>()}, nullptr, 32, 32, 32, s),
      Catch::Matchers::ContainsSubstring("not wired to cuBLASLt yet"));
}

// ------------------------------------------------------------------------------------------------ fp8_linear

namespace {

struct LinearResult {
  std::vector<float> y, dx, dw, db;
};

// Two optimizer steps of forward + backward (the first fills the amax history, so the second runs
// with real delayed scales); returns the second step's outputs and gradients.
LinearResult run_fp8_linear(Fp8LinearState& st, Device dev, const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>& b, const std::vector<float>& dy, int64_t M, int64_t IC,
                            int64_t OC) {
  const DType dt = dev.is_cuda() ? DType::bf16 : DType::f32;
  auto put = [&](const std::vector<float>& v, Shape shape, DType d) {
    return dev.is_cuda() ? upload(v, shape, d) : Tensor::from_vector(v, shape);
  };
  LinearResult r;
  for (int step = 0; step < 2; ++step) {
    Var xv = make_var(put(x, {M / 8, 8, IC}, dt), true), wv = make_var(put(w, {OC, IC}, dt), true),
        bv = make_var(put(b, {OC}, dt), true);
    wv->grad = Tensor::zeros({OC, IC}, DType::f32, dev, MemCategory::gradients);  // f32 like the flat buffer
    bv->grad = Tensor::zeros({OC}, DType::f32, dev, MemCategory::gradients);
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      y = fp8_linear(xv, wv, bv, st);
      y = fp8_linear(xv, wv, bv, st);  // a second micro-batch: the cached weight is reused
    }
    grad_of(y).copy_from(put(dy, {M / 8, 8, OC}, dt));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    if (dev.is_cuda()) CUDA_CHECK(cudaDeviceSynchronize());
    r = {y->value.to_float_vector(), grad_of(xv).to_float_vector(), wv->grad.to_float_vector(),
         bv->grad.to_float_vector()};
    st.on_optimizer_step();
  }
  return r;
}

}  // namespace

TEST_CASE("fp8 linear: CUDA matches the CPU emulation - delayed and current scaling - fp8 and bf16 storage",
          "[gpu][fp8]") {
  const int64_t M = 512, IC = 256, OC = 768;
  const auto x = round_bf16(randn(M * IC, 1.5f)), w = round_bf16(randn(OC * IC, 0.03f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 2e-4f));
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::bf16}) {
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      Fp8LinearState cpu("cpu", cfg), gpu("gpu", cfg);
      const LinearResult rc = run_fp8_linear(cpu, Device::cpu(), x, w, b, dy, M, IC, OC);
      const LinearResult rg = run_fp8_linear(gpu, kGpu, x, w, b, dy, M, IC, OC);
      INFO("current scaling " << (scaling == Fp8Scaling::current) << " fp8 storage "
                              << (storage == ActivationStorage::fp8));
      CHECK(rel_err(rg.y, rc.y) < 1e-2);
      CHECK(rel_err(rg.dx, rc.dx) < 1e-2);
      CHECK(rel_err(rg.dw, rc.dw) < 1e-3);
      CHECK(rel_err(rg.db, rc.db) < 1e-4);
      // The device statistics reached the host metas: same amaxes, saturation and scales, bit for bit.
      using MetaPair = std::pair<const Fp8TensorMeta*, const Fp8TensorMeta*>;
      for (auto [mc, mg] : {MetaPair{&cpu.input, &gpu.input}, MetaPair{&cpu.weight, &gpu.weight},
                            MetaPair{&cpu.grad_output, &gpu.grad_output}}) {
        CHECK(mg->last_amax == mc->last_amax);
        CHECK(mg->last_saturated == mc->last_saturated);
        CHECK(mg->scale == mc->scale);
        CHECK(mg->history_oldest_first() == mc->history_oldest_first());
      }
      CHECK(gpu.weight_casts == 2);  // once per optimizer step, not per micro-batch
    }
  }
}

TEST_CASE("fp8 linear: the bias gradient is added once whichever of x and w need gradients - ragged tiles",
          "[gpu][fp8]") {
  // The CUDA backward adds db inside the dy cast when there is one (dgrad and/or wgrad) and with a
  // column-sum kernel when only the bias needs a gradient. M = 272 and OC = 208 leave partial
  // (128, 64) tiles of dy; db starts non-zero, so adding it twice or not at all shows.
  const int64_t M = 272, IC = 64, OC = 208;
  const auto x = round_bf16(randn(M * IC, 1.5f)), w = round_bf16(randn(OC * IC, 0.03f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 2e-2f));
  const auto db0 = randn(OC, 0.5f);
  std::vector<double> dy_sum(OC), dy_abs(OC);
  for (int64_t i = 0; i < M * OC; ++i) {
    dy_sum[i % OC] += dy[i];
    dy_abs[i % OC] += std::fabs(dy[i]);
  }
  auto run = [&](Device dev, bool x_grad, bool w_grad) {
    const DType dt = dev.is_cuda() ? DType::bf16 : DType::f32;
    auto put = [&](const std::vector<float>& v, Shape shape, DType d) {
      return dev.is_cuda() ? upload(v, shape, d) : Tensor::from_vector(v, shape);
    };
    Fp8LinearState st("h.0.attn.c_attn", Fp8Config{});
    Var xv = make_var(put(x, {M, IC}, dt), x_grad), wv = make_var(put(w, {OC, IC}, dt), w_grad),
        bv = make_var(put(b, {OC}, dt), true);
    if (w_grad) wv->grad = Tensor::zeros({OC, IC}, DType::f32, dev, MemCategory::gradients);
    bv->grad = put(db0, {OC}, DType::f32);  // a gradient from an earlier micro-batch
    Tape tape;
    Var y;
    {
      TapeScope scope(&tape);
      y = fp8_linear(xv, wv, bv, st);
    }
    grad_of(y).copy_from(put(dy, {M, OC}, dt));
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    if (dev.is_cuda()) CUDA_CHECK(cudaDeviceSynchronize());
    LinearResult r{{}, x_grad ? grad_of(xv).to_float_vector() : std::vector<float>{},
                   w_grad ? wv->grad.to_float_vector() : std::vector<float>{}, bv->grad.to_float_vector()};
    st.on_optimizer_step();
    return r;
  };
  for (auto [x_grad, w_grad] : {std::pair{true, true}, {true, false}, {false, true}, {false, false}}) {
    INFO("x needs a gradient " << x_grad << ", w needs a gradient " << w_grad);
    const LinearResult rg = run(kGpu, x_grad, w_grad);
    CHECK(colsum_mismatches(rg.db, db0, dy_sum, dy_abs) == 0);
    const LinearResult rc = run(Device::cpu(), x_grad, w_grad);  // dx and dw unchanged by the fusion
    CHECK(rg.dx.size() == rc.dx.size());
    CHECK(rg.dw.size() == rc.dw.size());
    if (x_grad) CHECK(rel_err(rg.dx, rc.dx) < 1e-2);
    if (w_grad) CHECK(rel_err(rg.dw, rc.dw) < 1e-3);
  }
}

TEST_CASE("fp8 linear: fp8_linear_gelu equals gelu then fp8_linear on the GPU - scalings - storages - steps",
          "[gpu][fp8]") {
  // Separate, identically configured states; two optimizer steps so that delayed scaling runs on
  // scales from the history. Forward bits, pre's and w's gradients and every recorded statistic must
  // be identical; db comes from the dy cast's column-sum atomics, whose f32 order varies run to run,
  // so it is compared within reordered-f32-sum tolerance. M = 272 and H = 208 leave partial tiles.
  const int64_t M = 272, H = 208, OC = 96;
  const auto pre = round_bf16(randn(M * H, 2.0f)), w = round_bf16(randn(OC * H, 0.05f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 1e-3f));
  std::vector<double> dy_sum(OC), dy_abs(OC);
  for (int64_t i = 0; i < M * OC; ++i) {
    dy_sum[i % OC] += dy[i];
    dy_abs[i % OC] += std::fabs(dy[i]);
  }
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::fp8_all, ActivationStorage::bf16}) {
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      Fp8LinearState fused("fused", cfg), plain("plain", cfg);
      auto run = [&](Fp8LinearState& st, bool fuse) {
        Var pv = make_var(upload(pre, {M / 16, 16, H}, DType::bf16), true);
        Var wv = make_var(upload(w, {OC, H}, DType::bf16), true), bv = make_var(upload(b, {OC}, DType::bf16), true);
        wv->grad = Tensor::zeros({OC, H}, DType::f32, kGpu, MemCategory::gradients);
        bv->grad = Tensor::zeros({OC}, DType::f32, kGpu, MemCategory::gradients);
        Tape tape;
        Var y;
        {
          TapeScope scope(&tape);
          y = fuse ? fp8_linear_gelu(pv, wv, bv, st)
                   : fp8_linear(gelu(pv, storage == ActivationStorage::fp8_all), wv, bv, st);
        }
        grad_of(y).copy_from(upload(dy, {M / 16, 16, OC}, DType::bf16));
        {
          TapeScope none(nullptr);
          tape.run_backward();
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        LinearResult r{y->value.to_float_vector(), grad_of(pv).to_float_vector(), wv->grad.to_float_vector(),
                       bv->grad.to_float_vector()};
        st.on_optimizer_step();
        return r;
      };
      for (int step = 0; step < 2; ++step) {
        INFO("current scaling " << (scaling == Fp8Scaling::current) << " storage " << static_cast<int>(storage)
                                << " step " << step);
        const LinearResult f = run(fused, true), u = run(plain, false);
        CHECK(f.y == u.y);
        CHECK(f.dx == u.dx);
        CHECK(f.dw == u.dw);
        CHECK(colsum_mismatches(f.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        CHECK(colsum_mismatches(u.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        for (auto [mf, mu] : {std::pair{&fused.input, &plain.input}, std::pair{&fused.weight, &plain.weight},
                              std::pair{&fused.grad_output, &plain.grad_output}})
          check_same_meta(*mf, *mu);
      }
      CHECK(fused.input.last_amax > 0.0f);
    }
  }
  // Evaluation (no tape): the fused forward casts without a transposed output.
  Fp8LinearState fused("fused", Fp8Config{}), plain("plain", Fp8Config{});
  Var pv = make_var(upload(pre, {M, H}, DType::bf16), false);
  Var wv = make_var(upload(w, {OC, H}, DType::bf16), false), bv = make_var(upload(b, {OC}, DType::bf16), false);
  CHECK(download(fp8_linear_gelu(pv, wv, bv, fused)->value) == download(fp8_linear(gelu(pv), wv, bv, plain)->value));
}

TEST_CASE("fp8 linear: fp8_linear_ln equals layernorm then fp8_linear on the GPU - scalings - storages - steps",
          "[gpu][fp8]") {
  // Separate, identically configured states; two optimizer steps (delayed scaling then runs on scales
  // from the history). The second step starts with an existing x gradient (the residual stream's),
  // which the LayerNorm backward must add to; the first has none (zero-filled). Forward bits, x's and
  // w's gradients and every recorded statistic must be identical; db, d ln_w and d ln_b come from
  // atomics whose f32 order varies run to run, so they are compared within reordered-f32-sum
  // tolerance. M = 272 and C = 208 leave partial tiles.
  const int64_t M = 272, C = 208, OC = 96;
  const auto x = round_bf16(randn(M * C, 2.0f)), w = round_bf16(randn(OC * C, 0.05f));
  const auto lw = round_bf16(randn(C, 1.0f)), lb = round_bf16(randn(C, 0.3f));
  const auto b = round_bf16(randn(OC, 0.1f)), dy = round_bf16(randn(M * OC, 1e-3f));
  const auto dx_prior = round_bf16(randn(M * C, 1e-3f));
  std::vector<double> dy_sum(OC), dy_abs(OC);
  for (int64_t i = 0; i < M * OC; ++i) {
    dy_sum[i % OC] += dy[i];
    dy_abs[i % OC] += std::fabs(dy[i]);
  }
  struct Result {
    std::vector<float> y, dx, dlw, dlb, dw, db;
  };
  for (Fp8Scaling scaling : {Fp8Scaling::delayed, Fp8Scaling::current}) {
    for (ActivationStorage storage : {ActivationStorage::fp8, ActivationStorage::fp8_all, ActivationStorage::bf16}) {
      Fp8Config cfg;
      cfg.scaling = scaling;
      cfg.activation_storage = storage;
      Fp8LinearState fused("fused", cfg), plain("plain", cfg);
      auto run = [&](Fp8LinearState& st, bool fuse, bool prior_dx) {
        Var xv = make_var(upload(x, {M / 16, 16, C}, DType::bf16), true);
        if (prior_dx) xv->grad = upload(dx_prior, {M / 16, 16, C}, DType::bf16);
        Var lwv = make_var(upload(lw, {C}, DType::bf16), true), lbv = make_var(upload(lb, {C}, DType::bf16), true);
        Var wv = make_var(upload(w, {OC, C}, DType::bf16), true), bv = make_var(upload(b, {OC}, DType::bf16), true);
        lwv->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
        lbv->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
        wv->grad = Tensor::zeros({OC, C}, DType::f32, kGpu, MemCategory::gradients);
        bv->grad = Tensor::zeros({OC}, DType::f32, kGpu, MemCategory::gradients);
        Tape tape;
        Var y;
        {
          TapeScope scope(&tape);
          y = fuse ? fp8_linear_ln(xv, lwv, lbv, wv, bv, st) : fp8_linear(layernorm(xv, lwv, lbv), wv, bv, st);
        }
        grad_of(y).copy_from(upload(dy, {M / 16, 16, OC}, DType::bf16));
        {
          TapeScope none(nullptr);
          tape.run_backward();
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        Result r{y->value.to_float_vector(),   grad_of(xv).to_float_vector(), lwv->grad.to_float_vector(),
                 lbv->grad.to_float_vector(),  wv->grad.to_float_vector(),    bv->grad.to_float_vector()};
        st.on_optimizer_step();
        return r;
      };
      for (int step = 0; step < 2; ++step) {
        INFO("current scaling " << (scaling == Fp8Scaling::current) << " storage " << static_cast<int>(storage)
                                << " step " << step);
        const Result f = run(fused, true, step == 1), u = run(plain, false, step == 1);
        CHECK(f.y == u.y);
        CHECK(f.dx == u.dx);
        CHECK(f.dw == u.dw);
        CHECK(reordered_mismatches(f.dlw, u.dlw) == 0);
        CHECK(reordered_mismatches(f.dlb, u.dlb) == 0);
        CHECK(rms(f.dlw) > 0.0);
        CHECK(colsum_mismatches(f.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        CHECK(colsum_mismatches(u.db, std::vector<float>(OC, 0.0f), dy_sum, dy_abs) == 0);
        for (auto [mf, mu] : {std::pair{&fused.input, &plain.input}, std::pair{&fused.weight, &plain.weight},
                              std::pair{&fused.grad_output, &plain.grad_output}})
          check_same_meta(*mf, *mu);
      }
      CHECK(fused.input.last_amax > 0.0f);
    }
  }
  // Only the LayerNorm weight needs a gradient (x and the linear frozen): the backward still runs
  // the LayerNorm backward, with a throwaway x gradient, and d ln_w matches the composition.
  {
    Fp8LinearState fused("fused", Fp8Config{}), plain("plain", Fp8Config{});
    auto run = [&](Fp8LinearState& st, bool fuse) {
      Var xv = make_var(upload(x, {M, C}, DType::bf16), false);
      Var lwv = make_var(upload(lw, {C}, DType::bf16), true), lbv = make_var(upload(lb, {C}, DType::bf16), false);
      Var wv = make_var(upload(w, {OC, C}, DType::bf16), false), bv = make_var(upload(b, {OC}, DType::bf16), false);
      lwv->grad = Tensor::zeros({C}, DType::f32, kGpu, MemCategory::gradients);
      Tape tape;
      Var y;
      {
        TapeScope scope(&tape);
        y = fuse ? fp8_linear_ln(xv, lwv, lbv, wv, bv, st) : fp8_linear(layernorm(xv, lwv, lbv), wv, bv, st);
      }
      grad_of(y).copy_from(upload(dy, {M, OC}, DType::bf16));
      {
        TapeScope none(nullptr);
        tape.run_backward();
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(!xv->grad.defined());
      return lwv->grad.to_float_vector();
    };
    const auto f = run(fused, true), u = run(plain, false);
    CHECK(reordered_mismatches(f, u) == 0);
    CHECK(rms(f) > 0.0);
  }
  // Evaluation (no tape): the fused forward casts without a transposed output.
  Fp8LinearState fused("fused", Fp8Config{}), plain("plain", Fp8Config{});
  Var xv = make_var(upload(x, {M, C}, DType::bf16), false);
  Var lwv = make_var(upload(lw, {C}, DType::bf16), false), lbv = make_var(upload(lb, {C}, DType::bf16), false);
  Var wv = make_var(upload(w, {OC, C}, DType::bf16), false), bv = make_var(upload(b, {OC}, DType::bf16), false);
  CHECK(download(fp8_linear_ln(xv, lwv, lbv, wv, bv, fused)->value) ==
        download(fp8_linear(layernorm(xv, lwv, lbv), wv, bv, plain)->value));
}

TEST_CASE("fp8 linear: CUDA rejects rows that are not a multiple of 16 with an actionable message", "[gpu][fp8]") {
  Fp8LinearState st("h.0.mlp.c_fc", Fp8Config{});
  Var x = make_var(upload(randn(24 * 64), {24, 64}, DType::bf16), true);
  Var w = make_var(upload(randn(64 * 64), {64, 64}, DType::bf16), true);
  CHECK_THROWS_WITH(fp8_linear(x, w, nullptr, st), Catch::Matchers::ContainsSubstring("multiples of 16"));
}

// ------------------------------------------------------------------------------------------------ model

TEST_CASE("fp8 model: a short FP8 training run on the GPU lowers the loss", "[gpu][fp8][train]") {
  const fs::path root = fs::temp_directory_path() / fmt::format("fp8t_gpu_fp8_train_{}", ::getpid());
  fs::create_directories(root / "data");
  std::mt19937 rng(5);
  std::vector<uint16_t> perm(200);
  for (int i = 0; i < 200; ++i) perm[i] = static_cast<uint16_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (const char* file : {"train_000000.bin", "val_000000.bin"}) {
    std::vector<uint16_t> toks(100000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = perm[i % 200];
    write_shard((root / "data" / file).string(), toks);
  }
  const std::string yaml = fmt::format(R"(
run: {{name: gpu-fp8-train, out_dir: {0}/run, device: cuda}}
model: {{n_layer: 2, n_head: 2, d_model: 128, vocab_size: 300, seq_len: 64}}
data: {{train: {0}/data/train_*.bin, val: {0}/data/val_*.bin}}
train: {{micro_batch: 8, max_steps: 30, eval_steps: 4}}
optim: {{lr: 3.0e-3, warmup_steps: 5}}
precision: {{compute: fp8, fp8: {{layers: [qkv, proj, fc, fc2, lm_head]}}}}
)",
                                       root.string());
  auto comm = make_single_communicator();
  const TrainResult r = train(parse_config(yaml, "gpu-fp8-train.yaml"), *comm);
  INFO("val loss " << r.first_val_loss.value() << " -> " << r.last_val_loss.value());
  CHECK(std::isfinite(r.last_val_loss.value()));
  CHECK(r.last_val_loss.value() < 0.6 * r.first_val_loss.value());
  fs::remove_all(root);
}
