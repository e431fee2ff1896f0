// HostStaging on the GPU: copies queued behind the device's work read what the host wrote before each wait().
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "core/cuda_check.h"
#include "core/host_staging.h"
#include "kernels/stream.cuh"
#include "util/gpu_test_util.h"

using namespace fp8t;
using namespace fp8t::test;

TEST_CASE("host staging: each queued copy reads the value written before it, behind a busy stream",
          "[gpu][staging]") {
  const cudaStream_t s = kernels::compute_stream();
  constexpr int kCopies = 64;
  Tensor dst = Tensor::zeros({kCopies}, DType::i32, kGpu);
  Tensor busy = Tensor::empty({int64_t{1} << 28}, DType::f32, kGpu);  // 1 GiB, memset ahead of the copies
  HostStaging staging(sizeof(int32_t), kGpu);
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (int rep = 0; rep < 16; ++rep) CUDA_CHECK(cudaMemsetAsync(busy.raw(), rep, busy.nbytes(), s));  // ~5 ms
  for (int i = 0; i < kCopies; ++i) {
    staging.wait();  // without it the host would overwrite the value before the stream copies it
    const int32_t v = 1000 + i;
    std::memcpy(staging.data(), &v, sizeof(v));
    staging.copy_to(static_cast<int32_t*>(dst.raw()) + i, 0, sizeof(v));
    // The first copy returned with the memsets still queued: the host did not wait for the stream (a copy from
    // pageable memory would have).
    if (i == 0) CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<int32_t> got(kCopies);
  CUDA_CHECK(cudaMemcpy(got.data(), dst.raw(), got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < kCopies; ++i) bad += got[i] != 1000 + i;
  CHECK(bad == 0);
}
