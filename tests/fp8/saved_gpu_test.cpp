// FP8 storage of saved activations on the GPU: the per-tensor dequantize kernel on every code, the
// per-row save and dequantize kernels bit-exact against the host path (ragged, long and misaligned rows,
// in place), fp8_save/fp8_save_inplace/fp8_restore, and GELU/attention with FP8 storage equal to the
// plain ops on the restored input.
#include <catch2/catch_test_macros.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "fp8/quantize.h"
#include "fp8/saved.h"
#include "util/gpu_test_util.h"
#include "kernels/fp8_cast.cuh"
#include "kernels/fp8_saved.cuh"
#include "kernels/stream.cuh"
#include "ops/ops.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("fp8 dequantize kernel matches the host codec on every code", "[gpu][fp8][saved]") {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (int64_t n : {int64_t{256}, int64_t{255}, int64_t{8 * 1000 + 3}}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) codes[size_t(i)] = static_cast<uint8_t>((i * 37 + 11) % 256);
      const float scale_inv = 0.0371f;
      Tensor tc = Tensor::empty({n}, DType::e4m3, kGpu, MemCategory::activations);
      CUDA_CHECK(cudaMemcpy(tc.raw(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
      Tensor ts = upload(std::vector<float>{scale_inv}, {1}, DType::f32);
      Tensor out = poisoned({n}, DType::bf16);
      kernels::fp8_dequantize(tc.data<uint8_t>(), f, n, ts.data<float>(), out.data<__nv_bfloat16>(),
                              kernels::compute_stream());
      std::vector<float> ref(static_cast<size_t>(n));
      fp8_dequantize(codes.data(), n, scale_inv, f, ref.data());
      const auto got = download(out);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float r = bf16_to_float(float_to_bf16(ref[size_t(i)]));
        const bool same = std::isnan(r) ? std::isnan(got[size_t(i)]) : got[size_t(i)] == r;
        bad += same ? 0 : 1;
      }
      INFO("format " << (f == Fp8Format::e4m3 ? "e4m3" : "e5m2") << " n " << n);
      CHECK(bad == 0);
    }
}

namespace {

// (rows, cols) values, bf16-exact: rows of magnitudes 2^-6 .. 2^6 and, where there are enough rows, a
// zero row, rows holding inf, NaN and -inf, and a row so small that 448 / amax overflows f32 (scale 1).
std::vector<float> saved_input(int64_t rows, int64_t cols) {
  std::vector<float> v = randn(static_cast<size_t>(rows * cols));
  auto row = [&](int64_t r) { return v.data() + r * cols; };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) row(r)[c] *= std::ldexp(1.0f, static_cast<int>(r % 13) - 6);
  if (rows > 1) std::fill(row(1), row(1) + cols, 0.0f);
  if (rows > 2) row(2)[cols / 2] = INFINITY;
  if (rows > 3) row(3)[cols - 1] = NAN;
  if (rows > 4) row(4)[0] = -INFINITY;
  if (rows > 5)
    for (int64_t c = 0; c < cols; ++c) row(5)[c] *= 1e-39f;
  return round_bf16(std::move(v));
}

// What a save leaves: codes, row scale_inv, and the round trip as floats (bf16 on the device).
struct SavedRows {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv, rt;
};

// The host path (fp8/saved.h on an f32 tensor), its round trip rounded to bf16 as the device stores it.
SavedRows host_save(const std::vector<float>& v, int64_t rows, int64_t cols) {
  Tensor rt;
  const QuantizedTensor h = fp8_save(Tensor::from_vector(v, {rows, cols}), &rt);
  SavedRows out{std::vector<uint8_t>(h.codes.data<uint8_t>(), h.codes.data<uint8_t>() + rows * cols),
                h.scale_inv.to_float_vector(), rt.to_float_vector()};
  for (float& x : out.rt) x = bf16_to_float(float_to_bf16(x));
  return out;
}

std::vector<uint8_t> download_bytes(const void* p, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(n));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(out.data(), p, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<float> download_bf16(const __nv_bfloat16* p, int64_t n) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(bits.data(), p, bits.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

// A device bf16 buffer of `offset` + v.size() elements holding v from element `offset` on.
Tensor upload_at(const std::vector<float>& v, int64_t offset) {
  std::vector<float> padded(static_cast<size_t>(offset), 0.0f);
  padded.insert(padded.end(), v.begin(), v.end());
  return upload(padded, {static_cast<int64_t>(padded.size())}, DType::bf16);
}

// kernels::fp8_save_rows on v with outputs poisoned first; x at element x_off of its buffer, codes and
// the round trip (unless in place) at element out_off of theirs (an offset of 1 forces the scalar path).
SavedRows device_save(const std::vector<float>& v, int64_t rows, int64_t cols, int64_t x_off, int64_t out_off,
                      bool in_place) {
  const int64_t n = rows * cols;
  Tensor tx = upload_at(v, x_off);
  Tensor tc = poisoned({n + out_off}, DType::e4m3), ts = poisoned({rows}, DType::f32);
  Tensor trt = in_place ? Tensor() : poisoned({n + out_off}, DType::bf16);
  __nv_bfloat16* x = tx.data<__nv_bfloat16>() + x_off;
  __nv_bfloat16* rt = in_place ? x : trt.data<__nv_bfloat16>() + out_off;
  kernels::fp8_save_rows(x, rows, cols, tc.data<uint8_t>() + out_off, ts.data<float>(), rt, kernels::compute_stream());
  SavedRows out{download_bytes(tc.data<uint8_t>() + out_off, n), download(ts), download_bf16(rt, n)};
  return out;
}

// Elements whose bits differ (any NaN matches any NaN: the codec fixes NaN codes, not NaN payloads).
int64_t mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += std::isnan(want[i]) ? !std::isnan(got[i]) : std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  return bad;
}

int64_t mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
  return bad;
}

struct RowsShape {
  int64_t rows, cols;
};

// Every rows x cols of the brief, plus rows longer than one block's registers (16-byte path: 32768
// elements; scalar path: 8192).
std::vector<RowsShape> saved_shapes() {
  std::vector<RowsShape> shapes;
  for (int64_t rows : {1, 3, 1000})
    for (int64_t cols : {1, 7, 77, 2304, 3072, 6400}) shapes.push_back({rows, cols});
  shapes.push_back({2, 40000});
  shapes.push_back({3, 9001});
  shapes.push_back({7, 32768});
  return shapes;
}

}  // namespace

TEST_CASE("fp8_save_rows: codes, row scales and round trip bit-exact against the host path - shapes - in place",
          "[gpu][fp8][saved]") {
  for (const RowsShape sh : saved_shapes()) {
    const auto v = saved_input(sh.rows, sh.cols);
    const SavedRows h = host_save(v, sh.rows, sh.cols);
    for (const bool in_place : {false, true}) {
      INFO("rows " << sh.rows << " cols " << sh.cols << " in place " << in_place);
      const SavedRows d = device_save(v, sh.rows, sh.cols, 0, 0, in_place);
      CHECK(mismatches(d.codes, h.codes) == 0);
      CHECK(mismatches(d.scale_inv, h.scale_inv) == 0);
      CHECK(mismatches(d.rt, h.rt) == 0);
    }
  }
}

TEST_CASE("fp8_save_rows: misaligned input or outputs take the scalar path, bit-exact", "[gpu][fp8][saved]") {
  for (const RowsShape sh : {RowsShape{3, 2304}, RowsShape{1000, 77}, RowsShape{3, 6400}, RowsShape{2, 9001}}) {
    const auto v = saved_input(sh.rows, sh.cols);
    const SavedRows h = host_save(v, sh.rows, sh.cols);
    for (const auto& [x_off, out_off, in_place] : {std::tuple{1, 0, false}, std::tuple{1, 0, true},
                                                  std::tuple{0, 1, false}, std::tuple{1, 1, false}}) {
      INFO("rows " << sh.rows << " cols " << sh.cols << " x offset " << x_off << " output offset " << out_off
                   << " in place " << in_place);
      const SavedRows d = device_save(v, sh.rows, sh.cols, x_off, out_off, in_place);
      CHECK(mismatches(d.codes, h.codes) == 0);
      CHECK(mismatches(d.scale_inv, h.scale_inv) == 0);
      CHECK(mismatches(d.rt, h.rt) == 0);
    }
  }
}

TEST_CASE("fp8_save_rows_gelu_cast equals fp8_save_rows then the saved_gelu cast bit for bit - shapes - misaligned",
          "[gpu][fp8][saved]") {
  const cudaStream_t stream = kernels::compute_stream();
  // The tensor scale saturates the largest rows' GELU values in E4M3 (|gelu| up to ~2^8, times 7.5).
  const Tensor scale = upload({7.5f}, {1}, DType::f32);
  std::vector<std::tuple<RowsShape, int64_t>> cases;  // shape, offset of x, the codes and the output
  for (const RowsShape sh : saved_shapes()) cases.emplace_back(sh, 0);
  for (const RowsShape sh : {RowsShape{3, 2304}, RowsShape{1000, 77}, RowsShape{3, 6400}}) cases.emplace_back(sh, 1);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (const auto& [sh, off] : cases) {
      const int64_t rows = sh.rows, cols = sh.cols, n = rows * cols;
      INFO("rows " << rows << " cols " << cols << " offset " << off << " format "
                   << (f == Fp8Format::e4m3 ? "e4m3" : "e5m2"));
      const Tensor tx = upload_at(saved_input(rows, cols), off);
      const __nv_bfloat16* x = tx.data<__nv_bfloat16>() + off;
      struct Result {
        std::vector<uint8_t> codes, out;
        std::vector<float> scale_inv, amax;
        unsigned long long saturated;
      };
      auto run = [&](bool fused) {
        Tensor tc = poisoned({n + off}, DType::e4m3), ts = poisoned({rows}, DType::f32);
        Tensor to = poisoned({n + off}, DType::e4m3);
        Tensor st = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
        const kernels::Fp8CastOutputs stats{st.data<float>(),
                                            reinterpret_cast<unsigned long long*>(st.data<float>() + 2)};
        uint8_t* codes = tc.data<uint8_t>() + off;
        uint8_t* out = to.data<uint8_t>() + off;
        if (fused) {
          kernels::fp8_save_rows_gelu_cast(x, rows, cols, codes, ts.data<float>(), out, f, scale.data<float>(), stats,
                                           stream);
        } else {
          kernels::fp8_save_rows(x, rows, cols, codes, ts.data<float>(), nullptr, stream);
          kernels::Fp8CastOperands ops;
          ops.pre_codes = codes;
          ops.row_scale_inv = ts.data<float>();
          kernels::fp8_cast(nullptr, DType::bf16, rows, cols, out, nullptr, f, scale.data<float>(), stats, stream,
                            kernels::Fp8CastInput::saved_gelu, ops);
        }
        Result r{download_bytes(codes, n), download_bytes(out, n), download(ts), {}, 0};
        const std::vector<float> sv = download(st);
        r.amax = {sv[0]};
        std::memcpy(&r.saturated, &sv[2], sizeof(r.saturated));
        return r;
      };
      const Result want = run(false), got = run(true);
      CHECK(mismatches(got.codes, want.codes) == 0);
      CHECK(mismatches(got.scale_inv, want.scale_inv) == 0);
      CHECK(mismatches(got.out, want.out) == 0);
      CHECK(mismatches(got.amax, want.amax) == 0);
      CHECK(got.saturated == want.saturated);
      if (rows >= 1000 && f == Fp8Format::e4m3) CHECK(want.saturated > 0);  // the saturating rows were there
    }
}

TEST_CASE("fp8_dequantize_rows is bit-exact against the host path - shapes - misaligned - every code",
          "[gpu][fp8][saved]") {
  auto run = [](const std::vector<uint8_t>& codes, const std::vector<float>& scale_inv, int64_t rows, int64_t cols,
                int64_t off) {
    const int64_t n = rows * cols;
    Tensor tc = poisoned({n + off}, DType::e4m3), out = poisoned({n + off}, DType::bf16);
    CUDA_CHECK(cudaMemcpy(tc.data<uint8_t>() + off, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    Tensor ts = upload(scale_inv, {rows}, DType::f32);
    kernels::fp8_dequantize_rows(tc.data<uint8_t>() + off, rows, cols, ts.data<float>(),
                                 out.data<__nv_bfloat16>() + off, kernels::compute_stream());
    return download_bf16(out.data<__nv_bfloat16>() + off, n);
  };
  for (const RowsShape sh : saved_shapes()) {
    const SavedRows h = host_save(saved_input(sh.rows, sh.cols), sh.rows, sh.cols);
    for (const int64_t off : {0, 1}) {
      INFO("rows " << sh.rows << " cols " << sh.cols << " offset " << off);
      CHECK(mismatches(run(h.codes, h.scale_inv, sh.rows, sh.cols, off), h.rt) == 0);
    }
  }
  // Every code, in rows of 256 (every code once per row) and of 8 and 5, with assorted row scales.
  for (const int64_t cols : {256, 8, 5}) {
    const int64_t rows = 4 * 256 / cols;
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    std::vector<float> scale_inv(static_cast<size_t>(rows)), want(codes.size());
    for (int64_t r = 0; r < rows; ++r) {
      scale_inv[size_t(r)] = 0.0371f * std::ldexp(1.0f, static_cast<int>(r % 9) - 4);
      fp8_dequantize(codes.data() + r * cols, cols, scale_inv[size_t(r)], Fp8Format::e4m3, want.data() + r * cols);
    }
    for (float& x : want) x = bf16_to_float(float_to_bf16(x));
    for (const int64_t off : {0, 1}) {
      INFO("every code, cols " << cols << " offset " << off);
      CHECK(mismatches(run(codes, scale_inv, rows, cols, off), want) == 0);
    }
  }
}

TEST_CASE("fp8_save, fp8_save_inplace and fp8_restore on the GPU match the host path", "[gpu][fp8][saved]") {
  const int64_t B = 2, T = 77, C3 = 3 * 96;
  const auto v = saved_input(B * T, C3);
  const SavedRows h = host_save(v, B * T, C3);
  Tensor tx = upload(v, {B, T, C3}, DType::bf16), ty = upload(v, {B, T, C3}, DType::bf16);
  Tensor rt;
  const QuantizedTensor a = fp8_save(tx, &rt);
  const QuantizedTensor b = fp8_save_inplace(ty);
  for (const QuantizedTensor* s : {&a, &b}) {
    CHECK(s->cols() == C3);
    CHECK(s->layout == ScaleLayout::per_row);
    CHECK(fp8_restore(*s).dtype() == DType::bf16);
    CHECK(s->scale_inv.shape() == Shape{B * T});
    CHECK(mismatches(download_bytes(s->codes.raw(), B * T * C3), h.codes) == 0);
    CHECK(mismatches(download(s->scale_inv), h.scale_inv) == 0);
    CHECK(mismatches(download(fp8_restore(*s)), h.rt) == 0);
  }
  CHECK(mismatches(download(rt), h.rt) == 0);
  CHECK(mismatches(download(ty), h.rt) == 0);  // overwritten by the round trip
  CHECK(mismatches(download(tx), v) == 0);     // untouched
}

TEST_CASE("GELU and attention with FP8 storage on the GPU equal the plain ops on the restored input",
          "[gpu][fp8][saved]") {
  auto run = [](auto op, const Tensor& x, const Tensor& dy) {
    Var vx = make_var(x, true);
    Tape tape;
    Var y;
    {
      TapeScope s(&tape);
      y = op(vx);
    }
    grad_of(y).copy_from(dy);
    {
      TapeScope none(nullptr);
      tape.run_backward();
    }
    return std::make_pair(download(y->value), download(vx->grad));
  };
  {
    const int64_t n = 4 * 33 * 64;
    Tensor x = upload(round_bf16(randn(n, 2.0f)), {4, 33, 64}, DType::bf16);
    Tensor dy = upload(round_bf16(randn(n)), {4, 33, 64}, DType::bf16);
    Tensor rt;
    fp8_save(x, &rt);
    const auto stored = run([](const Var& v) { return gelu(v, true); }, x, dy);
    CHECK(download(x) == download(rt));  // the op overwrote its input with the same round trip
    const auto plain = run([](const Var& v) { return gelu(v, false); }, rt, dy);
    CHECK(stored.first == plain.first);
    CHECK(stored.second == plain.second);
  }
  {
    const int B = 2, T = 77, C = 128, NH = 2;
    Tensor qkv = upload(round_bf16(randn(int64_t{B} * T * 3 * C)), {B, T, 3 * C}, DType::bf16);
    Tensor dy = upload(round_bf16(randn(int64_t{B} * T * C)), {B, T, C}, DType::bf16);
    Tensor rt;
    fp8_save(qkv, &rt);
    const auto stored = run([&](const Var& v) { return attention(v, NH, true); }, qkv, dy);
    const auto plain = run([&](const Var& v) { return attention(v, NH, false); }, rt, dy);
    CHECK(stored.first == plain.first);
    CHECK(rel_err(stored.second, plain.second) < 1e-3);  // dQ sums with atomics: order may differ
  }
}

// fp8_all's MLP backward: one pass over pre's saved codes writes what the saved_gelu cast (fc2's wgrad operand,
// transposed E4M3) and the saved_dgelu cast (fc's dy codes in both layouts, statistics, column sums) write, bit for
// bit (the column sums within f32 atomics' reordering). Shapes: one tile, ragged tiles (rows a multiple of 16,
// columns of 8), and 1.5B's fc at 256 tokens; both dy formats, with and without the row-major output.
TEST_CASE("fp8_cast_saved_gelu_pair equals the saved_gelu and saved_dgelu casts bit for bit", "[gpu][fp8][saved]") {
  const cudaStream_t stream = kernels::compute_stream();
  const Tensor gelu_scale = upload({7.5f}, {1}, DType::f32), dy_scale = upload({3000.0f}, {1}, DType::f32);
  for (Fp8Format f : {Fp8Format::e5m2, Fp8Format::e4m3})
    for (const RowsShape sh : {RowsShape{128, 64}, RowsShape{272, 200}, RowsShape{256, 6400}, RowsShape{16, 8}})
      for (bool row_major : {true, false}) {
        const int64_t rows = sh.rows, cols = sh.cols, n = rows * cols;
        INFO("rows " << rows << " cols " << cols << " format " << (f == Fp8Format::e4m3 ? "e4m3" : "e5m2")
                     << (row_major ? "" : ", no row-major output"));
        // pre's per-row codes as fp8_all saves them, and a gradient for gelu(pre).
        const Tensor tx = upload_at(saved_input(rows, cols), 0);
        Tensor codes = poisoned({n}, DType::e4m3), row_scale_inv = poisoned({rows}, DType::f32);
        kernels::fp8_save_rows(tx.data<__nv_bfloat16>(), rows, cols, codes.data<uint8_t>(), row_scale_inv.data<float>(),
                               nullptr, stream);
        const Tensor dy = upload(randn(n, 1e-3f), {rows, cols}, DType::bf16);
        kernels::Fp8CastOperands ops;
        ops.pre_codes = codes.data<uint8_t>();
        ops.row_scale_inv = row_scale_inv.data<float>();
        struct Result {
          std::vector<uint8_t> out, out_t, gelu_t;
          std::vector<float> colsum, amax;
          unsigned long long saturated;
        };
        auto run = [&](bool fused) {
          Tensor to = poisoned({n}, DType::e4m3), tt = poisoned({n}, DType::e4m3), tg = poisoned({n}, DType::e4m3);
          Tensor cs = Tensor::zeros({cols}, DType::f32, kGpu);
          Tensor st = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
          kernels::Fp8CastOutputs stats{st.data<float>(), reinterpret_cast<unsigned long long*>(st.data<float>() + 2)};
          stats.colsum = cs.data<float>();
          uint8_t* out = row_major ? to.data<uint8_t>() : nullptr;
          const auto* in = dy.data<__nv_bfloat16>();
          if (fused) {
            REQUIRE(kernels::fp8_saved_gelu_pair_supported(in, rows, cols, out, tt.data<uint8_t>(), tg.data<uint8_t>(),
                                                           ops));
            kernels::fp8_cast_saved_gelu_pair(in, rows, cols, out, tt.data<uint8_t>(), tg.data<uint8_t>(), f,
                                              dy_scale.data<float>(), gelu_scale.data<float>(), stats, ops, stream);
          } else {
            kernels::fp8_cast(nullptr, DType::bf16, rows, cols, nullptr, tg.data<uint8_t>(), Fp8Format::e4m3,
                              gelu_scale.data<float>(), kernels::Fp8CastOutputs{}, stream,
                              kernels::Fp8CastInput::saved_gelu, ops);
            kernels::fp8_cast(in, DType::bf16, rows, cols, out, tt.data<uint8_t>(), f, dy_scale.data<float>(), stats,
                              stream, kernels::Fp8CastInput::saved_dgelu, ops);
          }
          Result r{row_major ? download_bytes(out, n) : std::vector<uint8_t>{}, download_bytes(tt.data<uint8_t>(), n),
                   download_bytes(tg.data<uint8_t>(), n), download(cs), {}, 0};
          const std::vector<float> sv = download(st);
          r.amax = {sv[0]};
          std::memcpy(&r.saturated, &sv[2], sizeof(r.saturated));
          return r;
        };
        const Result want = run(false), got = run(true);
        CHECK(mismatches(got.out, want.out) == 0);
        CHECK(mismatches(got.out_t, want.out_t) == 0);
        CHECK(mismatches(got.gelu_t, want.gelu_t) == 0);
        CHECK(mismatches(got.amax, want.amax) == 0);
        CHECK(got.saturated == want.saturated);
        // The input's inf and NaN rows make some column sums non-finite: those must be the same, the rest equal
        // within reordered-f32-sum tolerance (the atomics' order varies).
        std::vector<float> got_finite, want_finite;
        size_t nonfinite_mismatches = 0;
        for (size_t i = 0; i < want.colsum.size(); ++i) {
          const float g = got.colsum[i], w = want.colsum[i];
          if (std::isfinite(g) && std::isfinite(w)) {
            got_finite.push_back(g);
            want_finite.push_back(w);
          } else if (!(std::isnan(g) && std::isnan(w)) && g != w) {
            ++nonfinite_mismatches;
          }
        }
        CHECK(nonfinite_mismatches == 0);
        CHECK(want_finite.size() >= want.colsum.size() / 2);
        CHECK(rel_err(got_finite, want_finite) < 1e-5);
      }
  // Shapes the one-pass kernel does not take are refused, so the caller runs the two casts.
  CHECK_FALSE(kernels::fp8_saved_gelu_pair_supported(nullptr, 100, 64, nullptr, nullptr, nullptr, {}));
}
