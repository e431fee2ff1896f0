// Elementwise kernels (fill, add, scale, cast, residual, GELU, runs) against host loops and the CPU reference.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>

#include "util/gpu_test_util.h"
#include "core/tensor_ops.h"
#include "ops/add_cuda.h"
#include "ops/cpu/gelu.h"
#include "ops/gelu_cuda.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("fill - scale - add and cast on the GPU", "[gpu][elementwise]") {
  for (int64_t n : {1, 7, 1000, 100003}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor t = poisoned({n}, dt);
      fill_(t, 1.75f);
      for (float x : download(t)) REQUIRE(x == 1.75f);

      const auto a = round_bf16(randn(n)), b = round_bf16(randn(n));
      Tensor ta = upload(a, {n}, dt);
      scale_(ta, 0.5f);
      std::vector<float> ref(a);
      for (auto& x : ref) x *= 0.5f;
      CHECK(rel_err(download(ta), ref) < (dt == DType::f32 ? 1e-6 : 1e-2));

      for (DType src_dt : {DType::f32, DType::bf16}) {
        Tensor tb = upload(b, {n}, src_dt);
        Tensor tc = upload(a, {n}, dt);
        add_(tc, tb);
        std::vector<float> sum(n);
        for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
        CHECK(rel_err(download(tc), sum) < (dt == DType::f32 ? 1e-6 : 1e-2));
      }
      Tensor src = upload(a, {n}, dt);
      Tensor dst = poisoned({n}, dt == DType::f32 ? DType::bf16 : DType::f32);
      cast_into(dst, src);
      CHECK(rel_err(download(dst), a) < 1e-6);  // a is bf16-exact
    }
  }
}

TEST_CASE("sum_squares_into queues the value sum_squares returns", "[gpu][elementwise]") {
  // The step's end reads the gradient's squared norm this way beside the loss (GradientReducer::reduce_with_loss):
  // it must be the value sum_squares gives, over sub-ranges of f32 and bf16 buffers, into a poisoned slot (to f32
  // rounding: the kernel adds its blocks' sums with f32 atomics, in any order).
  for (int64_t n : {1, 1000, 100003}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO("n " << n << " " << dtype_name(dt));
      const Tensor t = upload(round_bf16(randn(n, 3.0f)), {n}, dt);
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, n}, {n / 3, n - n / 4}}) {
        Tensor out = poisoned({2}, DType::f32), slot = out.slice_flat(1, {1});
        sum_squares_into(t, begin, end, slot);
        const float expect = static_cast<float>(sum_squares(t, begin, end));
        CHECK(std::abs(download(out)[1] - expect) <= 1e-5f * expect);
      }
    }
  }
  Tensor out = poisoned({1}, DType::f32), wide = poisoned({2}, DType::f32);
  CHECK_THROWS(sum_squares_into(Tensor::zeros({4}, DType::f32), 0, 4, out));  // a CPU tensor
  CHECK_THROWS(sum_squares_into(upload(randn(4), {4}, DType::f32), 0, 4, wide));  // two elements
}

TEST_CASE("residual add matches a + b", "[gpu][elementwise]") {
  for (int64_t n : {8, 77 * 64 + 3, 1 << 20}) {
    const auto a = round_bf16(randn(n)), b = round_bf16(randn(n));
    Tensor out = poisoned({n}, DType::bf16);
    cuda_ops::add_forward(out, upload(a, {n}, DType::bf16), upload(b, {n}, DType::bf16));
    std::vector<float> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = a[i] + b[i];
    CHECK(rel_err(download(out), ref) < 1e-2);
  }
}

TEST_CASE("GELU forward and backward match the CPU reference", "[gpu][gelu]") {
  for (int64_t n : {5, 4096 + 3, 3 * 1024 * 768}) {
    const auto x = round_bf16(randn(n, 2.0f)), dy = round_bf16(randn(n));
    Tensor out = poisoned({n}, DType::bf16);
    Tensor tx = upload(x, {n}, DType::bf16);
    cuda_ops::gelu_forward(out, tx);
    std::vector<float> ref(n);
    cpu::gelu_forward(ref.data(), x.data(), n);
    CHECK(rel_err(download(out), ref) < 1e-2);

    std::vector<float> dx0 = round_bf16(randn(n, 0.5f)), dref(dx0);
    Tensor dx = upload(dx0, {n}, DType::bf16);
    cuda_ops::gelu_backward(dx, tx, upload(dy, {n}, DType::bf16));
    cpu::gelu_backward(dref.data(), x.data(), dy.data(), n);
    CHECK(rel_err(download(dx), dref) < 1e-2);
  }
}

TEST_CASE("add_runs_ adds f32 runs into bf16 as the host loop does, bit for bit", "[gpu][elementwise]") {
  // ParameterStore::commit_accumulators' one pass: 300 runs (two launches of at most kernels::kMaxAddRuns) of
  // lengths 1 to ~3000 at scattered offsets, the elements between them untouched.
  std::vector<AddRun> runs;
  int64_t dst = 5, src = 0;
  for (int r = 0; r < 300; ++r) {
    const int32_t n = 1 + (r * 7919) % 3001;
    runs.push_back({dst, static_cast<int32_t>(src), n});
    dst += n + r % 5;  // gaps of 0 to 4 elements
    src += n + (r % 3) * 4;
  }
  const auto d = round_bf16(randn(dst + 3, 2.0f)), s = randn(src);
  Tensor host_dst = upload(d, {dst + 3}, DType::bf16).to(Device::cpu());
  const Tensor host_src = upload(s, {src}, DType::f32).to(Device::cpu());
  Tensor dev_dst = host_dst.to(kGpu);
  const Tensor dev_src = host_src.to(kGpu);
  add_runs_(host_dst, host_src, runs);
  add_runs_(dev_dst, dev_src, runs);
  const Tensor back = dev_dst.to(Device::cpu());
  CUDA_CHECK(cudaDeviceSynchronize());
  REQUIRE(back.nbytes() == host_dst.nbytes());
  CHECK(std::memcmp(back.raw(), host_dst.raw(), back.nbytes()) == 0);
  int64_t changed = 0;  // the host loop did add: the runs' elements moved, the gaps did not
  const std::vector<float> before = round_bf16(d), after = host_dst.to_float_vector();
  for (size_t i = 0; i < before.size(); ++i) changed += before[i] != after[i];
  CHECK(changed > src / 2);
  CHECK(after[0] == before[0]);
  CHECK_THROWS(add_runs_(dev_dst, dev_src, {{dst, 0, 4}}));  // past the end of dst
}

TEST_CASE("zero_runs_ zeroes the runs of f32 and bf16 buffers as the host loop does, bit for bit",
          "[gpu][elementwise]") {
  // ParameterStore::zero_grads_deferred's one pass: 300 runs (two launches of at most kernels::kMaxAddRuns) of
  // lengths 1 to ~3000 at scattered offsets, the elements between them untouched.
  std::vector<ZeroRun> runs;
  int64_t end = 5, zeroed = 0;
  for (int r = 0; r < 300; ++r) {
    const int64_t n = 1 + (r * 7919) % 3001;
    runs.push_back({end, n});
    end += n + r % 5;  // gaps of 0 to 4 elements
    zeroed += n;
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const auto v = randn(end + 3, 2.0f);
    Tensor host = upload(v, {end + 3}, dt).to(Device::cpu());
    Tensor dev = host.to(kGpu);
    zero_runs_(host, runs);
    zero_runs_(dev, runs);
    const Tensor back = dev.to(Device::cpu());
    CUDA_CHECK(cudaDeviceSynchronize());
    REQUIRE(back.nbytes() == host.nbytes());
    CHECK(std::memcmp(back.raw(), host.raw(), back.nbytes()) == 0);
    const std::vector<float> after = host.to_float_vector();
    int64_t zeros = 0;  // the host loop zeroed the runs and left the gaps
    for (float x : after) zeros += x == 0.0f;
    CHECK(zeros == zeroed);
    CHECK(after[0] != 0.0f);
    CHECK(after.back() != 0.0f);
    CHECK_THROWS(zero_runs_(dev, {{end, 4}}));  // past the end
  }
}
