// One compute stream per device, created on first use.
#include <mutex>
#include <vector>

#include "kernels/stream.cuh"
#include "core/cuda_check.h"

namespace fp8t::kernels {

cudaStream_t compute_stream() {
  static std::mutex mu;
  static std::vector<CudaStream> streams;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard lk(mu);
  if (static_cast<int>(streams.size()) <= dev) streams.resize(dev + 1);
  if (!streams[dev].get()) streams[dev] = make_stream();
  return streams[dev].get();
}

}  // namespace fp8t::kernels
