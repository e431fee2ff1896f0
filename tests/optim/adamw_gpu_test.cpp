// AdamW update against the CPU reference (bit for bit, every state and gradient dtype) and the
// global-norm sum of squares against host loops.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "util/gpu_test_util.h"
#include "kernels/adamw.cuh"
#include "kernels/global_norm.cuh"
#include "kernels/stream.cuh"
#include "ops/cpu/adamw.h"

using namespace fp8t;
using namespace fp8t::test;

namespace {

const char* name_of(StateDtype s) { return s == StateDtype::fp32 ? "fp32" : s == StateDtype::bf16 ? "bf16" : "fp8"; }

// A device copy of `host`, starting `shift` elements into the tensor (which has that many more).
template <class T>
Tensor to_device(const std::vector<T>& host, DType dtype, int64_t shift = 0) {
  const int64_t count = static_cast<int64_t>(host.size() * sizeof(T) / dtype_size(dtype)) + shift;
  Tensor t = Tensor::empty({count}, dtype, kGpu);
  copy_bytes(static_cast<char*>(t.raw()) + shift * sizeof(T), kGpu, host.data(), Device::cpu(),
             host.size() * sizeof(T));
  return t;
}

template <class T>
std::vector<T> bytes_back(const Tensor& t);

// `host`'s size in elements read back from `t` after `shift` elements.
template <class T>
std::vector<T> shifted_back(const Tensor& t, int64_t shift) {
  std::vector<T> all = bytes_back<T>(t);
  return std::vector<T>(all.begin() + shift, all.end());
}

template <class T>
std::vector<T> bytes_back(const Tensor& t) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> host(t.nbytes() / sizeof(T));
  copy_bytes(host.data(), Device::cpu(), t.raw(), kGpu, t.nbytes());
  return host;
}

// Elements whose bits differ (0 when the vectors are bit-identical; sizes must match).
template <class T>
int64_t mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}

// Random segments over [0, n): cut points anywhere (not 128-aligned), alternating decay, every third
// without a compute copy; the compute copy packs the others. Returns the compute copy's length.
int64_t random_segments(int64_t n, std::vector<AdamWSegment>& segs) {
  const auto cuts = randint(8, static_cast<int32_t>(std::max<int64_t>(n, 1)));
  std::vector<int64_t> at(cuts.begin(), cuts.end());
  at.push_back(0);
  at.push_back(n);
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  int64_t compute = 0;
  for (size_t k = 0; k + 1 < at.size(); ++k) {
    const bool has_copy = k % 3 != 2;
    segs.push_back({at[k], at[k + 1], has_copy ? compute : -1, k % 2 ? 0.0f : 0.1f});
    if (has_copy) compute += at[k + 1] - at[k];
  }
  return compute;
}

}  // namespace

TEST_CASE("adamw matches the CPU update bit for bit - every state and gradient dtype", "[gpu][adamw]") {
  for (StateDtype s : {StateDtype::fp32, StateDtype::bf16, StateDtype::fp8})
    for (DType gd : {DType::f32, DType::bf16})
      // Shift 0: aligned buffers, the four-element kernel; shift 1: one element into each buffer, so that the
      // one-element kernel runs.
      for (auto [n, shift] : {std::pair<int64_t, int64_t>{1, 0}, {1000, 0}, {(1 << 20) + 77, 0}, {1000, 1},
                              {(1 << 16) + 5, 1}}) {
        INFO(name_of(s) << " state, " << dtype_name(gd) << " gradients, n " << n << ", shift " << shift);
        std::vector<AdamWSegment> segs;
        const int64_t ncompute = random_segments(n, segs);
        // Fresh inputs: parameters, gradients, and moments encoded in the state dtype.
        auto p = randn(n), g = randn(n), m = randn(n, 0.1f), v = randn(n, 0.1f);
        for (auto& x : v) x = x * x;  // second moments are non-negative
        std::vector<uint16_t> g16(n), m16(n), v16(n);
        std::vector<uint8_t> m8(n);
        std::vector<float> scales(moment_blocks(n));
        for (int64_t i = 0; i < n; ++i) {
          g16[i] = float_to_bf16(g[i]);
          m16[i] = float_to_bf16(m[i]);
          v16[i] = float_to_bf16(v[i]);
        }
        quantize_moment_blocks(m.data(), n, m8.data(), scales.data());
        std::vector<uint16_t> copy(ncompute, 0xFFFF);  // poisoned: NaN bits

        Tensor dp = to_device(p, DType::f32, shift), dseg = to_device(segs, DType::i32);
        Tensor dg = gd == DType::f32 ? to_device(g, DType::f32, shift) : to_device(g16, DType::bf16, shift);
        Tensor dm = s == StateDtype::fp32 ? to_device(m, DType::f32, shift)
                    : s == StateDtype::bf16 ? to_device(m16, DType::bf16, shift)
                                            : to_device(m8, DType::e4m3, shift);
        Tensor dv = s == StateDtype::fp32 ? to_device(v, DType::f32, shift) : to_device(v16, DType::bf16, shift);
        Tensor dscale = to_device(scales, DType::f32);
        Tensor dcopy = poisoned({std::max<int64_t>(ncompute, 1) + shift}, DType::bf16);

        AdamWBuffers host;
        host.params = p.data();
        host.grads = gd == DType::f32 ? static_cast<const void*>(g.data()) : g16.data();
        host.grad_dtype = gd;
        host.state_dtype = s;
        host.m = s == StateDtype::fp32   ? static_cast<void*>(m.data())
                 : s == StateDtype::bf16 ? static_cast<void*>(m16.data())
                                         : static_cast<void*>(m8.data());
        host.v = s == StateDtype::fp32 ? static_cast<void*>(v.data()) : static_cast<void*>(v16.data());
        host.m_scale = scales.data();
        host.params_bf16 = copy.data();
        host.segments = segs.data();
        host.num_segments = static_cast<int>(segs.size());
        host.n = n;
        // The rounding draws per flat index, not per local one; the range crosses 2^32 at local index 102 (n > 1),
        // where the index's high word, which the kernel hashes once per four elements, changes.
        host.index_base = (int64_t{1} << 32) - 102;
        AdamWBuffers dev = host;
        auto at = [shift](const Tensor& t) { return static_cast<char*>(t.raw()) + shift * dtype_size(t.dtype()); };
        dev.params = reinterpret_cast<float*>(at(dp));
        dev.grads = at(dg);
        dev.m = at(dm);
        dev.v = at(dv);
        dev.m_scale = dscale.data<float>();
        dev.params_bf16 = reinterpret_cast<uint16_t*>(at(dcopy));
        dev.segments = static_cast<const AdamWSegment*>(dseg.raw());

        OptimConfig cfg;
        cfg.beta1 = 0.9;
        cfg.beta2 = 0.95;
        cfg.eps = 1e-8;
        const AdamWHyper h = adamw_hyper(cfg, 3e-4, 0.5, 7);
        kernels::adamw_update(dev, h, kernels::compute_stream());
        adamw_update_cpu(host, h);

        CHECK(mismatches(shifted_back<float>(dp, shift), p) == 0);
        if (s == StateDtype::fp32) {
          CHECK(mismatches(shifted_back<float>(dm, shift), m) == 0);
          CHECK(mismatches(shifted_back<float>(dv, shift), v) == 0);
        } else {
          CHECK(mismatches(shifted_back<uint16_t>(dv, shift), v16) == 0);
          if (s == StateDtype::bf16) CHECK(mismatches(shifted_back<uint16_t>(dm, shift), m16) == 0);
          if (s == StateDtype::fp8) CHECK(mismatches(shifted_back<uint8_t>(dm, shift), m8) == 0);
          if (s == StateDtype::fp8) CHECK(mismatches(bytes_back<float>(dscale), scales) == 0);
        }
        std::vector<uint16_t> got = shifted_back<uint16_t>(dcopy, shift);
        got.resize(ncompute);
        CHECK(mismatches(got, copy) == 0);  // written exactly where segments have a compute copy
      }
}

TEST_CASE("global norm sums squares into a device scalar - f32 and bf16", "[gpu][global_norm]") {
  // Offsets 3 and 5 start between 16-byte boundaries: the kernel's scalar head and tail around its vector body.
  for (int64_t n : {1, 12345, 10 << 20}) {
    const auto x = round_bf16(randn(n));  // bf16 values, so both dtypes hold the same numbers
    for (DType dt : {DType::f32, DType::bf16}) {
      for (int64_t off : {0, 3, 5}) {
        if (off >= n) continue;
        INFO(dtype_name(dt) << " n " << n << " offset " << off);
        Tensor tx = upload(x, {n}, dt);
        Tensor out = Tensor::zeros({1}, DType::f32, kGpu);
        const size_t len = static_cast<size_t>(n - off);
        for (int rep = 0; rep < 2; ++rep) {  // accumulates
          if (dt == DType::f32)
            kernels::global_norm_squared(out.data<float>(), tx.data<float>() + off, len, kernels::compute_stream());
          else
            kernels::global_norm_squared(out.data<float>(), tx.data<__nv_bfloat16>() + off, len,
                                         kernels::compute_stream());
        }
        double ref = 0.0;
        for (int64_t i = off; i < n; ++i) ref += double(x[i]) * x[i];
        CHECK(std::abs(download(out)[0] - 2 * ref) / (2 * ref) < 1e-5);
      }
    }
  }
}
