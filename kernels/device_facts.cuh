// Facts about the current CUDA device (SM count, Hopper or not) and PerDevice, a value made once per device: a
// process may drive GPUs of different kinds, so nothing read from or set on one device is kept for the process.
#pragma once
#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

namespace fp8t::kernels {

// The current device's index (cudaGetDevice).
int current_device();

// Streaming multiprocessors of the current device.
int sm_count();

// Blocks of `kernel` (a __global__ function) resident at once on the current device with `threads` threads and
// `dynamic_smem` bytes of dynamic shared memory each: the occupancy calculator's blocks per SM times the SMs, at
// least one per SM. Launchers keep it in a PerDevice: it is asked of the runtime on every call.
int resident_blocks(const void* kernel, int threads, size_t dynamic_smem = 0);

// resident_blocks without dynamic shared memory, asked of the runtime once per device, kernel and thread count: for
// launchers that choose among many kernel variants at run time (no PerDevice per variant).
int resident_blocks_of(const void* kernel, int threads);

// Whether the current device is a Hopper (compute capability 9.0), the one device that runs sm_90a code.
bool is_hopper();

// One T per device, made by make() on the first get() on that device; thread-safe. For what a launcher sets up or
// measures once per kernel and device: a kernel's dynamic shared memory limit, its blocks resident at once.
template <typename T>
class PerDevice {
 public:
  template <typename Make>
  T get(Make make) {
    const int device = current_device();
    std::lock_guard lock(mu_);
    if (static_cast<int>(values_.size()) <= device) values_.resize(device + 1);
    if (!values_[device]) values_[device] = make();
    return *values_[device];
  }

 private:
  std::mutex mu_;
  std::vector<std::optional<T>> values_;  // by device index
};

}  // namespace fp8t::kernels
