// The device facts of kernels/device_facts.cuh, read from the runtime once per device.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "kernels/device_facts.cuh"

namespace fp8t::kernels {
namespace {

struct Facts {
  int sms = 0;          // streaming multiprocessors
  bool hopper = false;  // compute capability 9.0
};

Facts facts() {
  static PerDevice<Facts> cache;
  return cache.get([] {
    const int device = current_device();
    Facts f;
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    f.hopper = major == 9 && minor == 0;
    return f;
  });
}

}  // namespace

int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

int sm_count() { return facts().sms; }

int resident_blocks(const void* kernel, int threads, size_t dynamic_smem) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dynamic_smem));
  return sm_count() * std::max(per_sm, 1);
}

bool is_hopper() { return facts().hopper; }

}  // namespace fp8t::kernels
