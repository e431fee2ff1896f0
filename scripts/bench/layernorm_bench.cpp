// The LayerNorm backward (kernels::layernorm_backward) alone, timed with CUDA events: microseconds per call and the
// bandwidth its bytes give (x, dy and dinp read, dinp written; + the E5M2 codes with codes), for each output form
// (plain, dinp's column sums for a BF16 bias, E5M2 dy codes without the transposed copy).
// Usage: layernorm_bench N C [iterations]   e.g. layernorm_bench 16384 1600 (GPT-2 1.5B at B 16), 32768 768 (124M
// at B 32). Build: cmake --build build-gpu --target layernorm_bench (a CUDA build; not built by default).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "kernels/layernorm.cuh"

using bf16 = __nv_bfloat16;

namespace {

template <typename T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

std::vector<bf16> random_bf16(size_t n, std::mt19937& rng, float sd, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16_rn(d(rng));
  return v;
}

int run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s N C [iterations]\n", argv[0]);
    return 2;
  }
  const int64_t N = std::atoll(argv[1]);
  const int C = std::atoi(argv[2]), iters = argc > 3 ? std::atoi(argv[3]) : 50;
  if (N <= 0 || C <= 0 || C % 8 != 0 || iters <= 0) {
    std::fprintf(stderr, "layernorm_bench: N > 0, C > 0 a multiple of 8 and iterations > 0, got %s %s\n", argv[1],
                 argv[2]);
    return 2;
  }
  std::mt19937 rng(1234);
  const size_t n = static_cast<size_t>(N) * C;
  bf16* x = upload(random_bf16(n, rng, 1.0f));
  bf16* dy = upload(random_bf16(n, rng, 1e-3f));
  bf16* dinp = upload(random_bf16(n, rng, 1e-3f));
  bf16* w = upload(random_bf16(C, rng, 0.1f, 1.0f));
  float* mean = upload(std::vector<float>(N, 0.0f));
  float* rstd = upload(std::vector<float>(N, 1.0f));
  float* dw = upload(std::vector<float>(C, 0.0f));
  float* db = upload(std::vector<float>(C, 0.0f));
  float* colsum = upload(std::vector<float>(C, 0.0f));
  float* scale = upload(std::vector<float>{1024.0f});
  float* amax = upload(std::vector<float>{0.0f});
  unsigned long long* saturated = upload(std::vector<unsigned long long>{0});
  uint8_t* codes = nullptr;
  CUDA_CHECK(cudaMalloc(&codes, n));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));

  const fp8t::kernels::LayerNormDyCodes sums{.stats = {.colsum = colsum}};
  const fp8t::kernels::LayerNormDyCodes with_codes{
      .codes = codes, .scale = scale, .stats = {.amax = amax, .saturated = saturated, .colsum = colsum}};
  const struct {
    const char* name;
    const fp8t::kernels::LayerNormDyCodes* dy;
    double extra_bytes;
  } forms[] = {{"plain", nullptr, 0.0}, {"colsum", &sums, 0.0}, {"codes", &with_codes, static_cast<double>(n)}};
  std::printf("| N | C | form | us per call | GB/s |\n|---|---|---|---|---|\n");
  for (const auto& f : forms) {
    auto call = [&] { fp8t::kernels::layernorm_backward(dinp, dw, db, dy, x, w, mean, rstd, N, C, stream, f.dy); };
    for (int i = 0; i < 5; ++i) call();
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) call();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    const double us = 1e3 * ms / iters, bytes = 4.0 * n * sizeof(bf16) + f.extra_bytes;
    std::printf("| %lld | %d | %s | %.1f | %.0f |\n", static_cast<long long>(N), C, f.name, us, bytes / us / 1e3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a CUDA error (no device, out of memory for N x C): said, not a signal
    std::fprintf(stderr, "layernorm_bench: %s\n", e.what());
    return 1;
  }
}
