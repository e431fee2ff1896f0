// Host memory that the device copies from in the compute stream's order, so that the host does not wait for the
// device's queued work: a plain cudaMemcpy from pageable memory first waits for the stream to drain, which at the
// start of a step (the batch) or after the optimizer (the FP8 scales) leaves the device idle while the host then
// queues the next forward pass from an empty queue.
#pragma once
#include <cstddef>

#include "core/device.h"

namespace fp8t {

// Page-locked on a CUDA device (the queued copy returns at once), plain memory otherwise (the copy is a memcpy).
// The host writes the memory only after wait(): a queued copy reads it when the stream reaches it.
class HostStaging {
 public:
  HostStaging(size_t bytes, Device device);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  void* data() { return p_; }
  size_t size() const { return bytes_; }
  // Blocks until the stream has made every copy queued from this memory; the host may then write it.
  void wait();
  // Queues a copy of bytes [offset, offset + n) to dst (memory of the staging's device) on the compute stream.
  void copy_to(void* dst, size_t offset, size_t n);

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu();
  bool pinned_ = false;
  void* event_ = nullptr;  // cudaEvent_t recorded after the last queued copy; null before the first
};

}  // namespace fp8t
