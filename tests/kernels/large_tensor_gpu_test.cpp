// Tensors of more than 2^31 elements: the launchers reject a dimension or grid past its limit with a
// message (no allocation needed), and, hidden behind [.big] (about 20 GB of device memory; run it with
// `fp8t_gpu_tests "[big]"`), GELU backward and the FP8 casts (flat, and tiled with the transpose) over
// 2^31 + 4096 bf16 elements, sampled near the start, around 2^30 and 2^31 and at the end against the
// host formulas.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>

#include "core/launch_limits.h"
#include "util/gpu_test_util.h"
#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/fp8_cast.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/stream.cuh"
#include "ops/cpu/gelu.h"
#include "ops/gelu_cuda.h"

using namespace fp8t;
using namespace fp8t::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// A stand-in for a device pointer that the launcher must never reach the kernel with.
template <typename T>
T* never_read() {
  return reinterpret_cast<T*>(uintptr_t{1} << 12);
}

// t (n) bf16 with t[i] = base[i % base.size()], written on the device by doubling copies. The period
// is odd, so an index that wrapped by a power of two reads a different value.
void fill_periodic(Tensor& t, const std::vector<uint16_t>& base) {
  const int64_t n = t.numel(), p = static_cast<int64_t>(base.size());
  REQUIRE(p % 2 == 1);
  auto* d = static_cast<uint16_t*>(t.raw());
  CUDA_CHECK(cudaMemcpy(d, base.data(), std::min(n, p) * 2, cudaMemcpyHostToDevice));
  for (int64_t k = p; k < n; k *= 2)
    CUDA_CHECK(cudaMemcpy(d + k, d, std::min(k, n - k) * 2, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // device-to-device copies need not have finished on return
}

std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]);
  return b;
}

// count elements of t from `begin` (bf16 or 1-byte codes), copied back.
template <typename T>
std::vector<T> download_range(const Tensor& t, int64_t begin, int64_t count) {
  std::vector<T> h(static_cast<size_t>(count));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(h.data(), static_cast<const T*>(t.raw()) + begin, count * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

TEST_CASE("launchers reject sizes past the 32-bit and grid limits", "[gpu][launch]") {
  const cudaStream_t s = kernels::compute_stream();
  // One block per token: 2^21 sequences of 1024 tokens are 2^31 blocks.
  CHECK_THROWS_WITH(kernels::embedding_forward(never_read<__nv_bfloat16>(), never_read<int32_t>(),
                                               never_read<__nv_bfloat16>(), never_read<__nv_bfloat16>(), 1 << 21, 1024,
                                               768, s),
                    ContainsSubstring("embedding_forward: B*T tokens") && ContainsSubstring("2147483648 blocks"));
  CHECK_THROWS_WITH(kernels::embedding_backward(never_read<float>(), never_read<float>(), never_read<__nv_bfloat16>(),
                                                never_read<int32_t>(), 1 << 21, 1024, 768, s),
                    ContainsSubstring("embedding_backward: B*T tokens"));
  // LayerNorm: 8 rows per block.
  const int64_t too_many_rows = kMaxGridX * 8 + 1;
  CHECK_THROWS_WITH(kernels::layernorm_forward(never_read<__nv_bfloat16>(), never_read<float>(), never_read<float>(),
                                               never_read<__nv_bfloat16>(), never_read<__nv_bfloat16>(),
                                               never_read<__nv_bfloat16>(), too_many_rows, 768, s),
                    ContainsSubstring("layernorm_forward: N rows"));
  CHECK_THROWS_WITH(kernels::layernorm_stats(never_read<float>(), never_read<float>(), never_read<__nv_bfloat16>(),
                                             too_many_rows, 768, s),
                    ContainsSubstring("layernorm_stats: N rows"));
  // The tiled cast: 128 rows per grid row, 65535 grid rows; and 2^38 rows, whose int tile count wraps.
  for (int64_t rows : {int64_t{65535} * 128 + 1, int64_t{1} << 38}) {
    CHECK_THROWS_WITH(kernels::fp8_cast(never_read<__nv_bfloat16>(), DType::bf16, rows, 64, nullptr,
                                        never_read<uint8_t>(), Fp8Format::e4m3, never_read<float>(), {}, s),
                      ContainsSubstring("fp8_cast (tiled): rows (128 per tile)") && ContainsSubstring("65535"));
  }
  // Attention takes the qkv row length 3 * NH * HS as int.
  CHECK_THROWS_WITH(kernels::attention_forward(never_read<__nv_bfloat16>(), never_read<float>(),
                                               never_read<__nv_bfloat16>(), 1, 64, 1 << 24, 64, s),
                    ContainsSubstring("attention_forward: the qkv row length"));
  CUDA_CHECK(cudaDeviceSynchronize());  // nothing was launched
}

TEST_CASE("GELU backward and FP8 casts over 2^31 + 4096 bf16 elements", "[gpu][.big]") {
  const int64_t n = (int64_t{1} << 31) + 4096;
  // (B*T, C) at C = 768: 2796208 rows, a multiple of 16 (the transposed 16-byte stores) but not of the
  // 128-row tile.
  const int64_t cols = 768, rows = n / cols;
  REQUIRE(rows * cols == n);
  REQUIRE(rows % 16 == 0);
  // Odd periods, distinct per tensor.
  const auto bx = bf16_bits(randn(65521, 2.0f)), bdy = bf16_bits(randn(65519)), bdx = bf16_bits(randn(65517, 0.5f));
  auto at = [](const std::vector<uint16_t>& b, int64_t i) { return bf16_to_float(b[static_cast<size_t>(i % b.size())]); };

  Tensor x = Tensor::empty({n}, DType::bf16, kGpu), dy = Tensor::empty({n}, DType::bf16, kGpu);
  Tensor dx = Tensor::empty({n}, DType::bf16, kGpu);
  fill_periodic(x, bx);
  fill_periodic(dy, bdy);
  fill_periodic(dx, bdx);

  // Windows of sampled indices: the start, bf16 byte offset 2^31 (element 2^30), element 2^31 (also
  // FP8 byte offset 2^31 and vector index 2^28 of 8 elements), the end; plus random ones.
  std::vector<std::pair<int64_t, int64_t>> windows = {
      {0, 128}, {(int64_t{1} << 30) - 64, 128}, {(int64_t{1} << 31) - 128, 256}, {n - 256, 256}};
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int k = 0; k < 64; ++k) windows.push_back({pick(rng()), 1});

  SECTION("GELU backward") {
    cuda_ops::gelu_backward(dx, x, dy);
    int64_t bad = 0, checked = 0;
    for (const auto& [begin, count] : windows) {
      const auto got = download_range<uint16_t>(dx, begin, count);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t i = begin + j;
        const double xi = at(bx, i), di = at(bdy, i), acc = at(bdx, i);
        double ref = acc;
        cpu::gelu_backward<double>(&ref, &xi, &di, 1);
        const double g = bf16_to_float(got[static_cast<size_t>(j)]);
        const double tol = 8e-3 * std::fabs(ref) + 1e-4 * (std::fabs(acc) + std::fabs(ref - acc)) + 1e-6;
        if (!(std::fabs(g - ref) <= tol) && bad++ < 5) UNSCOPED_INFO("element " << i << ": " << g << " vs " << ref);
        ++checked;
      }
    }
    CHECK(checked >= 700);
    CHECK(bad == 0);
  }

  SECTION("FP8 casts: flat and tiled with the transpose - amax and saturation") {
    const float scale = 100.0f;  // |x| > 4.48 saturates E4M3: about 2.5% of N(0, 2)
    const Fp8Format f = Fp8Format::e4m3;
    Tensor d_scale = upload({scale}, {1}, DType::f32);
    Tensor flat = Tensor::empty({n}, DType::e4m3, kGpu), tiled = Tensor::empty({n}, DType::e4m3, kGpu);
    Tensor tiled_t = Tensor::empty({n}, DType::e4m3, kGpu);
    Tensor stats = Tensor::zeros({4}, DType::f32, kGpu);  // amax (float), pad, saturated (u64)
    const cudaStream_t s = kernels::compute_stream();
    kernels::fp8_cast(x.raw(), DType::bf16, rows, cols, flat.data<uint8_t>(), nullptr, f, d_scale.data<float>(), {}, s);
    kernels::fp8_cast(x.raw(), DType::bf16, rows, cols, tiled.data<uint8_t>(), tiled_t.data<uint8_t>(), f,
                      d_scale.data<float>(),
                      {stats.data<float>(), reinterpret_cast<unsigned long long*>(stats.data<float>() + 2)}, s);
    auto ref_code = [&](int64_t i) { return float_to_fp8(at(bx, i) * scale, f); };
    int64_t bad = 0, checked = 0;
    for (const auto& [begin, count] : windows) {
      const auto got_flat = download_range<uint8_t>(flat, begin, count);
      const auto got_tiled = download_range<uint8_t>(tiled, begin, count);
      const auto got_t = download_range<uint8_t>(tiled_t, begin, count);
      for (int64_t j = 0; j < count; ++j) {
        const int64_t i = begin + j;
        const int64_t r = i % rows, c = i / rows;  // tiled_t (cols, rows): element i is in[r, c]
        const auto k = static_cast<size_t>(j);
        const bool ok = got_flat[k] == ref_code(i) && got_tiled[k] == ref_code(i) && got_t[k] == ref_code(r * cols + c);
        if (!ok && bad++ < 5)
          UNSCOPED_INFO("element " << i << ": flat " << int(got_flat[k]) << " tiled " << int(got_tiled[k])
                                   << " transposed " << int(got_t[k]) << " vs " << int(ref_code(i)) << " and "
                                   << int(ref_code(r * cols + c)));
        ++checked;
      }
    }
    CHECK(checked >= 700);
    CHECK(bad == 0);
    // Every element is counted once: the amax is the base's, the saturation count its periodic sum.
    float amax = 0.0f;
    int64_t sat_base = 0, sat_tail = 0;
    const auto p = static_cast<int64_t>(bx.size());
    for (int64_t i = 0; i < p; ++i) {
      const float v = at(bx, i);
      amax = std::max(amax, std::fabs(v));
      const bool sat = std::fabs(v * scale) > fp8_max(f);
      sat_base += sat;
      if (i < n % p) sat_tail += sat;
    }
    const Tensor hs = stats.to(Device::cpu());
    uint64_t sat = 0;
    std::memcpy(&sat, hs.data<float>() + 2, 8);
    CHECK(hs.data<float>()[0] == amax);
    CHECK(sat == static_cast<uint64_t>(n / p * sat_base + sat_tail));
  }
}
