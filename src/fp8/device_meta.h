// Device copy of the FP8 scaling state of one linear's three tensors (input, weight, output
// gradient), for the CUDA path: the cast kernels read the scale and accumulate the step's amax and
// saturation count there, and cuBLASLt reads scale_inv through its A/B scale pointers.
//
// Host <-> device protocol (one host sync per optimizer step): the host Fp8TensorMeta keeps the
// amax history and computes delayed scales; collect() copies the step's device statistics into the
// metas once (before the amax all-reduce and end_step), and slots() uploads any host scale that
// changed (end of step, checkpoint load) before the next cast. Current scaling computes its scale
// on the device (kernels/fp8_cast.cuh) and collect() mirrors it back for metrics.
#pragma once
#include <array>
#include <memory>
#include <utility>
#include <vector>
#include <cstdint>

#include "core/host_staging.h"
#include "core/tensor.h"
#include "fp8/scaling.h"

namespace fp8t {

// One tensor's device state; the layout is shared with the kernels through raw pointers. scale_inv
// comes first and slots are 16-byte aligned: cuBLASLt rejects ("not supported") FP8 GEMMs whose A/B
// scale pointers are only 4-byte aligned.
struct alignas(16) Fp8DeviceSlot {
  float scale_inv = 1.0f;  // 1 / scale: the GEMM's A/B scale
  float scale = 1.0f;      // multiplies the tensor before the cast
  float amax = 0.0f;       // this step's max |x| over the recorded casts (atomicMax on the bits)
  float amax_now = 0.0f;   // current scaling: the amax of the tensor being cast
  unsigned long long saturated = 0;  // this step's count of |x * scale| > fmax
  unsigned long long unused = 0;
};
static_assert(sizeof(Fp8DeviceSlot) == 32);

enum class Fp8Role : int { input = 0, weight = 1, grad_output = 2 };
using Fp8Metas = std::array<Fp8TensorMeta*, 3>;  // indexed by Fp8Role

class Fp8DeviceArena;

class Fp8DeviceState {
 public:
  // The three device slots (indexed by Fp8Role), allocated in MemCategory::fp8_cache on first use;
  // host scales that changed since they were last uploaded are uploaded first (stream-ordered).
  Fp8DeviceSlot* slots(Device device, const Fp8Metas& metas);
  // A two-element f32 view (scale_inv, scale) of `role`'s slot (after slots()): element 0 is the scale_inv a
  // QuantizedTensor cast with this state carries, element 1 the scale a re-cast reads.
  Tensor scales_view(Fp8Role role) const;
  // A cast that accumulated statistics into `role`'s slot was launched.
  // Also again at every replay of a CUDA graph that captured the cast (core/graph_capture.h).
  void mark_pending(Fp8Role role);
  // Moves the device statistics of the roles with casts since the last call into the host metas
  // (Fp8TensorMeta::record; current scaling also takes the device scale) and zeroes them on the
  // device. Synchronizes the host with the device; a no-op when nothing is pending.
  void collect(const Fp8Metas& metas);

 private:
  friend class Fp8DeviceArena;
  Tensor buf_;  // 3 Fp8DeviceSlot as bytes, on the device (a slice of the arena when attached)
  Fp8DeviceArena* arena_ = nullptr;
  std::array<float, 3> uploaded_scale_{};
  std::array<bool, 3> pending_{};
};

// The device slots of every FP8 linear of a model in one buffer, so that a step moves its
// statistics and scales with one device-to-host and one host-to-device copy in all, at the end of
// the step, instead of a few small synchronizing copies per linear (some of them in the middle of
// the forward pass, where each one drained the GPU).
class Fp8DeviceArena {
 public:
  // Allocates the slots of `states` on `device`, uploads their current scales and attaches them
  // (their slots() then point into the arena). The states and metas must outlive the arena's use.
  void init(Device device, std::vector<std::pair<Fp8DeviceState*, Fp8Metas>> states);
  bool active() const { return buf_.defined(); }
  // Every attached state's pending statistics into its metas (one device-to-host copy). The device
  // keeps accumulating until upload() zeroes it, and a state's statistics are recorded once: its
  // pending flags clear here. A no-op when nothing is pending.
  void collect();
  // Collects what is pending, then writes every meta's scale and zeroed statistics to the device
  // (one host-to-device copy). Call after the metas' end_step, once per optimizer step.
  void upload();

 private:
  // The host's copy of the slots: uploads are queued on the compute stream from it (core/host_staging.h), so the
  // step's end does not wait for the optimizer's kernels to finish.
  Fp8DeviceSlot* host() { return static_cast<Fp8DeviceSlot*>(host_->data()); }
  size_t slots() const { return 3 * states_.size(); }

  Tensor buf_;
  std::unique_ptr<HostStaging> host_;
  std::vector<unsigned long long> seen_saturated_;  // per slot, already recorded since the last upload
  std::vector<std::pair<Fp8DeviceState*, Fp8Metas>> states_;
  friend class Fp8DeviceState;
  bool any_pending_ = false;  // some attached state's pending_ is set (its mark_pending sets this too)
};

}  // namespace fp8t
