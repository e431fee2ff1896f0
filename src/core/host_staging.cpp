// HostStaging: page-locked host memory and copies queued on the compute stream.
#include "core/host_staging.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"

#ifdef FP8T_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/stream.cuh"
#endif

namespace fp8t {

HostStaging::HostStaging(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
#ifdef FP8T_HAVE_CUDA
  if (device.is_cuda()) {
    // Pinning can fail (a locked-memory limit): the copies then still work, as from pageable memory.
    if (cudaMallocHost(&p_, bytes) == cudaSuccess) {
      pinned_ = true;
    } else {
      (void)cudaGetLastError();
      p_ = nullptr;
    }
    cudaEvent_t e = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    FP8T_CHECK(err == cudaSuccess, "HostStaging: cudaEventCreate failed: {}", cudaGetErrorString(err));
    event_ = e;
  }
#endif
  if (!p_) p_ = std::malloc(bytes);
  FP8T_CHECK(p_, "HostStaging: cannot allocate {} bytes of host memory", bytes);
  std::memset(p_, 0, bytes);
}

HostStaging::~HostStaging() {
#ifdef FP8T_HAVE_CUDA
  if (event_) {
    (void)cudaEventSynchronize(static_cast<cudaEvent_t>(event_));  // no copy may still read the memory
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  }
  if (pinned_) {
    (void)cudaFreeHost(p_);
    return;
  }
#endif
  std::free(p_);
}

void HostStaging::wait() {
#ifdef FP8T_HAVE_CUDA
  if (event_) {
    const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
    FP8T_CHECK(err == cudaSuccess, "HostStaging: waiting for a queued copy failed: {}", cudaGetErrorString(err));
  }
#endif
}

void HostStaging::copy_to(void* dst, size_t offset, size_t n) {
  FP8T_CHECK(offset + n <= bytes_, "HostStaging: bytes [{}, {}) of {}", offset, offset + n, bytes_);
  if (n == 0) return;
  const char* src = static_cast<const char*>(p_) + offset;
  if (device_.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
#ifdef FP8T_HAVE_CUDA
  const cudaStream_t s = kernels::compute_stream();
  cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s);
  FP8T_CHECK(err == cudaSuccess, "HostStaging: cudaMemcpyAsync of {} bytes failed: {}", n, cudaGetErrorString(err));
  err = cudaEventRecord(static_cast<cudaEvent_t>(event_), s);
  FP8T_CHECK(err == cudaSuccess, "HostStaging: cudaEventRecord failed: {}", cudaGetErrorString(err));
#else
  FP8T_FAIL("HostStaging: a copy to {} needs a CUDA build", device_.str());
#endif
}

}  // namespace fp8t
