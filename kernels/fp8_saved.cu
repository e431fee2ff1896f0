// FP8 saved activations with a scale per row: the one-pass save and the per-row dequantize. A block
// takes one row at a time and keeps it in registers from the load to the stores, so the save reads x
// once (2 bytes per element) and writes the codes (1) and, when asked, the bf16 round trip (2).
#include "kernels/fp8_saved.cuh"

#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cast_common.cuh"
#include "kernels/fp8_codec.cuh"
#include "kernels/gelu_math.cuh"

namespace fp8t::kernels {
namespace {

// ------------------------------------------------------------------------------------------------
// CUDA kernels

constexpr Fp8Format kE4m3 = Fp8Format::e4m3;
constexpr float kE4m3Max = 448.0f;
constexpr int kMaxThreads = 1024;

// kWidth consecutive bf16 values of a row, as raw bits: 8 (one 16-byte access) or 1 (the fallback for
// rows whose length is not a multiple of 8 and for misaligned pointers).
template <int kWidth>
struct Bf16Chunk {
  static_assert(kWidth == 8 || kWidth == 1, "a chunk is 16 bytes or one value");
  static constexpr int kWords = kWidth == 8 ? 4 : 1;
  uint32_t w[kWords];  // kWidth 8: values 2i (low half) and 2i + 1 (high half) in w[i]; kWidth 1: w[0]

  __device__ __forceinline__ static Bf16Chunk load(const bf16* p) {
    Bf16Chunk c;
    if constexpr (kWidth == 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      c.w[0] = v.x, c.w[1] = v.y, c.w[2] = v.z, c.w[3] = v.w;
    } else {
      c.w[0] = __bfloat16_as_ushort(*p);
    }
    return c;
  }
  __device__ __forceinline__ static Bf16Chunk zero() {
    Bf16Chunk c;
#pragma unroll
    for (uint32_t& x : c.w) x = 0;
    return c;
  }
  __device__ __forceinline__ float value(int j) const {
    const uint32_t bits = kWidth == 8 ? (w[j / 2] >> 16 * (j % 2)) & 0xFFFFu : w[0];
    return __uint_as_float(bits << 16);  // exact, as __bfloat162float
  }
  // max |value| as bf16 bits. For |x| the unsigned order of the bits is the float order, with every NaN
  // above +inf: a NaN in the row shows up as a NaN amax.
  __device__ __forceinline__ uint32_t abs_max_bits() const {
    if constexpr (kWidth == 8) {
      constexpr uint32_t kAbs = 0x7FFF7FFFu;
      const uint32_t m = __vmaxu2(__vmaxu2(w[0] & kAbs, w[1] & kAbs), __vmaxu2(w[2] & kAbs, w[3] & kAbs));
      return max(m & 0xFFFFu, m >> 16);
    } else {
      return w[0] & 0x7FFFu;
    }
  }
};

// Max (or with kSum, sum) over the block (blockDim.x a multiple of 32); every thread gets it. scratch holds 32
// words and is reused row after row.
template <bool kSum = false>
__device__ __forceinline__ uint32_t block_reduce(uint32_t v, uint32_t* scratch) {
  const auto warp_reduce = [](uint32_t x) {
    return kSum ? __reduce_add_sync(0xffffffffu, x) : __reduce_max_sync(0xffffffffu, x);
  };
  v = warp_reduce(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // every warp has read the previous row's values
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_reduce(lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0u);
}
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* scratch) { return block_reduce(v, scratch); }

// fp8_scale_from_amax(amax, 448, 0, 1.0f) of src/fp8/scaling.cpp, operation for operation (the host then
// divides by 2^0 = 1, which is exact).
__device__ __forceinline__ float row_scale(float amax) {
  float s = 1.0f;
  if (amax > 0.0f && isfinite(amax)) {
    const float t = __fdiv_rn(kE4m3Max, amax);
    if (isfinite(t) && t > 0.0f) s = t;
  }
  return s;
}

// The chunk's codes to codes[0, kWidth) and, if roundtrip is not null, their dequantized values to
// roundtrip[0, kWidth). The codes equal the cast kernels' (f32 product, then satfinite RNE, NaN -> 0x7F).
template <int kWidth>
__device__ __forceinline__ uint2 store_chunk(const Bf16Chunk<kWidth>& x, float scale, float scale_inv, uint8_t* codes,
                                             bf16* roundtrip) {
  if constexpr (kWidth == 8) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(x.value(j), scale);
    const uint2 w = to_fp8x8<kE4m3>(v);
    const uint32_t q[2] = {w.x, w.y};
    *reinterpret_cast<uint2*>(codes) = w;
    if (roundtrip) {
      Vec16<bf16> r;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        r.v[j] = dequant_bf16<kE4m3>(static_cast<uint8_t>(q[j / 4] >> 8 * (j % 4)), scale_inv);
      r.store(roundtrip);
    }
    return w;
  } else {
    const uint8_t q = to_fp8<kE4m3>(__fmul_rn(x.value(0), scale));
    *codes = q;
    if (roundtrip) *roundtrip = dequant_bf16<kE4m3>(q, scale_inv);
    return make_uint2(q, 0);
  }
}

// The GELU cast that fp8_save_rows_gelu_cast fuses into the save: its output and statistics.
struct GeluCast {
  uint8_t* out = nullptr;        // (rows, cols) codes in format F
  const float* scale = nullptr;  // the tensor scale (device)
  float* amax = nullptr;         // max |gelu value| as float bits (atomicMax), or null
  unsigned long long* saturated = nullptr;  // += count of |value * scale| > fmax, or null
};

// The chunk's GELU cast from its codes q (store_chunk's) through the row's table, gelu_of[c] =
// bf16_rn(gelu(bf16_rn(decode(c) * scale_inv))) (the saved_gelu prologue's value, kernels/fp8_cast.cuh): each code
// to_fp8<F>(value * scale), as the cast kernels write it.
template <Fp8Format F, int kWidth>
__device__ __forceinline__ void gelu_cast_chunk(uint2 q, const float* gelu_of, float scale, uint8_t* out,
                                                ThreadStats& st) {
  const auto value = [&](int j) { return gelu_of[((j < 4 ? q.x : q.y) >> 8 * (j % 4)) & 0xFFu]; };
  if constexpr (kWidth == 8) {
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = value(j);
    *reinterpret_cast<uint2*>(out) = convert8<F>(x, scale, st);
  } else {
    const float x = value(0), v = __fmul_rn(x, scale);
    st.add(x, v, fp8_max(F));
    *out = to_fp8<F>(v);
  }
}

// x (rows, cols) -> codes (rows, cols), scale_inv (rows), roundtrip (rows, cols) or null. Blocks take
// rows grid-stride; thread t takes the row's chunks t + k * blockDim.x. The first kRegChunks of them stay
// in registers from the load to the stores; chunks beyond (rows longer than kRegChunks * blockDim.x
// chunks) are loaded again for the stores. roundtrip may be x (not restrict): every element is read by
// the thread that writes it, and read before it is written.
template <int kWidth, int kRegChunks, bool kGelu = false, Fp8Format F = kE4m3>
__global__ void __launch_bounds__(kMaxThreads)
    save_rows_kernel(const bf16* x, int64_t rows, int64_t cols, uint8_t* __restrict__ codes,
                     float* __restrict__ scale_inv, bf16* roundtrip, GeluCast gc = {}) {
  __shared__ uint32_t s_max[kMaxThreads / 32];
  [[maybe_unused]] __shared__ float gelu_of[kGelu ? 256 : 1];  // kGelu: the row's GELU table (gelu_cast_chunk)
  using Chunk = Bf16Chunk<kWidth>;
  const int64_t chunks = cols / kWidth;  // kWidth divides cols (launcher)
  [[maybe_unused]] const float gelu_scale = kGelu ? *gc.scale : 0.0f;
  [[maybe_unused]] ThreadStats gst;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bf16* x_r = x + r * cols;
    Chunk reg[kRegChunks];  // (kRegChunks) this thread's chunks of the row
    uint32_t amax = 0;      // as bf16 bits
#pragma unroll
    for (int k = 0; k < kRegChunks; ++k) {
      const int i = threadIdx.x + k * blockDim.x;  // < kRegChunks * kMaxThreads
      reg[k] = i < chunks ? Chunk::load(x_r + int64_t{i} * kWidth) : Chunk::zero();
      amax = max(amax, reg[k].abs_max_bits());
    }
    for (int64_t i = threadIdx.x + int64_t{kRegChunks} * blockDim.x; i < chunks; i += blockDim.x)
      amax = max(amax, Chunk::load(x_r + i * kWidth).abs_max_bits());

    const float scale = row_scale(__uint_as_float(block_max(amax, s_max) << 16));
    const float sinv = __fdiv_rn(1.0f, scale);
    if (threadIdx.x == 0) scale_inv[r] = sinv;
    if constexpr (kGelu) {
      // The row's GELU of every code's round trip: 256 GELUs per row instead of one per element. Every thread
      // has finished the previous row's stores (block_max synchronized), so the table is free.
      for (int c = threadIdx.x; c < 256; c += blockDim.x)
        gelu_of[c] = __bfloat162float(
            __float2bfloat16_rn(gelu(__bfloat162float(dequant_bf16<kE4m3>(static_cast<uint8_t>(c), sinv)))));
      __syncthreads();
    }
    uint8_t* codes_r = codes + r * cols;
    bf16* rt_r = roundtrip ? roundtrip + r * cols : nullptr;
    // Chunk i's codes (and round trip), and with kGelu its GELU cast from those codes.
    const auto store = [&](const Chunk& c, int64_t i) {
      [[maybe_unused]] const uint2 q =
          store_chunk(c, scale, sinv, codes_r + i * kWidth, rt_r ? rt_r + i * kWidth : nullptr);
      if constexpr (kGelu) gelu_cast_chunk<F, kWidth>(q, gelu_of, gelu_scale, gc.out + r * cols + i * kWidth, gst);
    };
#pragma unroll
    for (int k = 0; k < kRegChunks; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < chunks) store(reg[k], i);
    }
    for (int64_t i = threadIdx.x + int64_t{kRegChunks} * blockDim.x; i < chunks; i += blockDim.x)
      store(Chunk::load(x_r + i * kWidth), i);
  }
  if constexpr (kGelu) {  // one atomic per block for each statistic
    const uint32_t a = block_max(gst.amax_bits, s_max), n = block_reduce<true>(gst.saturated, s_max);
    if (threadIdx.x == 0) {
      if (gc.amax && a) atomicMax(reinterpret_cast<unsigned*>(gc.amax), a);
      if (gc.saturated && n) atomicAdd(gc.saturated, static_cast<unsigned long long>(n));
    }
  }
}

// codes (rows, cols) -> out (rows, cols), rows grid-stride over the blocks. kWidth 8: 8-byte loads and
// 16-byte stores.
template <int kWidth>
__global__ void __launch_bounds__(kMaxThreads)
    dequantize_rows_kernel(const uint8_t* __restrict__ codes, int64_t rows, int64_t cols,
                           const float* __restrict__ scale_inv, bf16* __restrict__ out) {
  const int64_t chunks = cols / kWidth;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float s = scale_inv[r];
    const uint8_t* codes_r = codes + r * cols;
    bf16* out_r = out + r * cols;
    for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) {
      if constexpr (kWidth == 8) {
        const uint2 c = *reinterpret_cast<const uint2*>(codes_r + 8 * i);
        Vec16<bf16> v;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          v.v[b] = dequant_bf16<kE4m3>(static_cast<uint8_t>(c.x >> 8 * b), s);
          v.v[4 + b] = dequant_bf16<kE4m3>(static_cast<uint8_t>(c.y >> 8 * b), s);
        }
        v.store(out_r + 8 * i);
      } else {
        out_r[i] = dequant_bf16<kE4m3>(codes_r[i], s);
      }
    }
  }
}

// Chunks a thread keeps in registers: 32 values on the 16-byte path, 8 on the scalar one (16 would
// spill under the 64 registers that 1024 threads leave).
constexpr int kRegChunks8 = 4, kRegChunks1 = 8;

// Threads for a row of `chunks` chunks at `per_thread` each: a multiple of 32 in [32, kMaxThreads].
int threads_for(int64_t chunks, int per_thread) {
  const int64_t t = (chunks + per_thread - 1) / per_thread;
  return static_cast<int>(std::clamp<int64_t>((t + 31) / 32 * 32, 32, kMaxThreads));
}

// One block per row, capped (the kernels loop over the rows past the cap).
int blocks_for(int64_t rows) { return static_cast<int>(std::min<int64_t>(rows, int64_t{1} << 20)); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void fp8_save_rows(const __nv_bfloat16* x, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv,
                   __nv_bfloat16* roundtrip, cudaStream_t stream) {
  FP8T_CHECK(rows > 0 && cols > 0, "fp8_save_rows: bad sizes rows={} cols={}", rows, cols);
  FP8T_CHECK(x && codes && scale_inv, "fp8_save_rows: null input, codes or scale_inv");
  const auto* x_end = x + rows * cols;
  FP8T_CHECK(!roundtrip || roundtrip == x || roundtrip + rows * cols <= x || roundtrip >= x_end,
             "fp8_save_rows: the round trip must be x itself or not overlap it");
  const bool vec = cols % 8 == 0 && aligned16(x) && aligned8(codes) && (!roundtrip || aligned16(roundtrip));
  const int blocks = blocks_for(rows);
  if (vec)
    save_rows_kernel<8, kRegChunks8><<<blocks, threads_for(cols / 8, kRegChunks8), 0, stream>>>(
        x, rows, cols, codes, scale_inv, roundtrip);
  else
    save_rows_kernel<1, kRegChunks1><<<blocks, threads_for(cols, kRegChunks1), 0, stream>>>(
        x, rows, cols, codes, scale_inv, roundtrip);
  CUDA_CHECK_LAUNCH();
}

void fp8_save_rows_gelu_cast(const __nv_bfloat16* x, int64_t rows, int64_t cols, uint8_t* codes, float* scale_inv,
                             uint8_t* out, Fp8Format format, const float* scale, Fp8CastOutputs stats,
                             cudaStream_t stream) {
  FP8T_CHECK(rows > 0 && cols > 0, "fp8_save_rows_gelu_cast: bad sizes rows={} cols={}", rows, cols);
  FP8T_CHECK(x && codes && scale_inv && out && scale,
             "fp8_save_rows_gelu_cast: null input, codes, scale_inv, output or scale");
  FP8T_CHECK(!stats.colsum, "fp8_save_rows_gelu_cast: the GELU cast takes no column sums");
  const GeluCast gc{out, scale, stats.amax, stats.saturated};
  const bool vec = cols % 8 == 0 && aligned16(x) && aligned8(codes) && aligned8(out);
  const int blocks = blocks_for(rows);
  const auto launch = [&]<Fp8Format F>() {
    if (vec)
      save_rows_kernel<8, kRegChunks8, true, F><<<blocks, threads_for(cols / 8, kRegChunks8), 0, stream>>>(
          x, rows, cols, codes, scale_inv, nullptr, gc);
    else
      save_rows_kernel<1, kRegChunks1, true, F><<<blocks, threads_for(cols, kRegChunks1), 0, stream>>>(
          x, rows, cols, codes, scale_inv, nullptr, gc);
  };
  if (format == Fp8Format::e4m3) launch.operator()<Fp8Format::e4m3>();
  else launch.operator()<Fp8Format::e5m2>();
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize_rows(const uint8_t* codes, int64_t rows, int64_t cols, const float* scale_inv,
                         __nv_bfloat16* out, cudaStream_t stream) {
  FP8T_CHECK(rows > 0 && cols > 0, "fp8_dequantize_rows: bad sizes rows={} cols={}", rows, cols);
  FP8T_CHECK(codes && scale_inv && out, "fp8_dequantize_rows: null codes, scale_inv or output");
  const bool vec = cols % 8 == 0 && aligned8(codes) && aligned16(out);
  const int blocks = blocks_for(rows);
  if (vec)
    dequantize_rows_kernel<8><<<blocks, threads_for(cols / 8, 4), 0, stream>>>(codes, rows, cols, scale_inv, out);
  else
    dequantize_rows_kernel<1><<<blocks, threads_for(cols, 4), 0, stream>>>(codes, rows, cols, scale_inv, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
