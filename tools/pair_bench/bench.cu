// The saved-GELU pair kernel (kernels/fp8_cast_pair.cu) against variants of it (variants.py), side by side in one
// process: first every variant's codes against the kernel's, byte for byte (outputs poisoned first), then the
// time per launch, the variants interleaved over rounds (CUDA events, 20 launches each). E5M2 with column sums,
// as fp8_all's fc runs it; dy ~ N(0, 1e-3) in bf16, pre's codes uniform over the E4M3 codes (NaN codes only in
// the first 1% of elements); a few dy are NaN, +inf, -inf or large (saturating), so that the variants'
// special-value paths are compared too.
// Usage: bench [ROWS COLS ROUNDS] (default GPT-2 1.5B's fc at B=16, T=1024: 16384 6400 5). Built by run.sh.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "variants.cuh"

using namespace fp8t;
using namespace fp8t::kernels;

#define CK(x)                                                               \
  do {                                                                      \
    const cudaError_t e = (x);                                              \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s failed: %s\n", #x, cudaGetErrorString(e));            \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

namespace {

using Kernel = void (*)(const bf16*, uint8_t*, uint8_t*, uint8_t*, int64_t, int64_t, const float*, const float*,
                        Fp8CastOutputs, Fp8CastOperands);
struct Variant {
  const char* name;
  Kernel kernel;
};
const Variant kVariants[] = {{"base", pair_base<Fp8Format::e5m2, true>},
                             {"nostats", pair_nostats<Fp8Format::e5m2, true>},
                             {"lb4", pair_lb4<Fp8Format::e5m2, true>},
                             {"lb4_nostats", pair_lb4_nostats<Fp8Format::e5m2, true>}};
constexpr int kCount = sizeof(kVariants) / sizeof(kVariants[0]);

// One variant's outputs.
struct Outputs {
  uint8_t *out, *out_t, *gelu_t;
  float *colsum, *amax;
  unsigned long long* saturated;
  explicit Outputs(int64_t n, int64_t cols) {
    CK(cudaMalloc(&out, n));
    CK(cudaMalloc(&out_t, n));
    CK(cudaMalloc(&gelu_t, n));
    CK(cudaMalloc(&colsum, cols * sizeof(float)));
    CK(cudaMalloc(&amax, sizeof(float)));
    CK(cudaMalloc(&saturated, sizeof(unsigned long long)));
  }
};

std::vector<uint8_t> bytes(const uint8_t* p, int64_t n) {
  std::vector<uint8_t> h(n);
  CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 16384, cols = argc > 2 ? std::atoll(argv[2]) : 6400;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (rows % 16 || cols % 8) {
    std::printf("bench: rows %% 16 and cols %% 8 must be 0 (the kernel's 16-byte path)\n");
    return 2;
  }
  const int64_t n = rows * cols;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<uint16_t> dy(n);
  std::vector<uint8_t> codes(n);
  std::vector<float> row_scale_inv(rows);
  for (int64_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    dy[i] = static_cast<uint16_t>(u >> 16);
    const auto c = static_cast<uint8_t>(rng() & 0xFF);
    codes[i] = (c & 0x7F) == 0x7F && i >= n / 100 ? c ^ 1 : c;  // NaN codes (2 in 256) in the first 1% only
  }
  const uint16_t special[4] = {0x7FC0, 0x7F80, 0xFF80, 0x4700};  // NaN, +inf, -inf, 32768 (x 4096 saturates)
  for (int64_t i = 12345; i < n; i += 999983) dy[i] = special[(i / 999983) % 4];
  for (float& s : row_scale_inv) s = 0.01f + 0.0002f * static_cast<float>(rng() % 100);
  bf16* d_dy;
  uint8_t* d_codes;
  float *d_row_scale_inv, *d_scales;
  CK(cudaMalloc(&d_dy, n * 2));
  CK(cudaMalloc(&d_codes, n));
  CK(cudaMalloc(&d_row_scale_inv, rows * sizeof(float)));
  CK(cudaMalloc(&d_scales, 2 * sizeof(float)));
  CK(cudaMemcpy(d_dy, dy.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_codes, codes.data(), n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_row_scale_inv, row_scale_inv.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
  const float scales[2] = {4096.0f, 2.0f};  // dy's (E5M2) and gelu's (E4M3)
  CK(cudaMemcpy(d_scales, scales, sizeof scales, cudaMemcpyHostToDevice));
  Fp8CastOperands ops;
  ops.pre_codes = d_codes;
  ops.row_scale_inv = d_row_scale_inv;
  const dim3 grid(static_cast<unsigned>(cols / kTileCols + (cols % kTileCols != 0)),
                  static_cast<unsigned>(rows / kTileRows + (rows % kTileRows != 0)));
  std::vector<Outputs> outs;
  for (int v = 0; v < kCount; ++v) outs.emplace_back(n, cols);
  auto launch = [&](int v) {
    const Outputs& o = outs[v];
    kVariants[v].kernel<<<grid, kThreads>>>(d_dy, o.out, o.out_t, o.gelu_t, rows, cols, d_scales, d_scales + 1,
                                             Fp8CastOutputs{o.amax, o.saturated, o.colsum}, ops);
  };

  // Codes: each variant's against the kernel's, byte for byte, after poisoning every output.
  for (int v = 0; v < kCount; ++v) {
    for (uint8_t* p : {outs[v].out, outs[v].out_t, outs[v].gelu_t}) CK(cudaMemset(p, 0xAB, n));
    CK(cudaMemset(outs[v].colsum, 0, cols * sizeof(float)));
    CK(cudaMemset(outs[v].amax, 0, sizeof(float)));
    CK(cudaMemset(outs[v].saturated, 0, sizeof(unsigned long long)));
    launch(v);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  int bad = 0;
  const char* names[3] = {"out", "out_t", "gelu_t"};
  for (int k = 0; k < 3; ++k) {
    auto field = [&](int v) { return k == 0 ? outs[v].out : k == 1 ? outs[v].out_t : outs[v].gelu_t; };
    const auto want = bytes(field(0), n);
    int64_t poisoned = 0;
    for (uint8_t b : want) poisoned += b == 0xAB;
    std::printf("base %s: %lld of %lld bytes still 0xAB (a code may be 0xAB)\n", names[k],
                static_cast<long long>(poisoned), static_cast<long long>(n));
    for (int v = 1; v < kCount; ++v) {
      const auto got = bytes(field(v), n);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += got[i] != want[i];
      std::printf("%-12s %-6s: %lld bytes differ from base\n", kVariants[v].name, names[k],
                  static_cast<long long>(differ));
      bad += differ != 0;
    }
  }
  for (int v = 0; v < kCount; ++v) {
    float amax;
    unsigned long long saturated;
    CK(cudaMemcpy(&amax, outs[v].amax, sizeof amax, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&saturated, outs[v].saturated, sizeof saturated, cudaMemcpyDeviceToHost));
    unsigned amax_bits;
    std::memcpy(&amax_bits, &amax, sizeof amax_bits);
    std::printf("%-12s amax bits %08x, saturated %llu\n", kVariants[v].name, amax_bits, saturated);
  }

  // Time: rounds of 20 launches per variant, the order reversed every other round.
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w)
    for (int v = 0; v < kCount; ++v) launch(v);
  std::vector<double> total(kCount, 0.0);
  for (int r = 0; r < rounds; ++r)
    for (int i = 0; i < kCount; ++i) {
      const int v = r % 2 ? kCount - 1 - i : i;
      CK(cudaEventRecord(e0));
      for (int it = 0; it < 20; ++it) launch(v);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      total[v] += ms / 20;
      std::printf("round %d %-12s %7.1f us\n", r, kVariants[v].name, 1000.0 * ms / 20);
    }
  CK(cudaGetLastError());
  const double moved = 6.0 * n;  // dy (2) and pre's codes (1) in; out, out_t and gelu_t (1 each) out
  for (int v = 0; v < kCount; ++v)
    std::printf("mean %-12s %7.1f us, %.2f TB/s, / base %.4f\n", kVariants[v].name, 1000.0 * total[v] / rounds,
                moved / (total[v] / rounds * 1e-3) / 1e12, total[v] / total[0]);
  return bad ? 1 : 0;
}
