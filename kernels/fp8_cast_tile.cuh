// The tile machinery the tiled FP8 casts share (kernels/fp8_cast.cu, kernels/fp8_cast_pair.cu): the tile shape,
// the saved prologues' per-row codes, and the transposed codes staged through shared memory.
#pragma once
#include "kernels/fp8_cast_common.cuh"

namespace fp8t::kernels {
namespace {

// Cast + transpose. A block converts a (kTileRows, kTileCols) tile of in (rows, cols); thread t takes
// the (4, 8) block at tile rows 4 * (t / 8) + j, tile cols 8 * (t % 8) + e, so a warp's 16-byte loads
// cover four 128-byte row segments. The row-major codes go straight to out (8-byte stores); the
// thread's 8 columns of 4 codes are transposed in registers into 8 words and staged in shared memory
// as 16-byte chunks (16 rows of one column), which become 16-byte stores to out_t, a warp writing
// four full 128-byte row segments. With stats.colsum, the thread's 8 column sums over its 4 rows are
// reduced across the 4 threads of a warp that share its columns (shuffles), then across the 8 warps
// (shared memory), and the first 64 threads add the tile's column sums with one atomic each.
constexpr int kTileRows = 128, kTileCols = 64;
constexpr int kChunks = kTileRows / 16;  // 16-byte chunks per tile column
static_assert(kTileRows == 4 * (kThreads / (kTileCols / 8)) && kChunks == 8, "thread blocks must tile the tile");

// Slot of chunk q of tile column c. XOR-swizzling q with c / 8 keeps both shared accesses free of bank
// conflicts: a warp's word stores (thread t % 8 = c / 8 writes word (t / 8) % 4 of chunk w, w the warp)
// land in 32 distinct banks, and 8 threads reading the 8 chunks of one column read 128 distinct bytes.
__device__ __forceinline__ int chunk_slot(int c, int q) { return c * kChunks + (q ^ ((c / 8) % kChunks)); }

// The saved prologues' pre over a thread's (4, 8) block on the 16-byte path: row j's 8 E4M3 codes of ops.pre_codes
// (one 8-byte load) and its ops.row_scale_inv, zero outside the matrix (pre = +0 there).
struct SavedPre {
  uint2 codes[4];      // (4, 8): row j's columns 0-3 in .x, 4-7 in .y
  float scale_inv[4];  // (4): row j's ops.row_scale_inv
  // Issues row j's loads: row r, columns c .. c + 7, all inside or none.
  __device__ __forceinline__ void load(int j, bool inside, int64_t r, int64_t c, int64_t cols,
                                       const Fp8CastOperands& ops) {
    codes[j] = inside ? *reinterpret_cast<const uint2*>(ops.pre_codes + r * cols + c) : make_uint2(0, 0);
    scale_inv[j] = inside ? ops.row_scale_inv[r] : 0.0f;
  }
  // pre at row j, columns e = 0..7, as the unfused kernels read it (dequant_bf16, two codes per conversion).
  __device__ __forceinline__ void values(int j, float (&p)[8]) const {
    uint32_t w[4];
    dequant_bf16x8<Fp8Format::e4m3>(codes[j], scale_inv[j], w);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p[2 * k] = __uint_as_float(w[k] << 16);
      p[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
};

// Element e (0..7) of 8 packed bf16 values as a float (exact): the low (even e) or high half of word e / 2.
__device__ __forceinline__ float bf16_at(const uint4& q, int e) {
  const uint32_t w = e < 2 ? q.x : e < 4 ? q.y : e < 6 ? q.z : q.w;
  return __uint_as_float(e % 2 ? w & 0xFFFF0000u : w << 16);
}

// The saved GELU casts' loads, all issued before any use: a thread's rows r0 + 4 ty + j (j < 4) of 8 gradients at
// column c (in, bf16) and pre's codes there (SavedPre); zero outside the tensor (cols % 8 == 0: all 8 or none).
__device__ __forceinline__ void load_dy_and_pre(uint4 (&dq)[4], SavedPre& pre, const bf16* in, int64_t r0, int ty,
                                                int64_t c, int64_t rows, int64_t cols, const Fp8CastOperands& ops) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t r = r0 + 4 * ty + j;
    const bool inside = r < rows && c < cols;
    dq[j] = inside ? *reinterpret_cast<const uint4*>(in + r * cols + c) : make_uint4(0, 0, 0, 0);
    pre.load(j, inside, r, c, cols, ops);
  }
}

// A thread's (4, 8) block of one tile's input on the 16-byte path, every load issued by load() before any use, so a
// block's next tile is in flight while it converts this one: row j's 8 elements of in (one 16-byte word for bf16, two
// for f32) and what the prologue reads beside them (dgelu: pre's; saved_gelu and saved_dgelu: pre's codes and row
// scales, saved_gelu without in; layernorm: the rows' statistics and the columns' weight and bias). Outside the
// matrix, or with any = false, it reads nothing and holds zeros.
template <typename T, Fp8CastInput kIn>
struct BlockLoads {
  static constexpr int kWords = static_cast<int>(sizeof(T)) / 2;  // 16-byte words per row of 8 elements
  static constexpr bool kSaved = kIn == Fp8CastInput::saved_gelu || kIn == Fp8CastInput::saved_dgelu;
  uint4 in[4][kWords];
  uint4 pre[4];       // dgelu: pre's row j
  SavedPre saved;     // saved_gelu, saved_dgelu
  float mean[4], rstd[4];  // layernorm: row j's statistics
  uint4 w, b;         // layernorm: the columns' weight and bias (bf16)

  __device__ __forceinline__ void load(bool any, const T* src, int64_t r0, int ty, int64_t c, int64_t rows,
                                       int64_t cols, const Fp8CastOperands& ops) {
    constexpr uint4 zero = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + 4 * ty + j;
      const bool inside = any && r < rows && c < cols;  // cols % 8 == 0: all 8 or none inside
      if constexpr (kIn != Fp8CastInput::saved_gelu) {
#pragma unroll
        for (int k = 0; k < kWords; ++k)
          in[j][k] = inside ? reinterpret_cast<const uint4*>(src + r * cols + c)[k] : zero;
      }
      if constexpr (kIn == Fp8CastInput::dgelu)
        pre[j] = inside ? *reinterpret_cast<const uint4*>(ops.pre + r * cols + c) : zero;
      if constexpr (kSaved) saved.load(j, inside, r, c, cols, ops);
      if constexpr (kIn == Fp8CastInput::layernorm) {
        mean[j] = inside ? ops.mean[r] : 0.0f;
        rstd[j] = inside ? ops.rstd[r] : 0.0f;
      }
    }
    if constexpr (kIn == Fp8CastInput::layernorm) {
      const bool inside = any && c < cols;
      w = inside ? *reinterpret_cast<const uint4*>(ops.w + c) : zero;
      b = inside ? *reinterpret_cast<const uint4*>(ops.b + c) : zero;
    }
  }

  // Element e of row j as read (exact).
  __device__ __forceinline__ float at(int j, int e) const {
    if constexpr (kWords == 1) {
      return bf16_at(in[j][0], e);
    } else {
      const uint4& q = in[j][e / 4];
      const int k = e % 4;
      return __uint_as_float(k == 0 ? q.x : k == 1 ? q.y : k == 2 ? q.z : q.w);
    }
  }

  // Row j's 8 values as the cast reads them (cast_input<kIn>'s, bit for bit; zero outside the matrix), r the row.
  __device__ __forceinline__ void values(int j, int64_t r, int64_t c, int64_t rows, int64_t cols,
                                         float (&x)[8]) const {
    if constexpr (kIn == Fp8CastInput::dgelu) {
#pragma unroll
      for (int e = 0; e < 8; e += 2) {  // the bf16 roundings in pairs
        const float2 v = dgelu_values_bf16(at(j, e), bf16_at(pre[j], e), at(j, e + 1), bf16_at(pre[j], e + 1));
        x[e] = v.x, x[e + 1] = v.y;
      }
    } else if constexpr (kSaved) {
      float p[8];
      saved.values(j, p);
#pragma unroll
      for (int e = 0; e < 8; e += 2) {  // the bf16 roundings in pairs
        const float2 v = kIn == Fp8CastInput::saved_dgelu
                             ? dgelu_values_bf16(at(j, e), p[e], at(j, e + 1), p[e + 1])
                             : bf16_round2(gelu(p[e]), gelu(p[e + 1]));
        x[e] = v.x, x[e + 1] = v.y;
      }
    } else if constexpr (kIn == Fp8CastInput::gelu) {
#pragma unroll
      for (int e = 0; e < 8; e += 2) {  // cast_input<gelu>, the bf16 roundings in pairs
        const float2 v = bf16_round2(gelu(at(j, e)), gelu(at(j, e + 1)));
        x[e] = v.x, x[e + 1] = v.y;
      }
    } else if constexpr (kIn == Fp8CastInput::layernorm) {
      const bool inside = r < rows && c < cols;  // the padding stays zero (LayerNorm would make it b)
#pragma unroll
      for (int e = 0; e < 8; e += 2) {  // layernorm_value_bf16, the bf16 roundings in pairs
        const float2 v = bf16_round2(layernorm_value(at(j, e), mean[j], rstd[j], bf16_at(w, e), bf16_at(b, e)),
                                     layernorm_value(at(j, e + 1), mean[j], rstd[j], bf16_at(w, e + 1),
                                                     bf16_at(b, e + 1)));
        x[e] = inside ? v.x : 0.0f, x[e + 1] = inside ? v.y : 0.0f;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = at(j, e);
    }
  }
};

// Stages a thread's (4, 8) block of codes transposed in s_t: column e's word holds rows 4 * ty + 0..3, low byte
// first (a 4x4 byte transpose per half). The tile's chunks are then stored by store_transposed after a barrier.
__device__ __forceinline__ void stage_transposed(uint4* s_t, const uint2 (&codes)[4], int tx, int ty) {
  uint32_t* s_words = reinterpret_cast<uint32_t*>(s_t);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a = h ? codes[0].y : codes[0].x, b = h ? codes[1].y : codes[1].x;
    const uint32_t cc = h ? codes[2].y : codes[2].x, d = h ? codes[3].y : codes[3].x;
    const uint32_t ab01 = __byte_perm(a, b, 0x5140), ab23 = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1, a2 b2 a3 b3
    const uint32_t cd01 = __byte_perm(cc, d, 0x5140), cd23 = __byte_perm(cc, d, 0x7362);
    const uint32_t col[4] = {__byte_perm(ab01, cd01, 0x5410), __byte_perm(ab01, cd01, 0x7632),
                             __byte_perm(ab23, cd23, 0x5410), __byte_perm(ab23, cd23, 0x7632)};
#pragma unroll
    for (int e = 0; e < 4; ++e) s_words[chunk_slot(8 * tx + 4 * h + e, ty / 4) * 4 + ty % 4] = col[e];
  }
}

// The staged tile (rows r0.., columns c0..) into out_t (cols, rows): 16-byte stores where vec_t and the chunk is
// whole, else byte by byte.
__device__ __forceinline__ void store_transposed(const uint4* s_t, uint8_t* out_t, int64_t r0, int64_t c0,
                                                 int64_t rows, int64_t cols, bool vec_t) {
#pragma unroll
  for (int p = 0; p < kTileCols * kChunks / kThreads; ++p) {
    const int idx = p * kThreads + threadIdx.x, tc = idx / kChunks, q = idx % kChunks;
    const int64_t oc = c0 + tc, orow = r0 + 16 * q;  // out_t row (a column of in) and its first column
    if (oc < cols && orow < rows) {
      const uint4 chunk = s_t[chunk_slot(tc, q)];
      uint8_t* dst = out_t + oc * rows + orow;
      if (vec_t && orow + 16 <= rows) {
        *reinterpret_cast<uint4*>(dst) = chunk;
      } else {
        uint8_t bytes[16];
        memcpy(bytes, &chunk, 16);
#pragma unroll
        for (int b = 0; b < 16; ++b)
          if (orow + b < rows) dst[b] = bytes[b];
      }
    }
  }
}

// A tile's column sums (the casts with stats.colsum), step 1, before the block's barrier: lanes tx, tx + 8, tx + 16
// and tx + 24 of a warp hold 16 consecutive tile rows of the same 8 columns; lane tx (< 8) ends with their sum and
// leaves it in s_colsum[warp] for step 2.
__device__ __forceinline__ void stage_colsum(float (*s_colsum)[kTileCols], float (&col_sum)[8], int tx) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    col_sum[e] += __shfl_xor_sync(0xffffffffu, col_sum[e], 8);
    col_sum[e] += __shfl_xor_sync(0xffffffffu, col_sum[e], 16);
  }
  if (threadIdx.x % 32 < 8) {
#pragma unroll
    for (int e = 0; e < 8; ++e) s_colsum[threadIdx.x / 32][8 * tx + e] = col_sum[e];
  }
}

// Step 2, after the barrier: thread t < kTileCols adds tile column t's sum over the warps into colsum, one atomic.
__device__ __forceinline__ void add_colsum(const float (*s_colsum)[kTileCols], float* colsum, int64_t c0,
                                           int64_t cols) {
  if (threadIdx.x < kTileCols && c0 + threadIdx.x < cols) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) sum += s_colsum[w][threadIdx.x];
    atomicAdd(colsum + c0 + threadIdx.x, sum);
  }
}

}  // namespace
}  // namespace fp8t::kernels
