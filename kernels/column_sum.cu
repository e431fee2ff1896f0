// The bias-gradient column reduction of kernels/matmul.cuh (matmul_backward_bias): dbias += column sums of dout.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/device_facts.cuh"
#include "kernels/matmul.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

// block (32 column lanes, 8 row lanes); grid (column tiles, row chunks of `chunk` rows). kVec: each column lane
// sums 8 adjacent columns with 16-byte loads (N % 8 == 0, aligned); else one column per lane. A row lane issues
// the loads of four rows before it adds any of them, so each thread keeps four loads in flight: with one, the
// kernel ran at ~2.9 TB/s (the twentieth session's 1.5B timeline).
template <bool kVec>
__global__ void column_sum_kernel(float* dbias, const bf16* dout, int M, int N, int chunk) {
  constexpr int kCols = kVec ? 8 : 1, kLoads = 4;
  using Row = std::conditional_t<kVec, Vec16<bf16>, bf16>;
  __shared__ float s_acc[8][32 * kCols + 1];
  const int c0 = (blockIdx.x * 32 + threadIdx.x) * kCols;
  float acc[kCols] = {};
  auto add_row = [&](const Row& q) {
    if constexpr (kVec) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) acc[i] += __bfloat162float(q.v[i]);
    } else {
      acc[0] += __bfloat162float(q);
    }
  };
  auto load_row = [&](int64_t r) -> Row {
    if constexpr (kVec) return Vec16<bf16>::load(dout + r * N + c0);
    else return dout[r * N + c0];
  };
  if (c0 < N) {
    const int64_t begin = int64_t{blockIdx.y} * chunk, end = begin + chunk < M ? begin + chunk : M;
    int64_t r = begin + threadIdx.y;
    for (; r + 8 * (kLoads - 1) < end; r += 8 * kLoads) {
      Row q[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) q[j] = load_row(r + 8 * j);
#pragma unroll
      for (int j = 0; j < kLoads; ++j) add_row(q[j]);
    }
    for (; r < end; r += 8) add_row(load_row(r));
  }
#pragma unroll
  for (int i = 0; i < kCols; ++i) s_acc[threadIdx.y][threadIdx.x * kCols + i] = acc[i];
  __syncthreads();
  // Thread (x, y) finishes columns x + 32 * j of the tile for j = y, y + 8, ...
  for (int j = threadIdx.y; j < kCols; j += 8) {
    const int t = threadIdx.x + 32 * j, c = blockIdx.x * 32 * kCols + t;
    if (c >= N) continue;
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum += s_acc[k][t];
    atomicAdd(&dbias[c], sum);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launcher

void matmul_backward_bias(float* dbias, const bf16* dout, int M, int N, cudaStream_t stream) {
  FP8T_CHECK(M > 0 && N > 0, "matmul_backward_bias: bad sizes M={} N={}", M, N);
  const bool vec = N % 8 == 0 && aligned16(dout);
  const int col_tiles = ceil_div(N, vec ? 256 : 32);
  // One wave of blocks (the occupancy calculator's blocks per SM: 5 at 48 registers) over the column tiles, each over
  // a chunk of at least 64 rows, a multiple of the 32 rows its row lanes read per round of loads: few enough blocks
  // that each streams a long run of rows and the column atomics stay few. (A grid of 8 per SM ran 1.4-1.6 waves at
  // GPT-2 1.5B shapes: Nsight Compute, docs/perf-notes.md, twenty-first session.)
  static PerDevice<int> resident[2];  // by kernel: vector, scalar
  const int slots = resident[vec ? 0 : 1].get([vec] {
    return vec ? resident_blocks(reinterpret_cast<const void*>(column_sum_kernel<true>), 256)
               : resident_blocks(reinterpret_cast<const void*>(column_sum_kernel<false>), 256);
  });
  const int row_chunks = std::clamp(slots / col_tiles, 1, std::max(1, ceil_div(M, 64)));
  const int chunk = ceil_div(ceil_div(M, row_chunks), 32) * 32;
  const dim3 grid(col_tiles, ceil_div(M, chunk)), block(32, 8);
  if (vec)
    column_sum_kernel<true><<<grid, block, 0, stream>>>(dbias, dout, M, N, chunk);
  else
    column_sum_kernel<false><<<grid, block, 0, stream>>>(dbias, dout, M, N, chunk);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
