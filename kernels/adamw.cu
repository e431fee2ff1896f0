// AdamW: one fused pass reading params, grads, m, v and writing params, m, v (+ bf16 copy). A warp owns
// one kMomentBlock block at a time, so the fp8 first moment's new block amax is a warp reduction and the
// re-quantized codes are written in the same pass.
#include <type_traits>

#include "kernels/adamw.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/fp8_codec.cuh"

namespace fp8t::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kPerLane = kMomentBlock / kWarp;  // lane l holds elements l, l + 32, l + 64, l + 96 of a block
static_assert(kMomentBlock % kWarp == 0);

// ------------------------------------------------------------------------------------------------
// CUDA kernels

template <class G>
__device__ __forceinline__ float grad_at(const G* g, int64_t i) {
  if constexpr (std::is_same_v<G, float>)
    return g[i];
  else
    return __bfloat162float(g[i]);
}

// The first segment whose end lies past i (segments sorted, covering [0, n)).
__device__ __forceinline__ int segment_of(const AdamWSegment* segs, int count, int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (segs[mid].end > i)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// Element i's moments in f32 as the state holds them (fp8: the first moment's E4M3 code times its block's scale).
template <StateDtype S>
__device__ __forceinline__ void moments_at(const AdamWBuffers& b, int64_t i, float scale, float& m, float& v) {
  if constexpr (S == StateDtype::fp32) {
    m = static_cast<const float*>(b.m)[i];
    v = static_cast<const float*>(b.v)[i];
  } else {
    m = S == StateDtype::bf16 ? bf16_value(static_cast<const uint16_t*>(b.m)[i])
                              : f32_mul(from_fp8<Fp8Format::e4m3>(static_cast<const uint8_t*>(b.m)[i]), scale);
    v = bf16_value(static_cast<const uint16_t*>(b.v)[i]);
  }
}

// With an fp8 first moment: block blk's new scale from the warp's amax of the updated moments (lane 0 stores it;
// the whole warp must be here), returned as the inverse the codes are written with. 0 for the other dtypes.
template <StateDtype S>
__device__ __forceinline__ float new_block_inv_scale(const AdamWBuffers& b, int64_t blk, float amax, int lane) {
  if constexpr (S != StateDtype::fp8) return 0.0f;
  const float new_scale = moment_block_scale(warp_max(amax)), new_inv = moment_inv_scale(new_scale);
  if (lane == 0) b.m_scale[blk] = new_scale;
  return new_inv;
}

template <class G, StateDtype S>
__global__ void adamw_kernel(AdamWBuffers b, AdamWHyper h) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / kWarp);
  const int64_t blocks = (b.n + kMomentBlock - 1) / kMomentBlock;
  const G* grads = static_cast<const G*>(b.grads);
  for (int64_t blk = int64_t{blockIdx.x} * (blockDim.x / kWarp) + threadIdx.x / kWarp; blk < blocks; blk += warps) {
    const int64_t first = blk * kMomentBlock;
    const float scale = S == StateDtype::fp8 ? b.m_scale[blk] : 0.0f;  // read by every lane before lane 0 writes
    int s = segment_of(b.segments, b.num_segments, first);
    float rm[kPerLane], rv[kPerLane];  // updated moments, in f32
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = first + j * kWarp + lane;
      rm[j] = rv[j] = 0.0f;
      if (i >= b.n) continue;
      while (b.segments[s].end <= i) ++s;
      const AdamWSegment& seg = b.segments[s];
      float m, v;
      moments_at<S>(b, i, scale, m, v);
      const AdamWElement e = adamw_element(b.params[i], grad_at(grads, i), m, v, seg.weight_decay, h);
      b.params[i] = e.param;
      if (b.params_bf16 && seg.compute >= 0)
        reinterpret_cast<bf16*>(b.params_bf16)[seg.compute + (i - seg.begin)] = __float2bfloat16_rn(e.param);
      rm[j] = e.m;
      rv[j] = e.v;
      amax = fmaxf(amax, fabsf(e.m));
    }
    const float new_inv = new_block_inv_scale<S>(b, blk, amax, lane);  // blk is warp-uniform
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = first + j * kWarp + lane;
      if (i >= b.n) continue;
      if constexpr (S == StateDtype::fp32) {
        static_cast<float*>(b.m)[i] = rm[j];
        static_cast<float*>(b.v)[i] = rv[j];
      } else {
        const uint32_t bits = rounding_bits(h.rounding_key, b.index_base + i);
        if constexpr (S == StateDtype::bf16)
          static_cast<uint16_t*>(b.m)[i] = bf16_round_stochastic(rm[j], bits);
        else
          static_cast<uint8_t*>(b.m)[i] = to_fp8<Fp8Format::e4m3>(moment_scaled(rm[j], new_inv));
        static_cast<uint16_t*>(b.v)[i] = bf16_round_stochastic(rv[j], bits >> 16);
      }
    }
  }
}

__device__ __forceinline__ void store4(uint16_t* p, const uint16_t (&h)[4]) {
  *reinterpret_cast<uint2*>(p) = make_uint2(h[0] | uint32_t{h[1]} << 16, h[2] | uint32_t{h[3]} << 16);
}

// One lane's four elements of a block from every buffer (adamw_vec4_kernel's 16-, 8- and 4-byte accesses), kept as
// loaded until decode(), so that the next block's loads are in flight while this one computes.
template <class G, StateDtype S>
struct Lane4Loads {
  float4 p;
  uint4 g, m, v;  // raw bits: four f32, or bf16 pairs in x and y, or (m, fp8) four codes in x

  __device__ __forceinline__ void load(const AdamWBuffers& b, const G* grads, int64_t i0) {
    p = *reinterpret_cast<const float4*>(b.params + i0);
    if constexpr (std::is_same_v<G, float>) {
      g = *reinterpret_cast<const uint4*>(grads + i0);
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(grads + i0);
      g = make_uint4(x.x, x.y, 0, 0);
    }
    if constexpr (S == StateDtype::fp32) {
      m = *reinterpret_cast<const uint4*>(static_cast<const float*>(b.m) + i0);
      v = *reinterpret_cast<const uint4*>(static_cast<const float*>(b.v) + i0);
    } else {
      if constexpr (S == StateDtype::bf16) {
        const uint2 x = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(b.m) + i0);
        m = make_uint4(x.x, x.y, 0, 0);
      } else {
        m = make_uint4(*reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(b.m) + i0), 0, 0, 0);
      }
      const uint2 y = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(b.v) + i0);
      v = make_uint4(y.x, y.y, 0, 0);
    }
  }
  // Widened to f32 (scale: the block's, fp8 only): the m code times scale, bf16 values exactly.
  __device__ __forceinline__ void decode(float scale, float (&po)[4], float (&go)[4], float (&mo)[4],
                                         float (&vo)[4]) const {
    po[0] = p.x, po[1] = p.y, po[2] = p.z, po[3] = p.w;
    const auto f32x4 = [](const uint4& w, float (&o)[4]) {
      o[0] = __uint_as_float(w.x), o[1] = __uint_as_float(w.y), o[2] = __uint_as_float(w.z), o[3] = __uint_as_float(w.w);
    };
    const auto bf16x4 = [](const uint4& w, float (&o)[4]) {
      o[0] = bf16_value(w.x & 0xFFFFu), o[1] = bf16_value(w.x >> 16), o[2] = bf16_value(w.y & 0xFFFFu),
      o[3] = bf16_value(w.y >> 16);
    };
    if constexpr (std::is_same_v<G, float>) f32x4(g, go);
    else bf16x4(g, go);
    if constexpr (S == StateDtype::fp32) {
      f32x4(m, mo);
      f32x4(v, vo);
    } else {
      if constexpr (S == StateDtype::bf16) {
        bf16x4(m, mo);
      } else {
        // Two codes per conversion (lanes convert independently: each value is from_fp8's).
#pragma unroll
        for (int t = 0; t < 4; t += 2) {
          const auto pair = static_cast<__nv_fp8x2_storage_t>(m.x >> (8 * t));
          const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, kFp8Interp<Fp8Format::e4m3>)));
          mo[t] = f32_mul(f.x, scale);
          mo[t + 1] = f32_mul(f.y, scale);
        }
      }
      bf16x4(v, vo);
    }
  }
};

// The same update, bit for bit, with lane l holding elements 4l .. 4l + 3 of its warp's block: one 16-, 8- or
// 4-byte access per buffer where adamw_kernel makes four of one element each (needs vector4_aligned buffers).
// A warp takes runs of kRun consecutive blocks, the runs of all warps interleaved over the range (run r of warp w is
// the range's run r * warps + w), so its blocks rise and it searches the segments only where it crosses one (a
// grid-stride loop over single blocks jumped a segment or more per block; its binary search, dependent loads and
// per-element reloads of the segment were ~15% of the kernel's instructions in Nsight Compute's per-instruction
// counts, docs/perf-notes.md).
// The fp32 state keeps runs of one block (the grid-stride order): its kernel moves 30 bytes per element and is
// bound by memory, and runs would take it past 64 registers (3 blocks per SM instead of 4). The next block's loads
// (Lane4Loads) and scale are issued before this block's update, so a warp has two blocks' reads in flight, not one.
template <StateDtype S>
constexpr int64_t kRun = S == StateDtype::fp32 ? 1 : 8;
template <class G, StateDtype S>
__global__ void adamw_vec4_kernel(AdamWBuffers b, AdamWHyper h) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / kWarp);
  const int64_t blocks = (b.n + kMomentBlock - 1) / kMomentBlock;
  const G* grads = static_cast<const G*>(b.grads);
  const int64_t warp_id = int64_t{blockIdx.x} * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  // The warp's k-th block (increasing in k).
  constexpr int64_t kR = kRun<S>;
  const auto block_at = [&](int64_t k) { return ((k / kR) * warps + warp_id) * kR + k % kR; };
  int s = 0;
  int64_t seg_end = b.segments[0].end;  // segment s's end, in a register
  // The warp's next block: its lane's loads when all four elements are inside (`full`), and its scale.
  Lane4Loads<G, S> next;
  bool next_full = false;
  float next_scale = 0.0f;
  const auto prefetch = [&](int64_t blk) {
    const int64_t i0 = blk * kMomentBlock + 4 * lane;
    next_full = blk < blocks && i0 + 4 <= b.n;
    if (next_full) next.load(b, grads, i0);
    // Read by every lane a step before lane 0 rewrites it (each block has one warp).
    next_scale = S == StateDtype::fp8 && blk < blocks ? b.m_scale[blk] : 0.0f;
  };
  prefetch(block_at(0));
  for (int64_t k = 0, blk = block_at(0); blk < blocks; blk = block_at(++k)) {
    const int64_t i0 = blk * kMomentBlock + 4 * lane;
    const Lane4Loads<G, S> cur = next;
    const bool full = next_full;
    const float scale = next_scale;
    prefetch(block_at(k + 1));
    float p[4] = {}, g[4] = {}, m[4] = {}, v[4] = {};
    if (full) {
      cur.decode(scale, p, g, m, v);
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int64_t i = i0 + t;
        if (i >= b.n) break;
        p[t] = b.params[i];
        g[t] = grad_at(grads, i);
        moments_at<S>(b, i, scale, m[t], v[t]);
      }
    }
    if (i0 < b.n && seg_end <= i0) {
      s = segment_of(b.segments + s, b.num_segments - s, i0) + s;
      seg_end = b.segments[s].end;
    }
    // All four elements go to one aligned run of the compute copy: stored as one vector below. A copy, so that the
    // stores into the compute copy do not make the compiler read the segment again.
    const AdamWSegment seg0 = b.segments[s];
    const bool one_segment = full && i0 + 4 <= seg0.end;
    const bool whole = one_segment && (seg0.compute + (i0 - seg0.begin)) % 4 == 0;
    float amax = 0.0f;
    uint16_t copy[4] = {};
    auto update = [&](int t, const AdamWSegment& sg) {
      const AdamWElement e = adamw_element(p[t], g[t], m[t], v[t], sg.weight_decay, h);
      p[t] = e.param;
      m[t] = e.m;
      v[t] = e.v;
      amax = fmaxf(amax, fabsf(e.m));
      copy[t] = __bfloat16_as_ushort(__float2bfloat16_rn(e.param));
      if (b.params_bf16 && sg.compute >= 0 && !whole) b.params_bf16[sg.compute + (i0 + t - sg.begin)] = copy[t];
    };
    if (one_segment) {  // nearly every lane: no bounds or segment checks per element (the kernel is issue-bound)
#pragma unroll
      for (int t = 0; t < 4; ++t) update(t, seg0);
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        if (i0 + t >= b.n) break;
        while (b.segments[s].end <= i0 + t) ++s;
        update(t, b.segments[s]);
      }
      seg_end = b.segments[s].end;
    }
    const float new_inv = new_block_inv_scale<S>(b, blk, amax, lane);  // blk is warp-uniform
    uint16_t m16[4] = {}, v16[4] = {};
    uint32_t m8 = 0;
    if constexpr (S != StateDtype::fp32) {
      // The four indices share their high word unless they cross 2^32: then each is hashed whole (one test per lane,
      // so the common case hashes straight through).
      const int64_t idx0 = b.index_base + i0;
      uint32_t bits4[4];
      if ((idx0 ^ (idx0 + 3)) >> 32 == 0) {
        const uint32_t high = rounding_high(h.rounding_key, idx0);
#pragma unroll
        for (int t = 0; t < 4; ++t) bits4[t] = rounding_bits_low(high, idx0 + t);
      } else {
#pragma unroll
        for (int t = 0; t < 4; ++t) bits4[t] = rounding_bits(h.rounding_key, idx0 + t);
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const uint32_t bits = bits4[t];
        if constexpr (S == StateDtype::bf16)
          m16[t] = bf16_round_stochastic(m[t], bits);
        else
          m8 |= uint32_t{to_fp8<Fp8Format::e4m3>(moment_scaled(m[t], new_inv))} << (8 * t);
        v16[t] = bf16_round_stochastic(v[t], bits >> 16);
      }
    }
    if (full) {
      *reinterpret_cast<float4*>(b.params + i0) = make_float4(p[0], p[1], p[2], p[3]);
      if constexpr (S == StateDtype::fp32) {
        *reinterpret_cast<float4*>(static_cast<float*>(b.m) + i0) = make_float4(m[0], m[1], m[2], m[3]);
        *reinterpret_cast<float4*>(static_cast<float*>(b.v) + i0) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        if constexpr (S == StateDtype::bf16)
          store4(static_cast<uint16_t*>(b.m) + i0, m16);
        else
          *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(b.m) + i0) = m8;
        store4(static_cast<uint16_t*>(b.v) + i0, v16);
      }
      if (whole && b.params_bf16 && seg0.compute >= 0) store4(b.params_bf16 + seg0.compute + (i0 - seg0.begin), copy);
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int64_t i = i0 + t;
        if (i >= b.n) break;
        b.params[i] = p[t];
        if constexpr (S == StateDtype::fp32) {
          static_cast<float*>(b.m)[i] = m[t];
          static_cast<float*>(b.v)[i] = v[t];
        } else {
          if constexpr (S == StateDtype::bf16)
            static_cast<uint16_t*>(b.m)[i] = m16[t];
          else
            static_cast<uint8_t*>(b.m)[i] = static_cast<uint8_t>(m8 >> (8 * t));
          static_cast<uint16_t*>(b.v)[i] = v16[t];
        }
      }
    }
  }
}

// Whether every buffer adamw_vec4_kernel reads or writes four elements at a time is aligned to four elements.
bool vector4_aligned(const AdamWBuffers& b) {
  auto aligned = [](const void* p, size_t element) { return reinterpret_cast<uintptr_t>(p) % (4 * element) == 0; };
  const size_t state = b.state_dtype == StateDtype::fp32 ? 4 : 2;
  return aligned(b.params, 4) && aligned(b.grads, dtype_size(b.grad_dtype)) &&
         aligned(b.m, b.state_dtype == StateDtype::fp8 ? 1 : state) && aligned(b.v, state) &&
         aligned(b.params_bf16, 2);
}

template <class G, StateDtype S>
void launch_state(const AdamWBuffers& b, const AdamWHyper& h, int grid, int threads, cudaStream_t stream) {
  if (vector4_aligned(b))
    adamw_vec4_kernel<G, S><<<grid, threads, 0, stream>>>(b, h);
  else
    adamw_kernel<G, S><<<grid, threads, 0, stream>>>(b, h);
}

template <class G>
void launch(const AdamWBuffers& b, const AdamWHyper& h, int grid, int threads, cudaStream_t stream) {
  switch (b.state_dtype) {
    case StateDtype::fp32: launch_state<G, StateDtype::fp32>(b, h, grid, threads, stream); break;
    case StateDtype::bf16: launch_state<G, StateDtype::bf16>(b, h, grid, threads, stream); break;
    case StateDtype::fp8: launch_state<G, StateDtype::fp8>(b, h, grid, threads, stream); break;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// kernel launchers

void adamw_update(const AdamWBuffers& b, const AdamWHyper& h, cudaStream_t stream) {
  FP8T_CHECK(b.grad_dtype == DType::f32 || b.grad_dtype == DType::bf16,
             "adamw_update: gradients must be f32 or bf16, not {}", dtype_name(b.grad_dtype));
  FP8T_CHECK(b.n >= 0 && h.bias_corr1 > 0.0f && h.bias_corr2 > 0.0f,
             "adamw_update: n {} and bias corrections ({}, {}) must be >= 0 and > 0 (step counts from 1)", b.n,
             h.bias_corr1, h.bias_corr2);
  if (b.n == 0) return;
  FP8T_CHECK(b.segments && b.num_segments > 0, "adamw_update: {} elements need segments", b.n);
  FP8T_CHECK(b.state_dtype != StateDtype::fp8 || b.m_scale, "adamw_update: fp8 moments need block scales");
  constexpr int kThreads = 256;
  const int64_t warps_needed = (b.n + kMomentBlock - 1) / kMomentBlock;
  const int grid = static_cast<int>(std::min<int64_t>((warps_needed + kThreads / kWarp - 1) / (kThreads / kWarp),
                                                      132 * 16));
  if (b.grad_dtype == DType::f32)
    launch<float>(b, h, grid, kThreads, stream);
  else
    launch<bf16>(b, h, grid, kThreads, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8t::kernels
