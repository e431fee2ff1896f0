// fp8_transpose on the GPU, byte for byte against the host transpose: random bytes with every value, shapes
// below, at and past a tile, thin either way, aligned and misaligned, nothing stored outside out_t.
#include <catch2/catch_test_macros.hpp>
#include <algorithm>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/fp8_cast.cuh"
#include "kernels/stream.cuh"
#include "util/fp8_test_util.h"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("fp8 transpose: random bytes bit-exact vs the host transpose - odd shapes - misaligned - no stray stores",
          "[gpu][fp8]") {
  const uint32_t seed = std::random_device{}();  // fresh bytes every run; the seed is reported on failure
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  constexpr int64_t kGuard = 64;  // poisoned bytes after out_t that must stay poisoned
  constexpr uint8_t kPoison = 0xA5;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {1, 1000}, {1000, 1}, {37, 129}, {64, 64},
                            {768, 2304}, {3, 70000}}) {
    const int64_t n = rows * cols;
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    for (auto& c : codes) c = static_cast<uint8_t>(byte(gen));
    for (int64_t i = 0; i < std::min<int64_t>(n, 256); ++i) codes[i] = static_cast<uint8_t>(i);  // every value
    std::shuffle(codes.begin(), codes.end(), gen);
    const std::vector<uint8_t> ref = transpose_codes(codes, rows, cols);
    // offset 1 misaligns in and out_t: the byte-by-byte loads and stores even where rows or cols % 4 == 0.
    for (int64_t offset : {0, 1}) {
      INFO("(" << rows << ", " << cols << ") offset " << offset << " seed " << seed);
      Tensor h_in = Tensor::empty({n + offset}, DType::e4m3);
      std::memcpy(h_in.data<uint8_t>() + offset, codes.data(), codes.size());
      const Tensor in = h_in.to(kGpu);
      Tensor out = Tensor::empty({n + offset + kGuard}, DType::e4m3, kGpu);
      CUDA_CHECK(cudaMemset(out.raw(), kPoison, out.nbytes()));
      kernels::fp8_transpose(in.data<uint8_t>() + offset, rows, cols, out.data<uint8_t>() + offset,
                             kernels::compute_stream());
      const std::vector<uint8_t> all = download_codes(out);
      const std::vector<uint8_t> got(all.begin() + offset, all.begin() + offset + n);
      CHECK(code_mismatches(got, ref) == 0);
      int64_t stray = 0;
      for (int64_t i = 0; i < offset; ++i) stray += all[i] != kPoison;
      for (int64_t i = offset + n; i < static_cast<int64_t>(all.size()); ++i) stray += all[i] != kPoison;
      CHECK(stray == 0);
    }
  }
  Tensor buf = Tensor::zeros({16}, DType::e4m3, kGpu);
  CHECK_THROWS(kernels::fp8_transpose(buf.data<uint8_t>(), 0, 16, buf.data<uint8_t>(), kernels::compute_stream()));
  CHECK_THROWS(kernels::fp8_transpose(nullptr, 4, 4, buf.data<uint8_t>(), kernels::compute_stream()));
}
