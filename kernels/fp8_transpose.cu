// The transpose of 1-byte elements (FP8 codes copied unchanged), fp8_transpose of kernels/fp8_cast.cuh:
// 4-byte loads and stores on both sides, staged through a padded shared tile.
#include "core/launch_limits.h"
#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cast.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr int kTile = 64;             // a block transposes a (kTile, kTile) tile of bytes
constexpr int kWords = kTile / 4;     // 4-byte words per tile row
constexpr int kPitch = kWords + 1;    // words per shared row: 17, odd, so tile rows start in spread banks
constexpr int kThreads = kWords * kWords;  // one thread per (4, 4) block of the tile
static_assert(kThreads == 256 && kTile * kWords == 4 * kThreads, "a thread loads 4 words and stores 4 words");

// The (4, 4) byte block in rows[0..3] (byte e of rows[k] = element (k, e)) transposed: byte k of col[e].
__device__ __forceinline__ void transpose4x4(const uint32_t (&rows)[4], uint32_t (&col)[4]) {
  const uint32_t ab01 = __byte_perm(rows[0], rows[1], 0x5140), ab23 = __byte_perm(rows[0], rows[1], 0x7362);
  const uint32_t cd01 = __byte_perm(rows[2], rows[3], 0x5140), cd23 = __byte_perm(rows[2], rows[3], 0x7362);
  col[0] = __byte_perm(ab01, cd01, 0x5410);
  col[1] = __byte_perm(ab01, cd01, 0x7632);
  col[2] = __byte_perm(ab23, cd23, 0x5410);
  col[3] = __byte_perm(ab23, cd23, 0x7632);
}

// out_t (cols, rows) = in (rows, cols) transposed. Block b takes tile (b / col_tiles, b % col_tiles) (a 1-D
// grid: no 65535 limit on either side). Load: in each of 4 passes a warp reads word lane % 16 of tile rows i
// and i + 16 (two 64-byte segments) into s_tile unchanged; row i + 16 lies 16 banks past row i (17 * 16 = 272
// words), so the 32 words land in 32 banks. Store: thread (a, b) reads the words a of tile rows 4b..4b+3
// (bank 4b + a + 17k: 8 b by 4 a per warp, 32 banks), transposes them in registers and writes tile columns
// 4a..4a+3 as words at out_t rows c0 + 4a + e, columns r0 + 4b: a warp writes 32 bytes into each of 4 rows.
// vec_in: cols % 4 == 0 and in 4-byte aligned; vec_out: rows % 4 == 0 and out_t 4-byte aligned. Otherwise
// that side goes byte by byte. Elements outside the matrix read as zero and are never stored.
__global__ void __launch_bounds__(kThreads)
    transpose_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t cols, int64_t col_tiles, bool vec_in,
                     bool vec_out, uint8_t* __restrict__ out_t) {
  __shared__ uint32_t s_tile[kTile][kPitch];  // (tile rows, words of 4 tile columns), padded
  const int64_t r0 = int64_t{blockIdx.x} / col_tiles * kTile, c0 = int64_t{blockIdx.x} % col_tiles * kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  const int w = lane % 16;
  const int64_t c = c0 + 4 * w;  // the first column of the thread's word
  auto tile_row = [&](int p) { return warp + 8 * (p % 2) + 16 * (lane / 16) + 32 * (p / 2); };  // pass p's row
  uint32_t words[4];             // all four loads issued before any shared store
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int64_t r = r0 + tile_row(p);
    words[p] = 0;
    if (r < rows) {
      if (vec_in) {
        if (c < cols) words[p] = *reinterpret_cast<const uint32_t*>(in + r * cols + c);  // all 4 or none inside
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < cols) words[p] |= uint32_t{in[r * cols + c + e]} << (8 * e);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < 4; ++p) s_tile[tile_row(p)][w] = words[p];
  __syncthreads();

  const int a = 4 * (warp % 4) + lane / 8, b = 8 * (warp / 4) + lane % 8;
  uint32_t block[4], col[4];  // (4, 4): tile rows 4b..4b+3 of tile columns 4a..4a+3, then transposed
#pragma unroll
  for (int k = 0; k < 4; ++k) block[k] = s_tile[4 * b + k][a];
  transpose4x4(block, col);
  const int64_t r = r0 + 4 * b;  // the first out_t column the thread writes
  if (r >= rows) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int64_t oc = c0 + 4 * a + e;  // the out_t row: a column of in
    if (oc >= cols) break;
    uint8_t* dst = out_t + oc * rows + r;
    if (vec_out) {
      *reinterpret_cast<uint32_t*>(dst) = col[e];  // rows % 4 == 0: all 4 inside
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (r + k < rows) dst[k] = static_cast<uint8_t>(col[e] >> (8 * k));
    }
  }
}

bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out_t, cudaStream_t stream) {
  FP8T_CHECK(rows > 0 && cols > 0 && in && out_t, "fp8_transpose: bad arguments rows={} cols={}", rows, cols);
  const int64_t col_tiles = ceil_div64(cols, kTile);
  const unsigned blocks = checked_grid(col_tiles * ceil_div64(rows, kTile), kMaxGridX, "fp8_transpose",
                                       "(rows, cols) in 64x64 tiles");
  const bool vec_in = cols % 4 == 0 && aligned4(in), vec_out = rows % 4 == 0 && aligned4(out_t);
  transpose_kernel<<<blocks, kThreads, 0, stream>>>(in, rows, cols, col_tiles, vec_in, vec_out, out_t);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
