// The device facts of kernels/device_facts.cuh, read from the runtime once per device.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

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

int resident_blocks_of(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> known;  // (device, kernel, threads) -> blocks
  const auto key = std::make_tuple(current_device(), kernel, threads);
  {
    std::lock_guard lock(mu);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  const int blocks = resident_blocks(kernel, threads);
  std::lock_guard lock(mu);
  known[key] = blocks;
  return blocks;
}

bool is_hopper() { return facts().hopper; }

}  // namespace fp8t::kernels
