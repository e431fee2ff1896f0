// The tiled FP8 cast's plain and LayerNorm casts stream runs of row tiles (kernels/fp8_cast.cu): on a matrix whose 35
// column tiles fill a wave of blocks several times over, each block takes every 7th-11th of its strip's 94 row tiles
// (on an H200), prefetching the next while it converts one, its column sums kept in registers to the end. Checked bit
// for bit against the host codec (plain cast), against layernorm_forward then the plain cast (LayerNorm prologue), and
// the dgelu prologue (one tile per block) against gelu_backward then the plain cast, with ragged last tiles in both
// directions; and a plain cast too wide for runs (one tile per block) against the host codec.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>

#include "fp8/quantize.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;
using bf16_t = __nv_bfloat16;

namespace {

// 94 x 35 tiles of (128, 64); rows and cols end in partial tiles; rows % 16 == 0 and cols % 8 == 0 keep the 16-byte
// paths.
constexpr int64_t kRows = 12000, kCols = 2200, kN = kRows * kCols;

struct Cast {
  std::vector<uint8_t> out, out_t;
  std::vector<float> stats, colsum;  // amax (float), pad, saturated (u64); column sums
};

Cast run_cast(const void* in, Fp8Format f, float scale, bool colsum, kernels::Fp8CastInput input,
              const kernels::Fp8CastOperands& ops) {
  Tensor out = poisoned({kRows, kCols}, fp8_dtype(f)), out_t = poisoned({kCols, kRows}, fp8_dtype(f));
  Tensor stats = Tensor::zeros({4}, DType::f32, kGpu), sums = Tensor::zeros({kCols}, DType::f32, kGpu);
  Tensor d_scale = device_floats({scale});
  kernels::fp8_cast(in, DType::bf16, kRows, kCols, out.data<uint8_t>(), out_t.data<uint8_t>(), f,
                    d_scale.data<float>(),
                    {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2),
                     colsum ? sums.data<float>() : nullptr},
                    kernels::compute_stream(), input, ops);
  return {download_codes(out), download_codes(out_t), download(stats), download(sums)};
}

void check_same(const Cast& got, const Cast& ref) {
  CHECK(code_mismatches(got.out, ref.out) == 0);
  CHECK(code_mismatches(got.out_t, ref.out_t) == 0);
  CHECK(std::memcmp(got.stats.data(), ref.stats.data(), 4 * sizeof(float)) == 0);  // amax and saturation
}

}  // namespace

TEST_CASE("fp8 cast: blocks streaming runs of row tiles - plain, dgelu and LayerNorm prologues - ragged tiles",
          "[gpu][fp8]") {
  const auto stream = kernels::compute_stream();
  const float scale = 16.0f;
  const auto x = round_bf16(randn(static_cast<size_t>(kN), 8.0f));
  const Tensor d_x = upload(x, {kRows, kCols}, DType::bf16);

  SECTION("plain cast: codes, transposed codes, amax, saturation and column sums against the host") {
    std::vector<double> sum, abs_sum;
    column_sums(x, kCols, sum, abs_sum);
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      INFO((f == Fp8Format::e4m3 ? "e4m3" : "e5m2"));
      std::vector<uint8_t> ref(static_cast<size_t>(kN));
      const Fp8CastStats rs = fp8_quantize(x.data(), kN, scale, f, ref.data());
      const Cast got = run_cast(d_x.raw(), f, scale, true, kernels::Fp8CastInput::as_is, {});
      CHECK(code_mismatches(got.out, ref) == 0);
      CHECK(code_mismatches(got.out_t, transpose_codes(ref, kRows, kCols)) == 0);
      CHECK(got.stats[0] == rs.amax);
      uint64_t sat = 0;
      std::memcpy(&sat, &got.stats[2], sizeof(sat));
      CHECK(sat == static_cast<uint64_t>(rs.saturated));
      if (f == Fp8Format::e4m3) CHECK(rs.saturated > 0);  // |x| > 28 (3.5 sigma)
      CHECK(colsum_mismatches(got.colsum, sum, abs_sum) == 0);
    }
  }

  SECTION("plain cast wider than half a wave of column tiles (one tile per block) against the host") {
    // 30,000 columns: 469 column tiles, more than half of any H200 wave of the runs kernel (3 x 132 blocks), so the
    // launcher takes the one-tile kernel; 136 rows end in a partial tile, and rows % 16 != 0 stores out_t bytewise.
    const int64_t rows = 136, cols = 30000, n = rows * cols;
    const auto w = round_bf16(randn(static_cast<size_t>(n), 8.0f));
    std::vector<double> sum, abs_sum;
    column_sums(w, cols, sum, abs_sum);
    std::vector<uint8_t> ref(static_cast<size_t>(n));
    const Fp8CastStats rs = fp8_quantize(w.data(), n, scale, Fp8Format::e5m2, ref.data());
    const Tensor d_w = upload(w, {rows, cols}, DType::bf16);
    Tensor out = poisoned({rows, cols}, DType::e5m2), out_t = poisoned({cols, rows}, DType::e5m2);
    Tensor stats = Tensor::zeros({4}, DType::f32, kGpu), sums = Tensor::zeros({cols}, DType::f32, kGpu);
    Tensor d_scale = device_floats({scale});
    kernels::fp8_cast(d_w.raw(), DType::bf16, rows, cols, out.data<uint8_t>(), out_t.data<uint8_t>(), Fp8Format::e5m2,
                      d_scale.data<float>(),
                      {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2),
                       sums.data<float>()},
                      stream);
    CHECK(code_mismatches(download_codes(out), ref) == 0);
    CHECK(code_mismatches(download_codes(out_t), transpose_codes(ref, rows, cols)) == 0);
    const auto got_stats = download(stats);
    CHECK(got_stats[0] == rs.amax);
    CHECK(colsum_mismatches(download(sums), sum, abs_sum) == 0);
  }

  SECTION("dgelu prologue against gelu_backward into zeros then the plain cast") {
    const Tensor d_pre = upload(randn(static_cast<size_t>(kN), 3.0f), {kRows, kCols}, DType::bf16);
    Tensor dx = Tensor::zeros({kRows, kCols}, DType::bf16, kGpu);
    kernels::gelu_backward(dx.data<bf16_t>(), d_pre.data<bf16_t>(), d_x.data<bf16_t>(), static_cast<size_t>(kN),
                           stream);
    std::vector<double> sum, abs_sum;
    column_sums(download(dx), kCols, sum, abs_sum);
    kernels::Fp8CastOperands ops;
    ops.pre = d_pre.data<bf16_t>();
    const Cast ref = run_cast(dx.raw(), Fp8Format::e5m2, scale, true, kernels::Fp8CastInput::as_is, {});
    const Cast got = run_cast(d_x.raw(), Fp8Format::e5m2, scale, true, kernels::Fp8CastInput::dgelu, ops);
    check_same(got, ref);
    CHECK(colsum_mismatches(got.colsum, sum, abs_sum) == 0);
  }

  SECTION("LayerNorm prologue against layernorm_forward then the plain cast") {
    const auto lw = randn(static_cast<size_t>(kCols), 2.0f), lb = randn(static_cast<size_t>(kCols), 0.5f);
    const Tensor d_w = upload(lw, {kCols}, DType::bf16), d_b = upload(lb, {kCols}, DType::bf16);
    Tensor ln = poisoned({kRows, kCols}, DType::bf16);
    Tensor mean = poisoned({kRows}, DType::f32), rstd = poisoned({kRows}, DType::f32);
    kernels::layernorm_forward(ln.data<bf16_t>(), mean.data<float>(), rstd.data<float>(), d_x.data<bf16_t>(),
                               d_w.data<bf16_t>(), d_b.data<bf16_t>(), kRows, static_cast<int>(kCols), stream);
    const kernels::Fp8CastOperands ops{mean.data<float>(), rstd.data<float>(), d_w.data<bf16_t>(), d_b.data<bf16_t>()};
    const Cast ref = run_cast(ln.raw(), Fp8Format::e4m3, scale, false, kernels::Fp8CastInput::as_is, {});
    const Cast got = run_cast(d_x.raw(), Fp8Format::e4m3, scale, false, kernels::Fp8CastInput::layernorm, ops);
    check_same(got, ref);
    CHECK(got.stats[0] > 0.0f);
  }
}
