// Host side of the device FP8 scaling state: allocation, scale uploads, statistics collection.
#include "fp8/device_meta.h"

#include <bit>
#include <cstddef>

#include "core/check.h"

namespace fp8t {

namespace {
constexpr int64_t kSlotBytes = 3 * static_cast<int64_t>(sizeof(Fp8DeviceSlot));
}

Fp8DeviceSlot* Fp8DeviceState::slots(Device device, const Fp8Metas& metas) {
  if (!buf_.defined()) {
    buf_ = Tensor::empty({kSlotBytes}, DType::e4m3, device, MemCategory::fp8_cache);  // raw bytes
    std::array<Fp8DeviceSlot, 3> host{};
    for (size_t r = 0; r < 3; ++r) {
      host[r].scale = metas[r]->scale;
      host[r].scale_inv = metas[r]->scale_inv;
      uploaded_scale_[r] = metas[r]->scale;
    }
    copy_bytes(buf_.raw(), device, host.data(), Device::cpu(), kSlotBytes);
  }
  FP8T_CHECK(buf_.device() == device, "FP8 scaling state lives on {} but the tensor is on {}", buf_.device().str(),
             device.str());
  auto* dev = static_cast<Fp8DeviceSlot*>(buf_.raw());
  for (size_t r = 0; r < 3; ++r) {
    if (std::bit_cast<uint32_t>(metas[r]->scale) == std::bit_cast<uint32_t>(uploaded_scale_[r])) continue;
    const float pair[2] = {metas[r]->scale_inv, metas[r]->scale};  // adjacent in the slot
    copy_bytes(&dev[r].scale_inv, device, pair, Device::cpu(), sizeof(pair));
    uploaded_scale_[r] = metas[r]->scale;
  }
  return dev;
}

void Fp8DeviceState::collect(const Fp8Metas& metas) {
  if (!buf_.defined() || (!pending_[0] && !pending_[1] && !pending_[2])) return;
  std::array<Fp8DeviceSlot, 3> host{};
  copy_bytes(host.data(), Device::cpu(), buf_.raw(), buf_.device(), kSlotBytes);
  for (size_t r = 0; r < 3; ++r) {
    if (!pending_[r]) continue;
    Fp8TensorMeta& m = *metas[r];
    m.record(host[r].amax, static_cast<int64_t>(host[r].saturated));
    if (m.scaling == Fp8Scaling::current) {
      m.scale = host[r].scale;
      m.scale_inv = host[r].scale_inv;
      uploaded_scale_[r] = m.scale;
    }
    pending_[r] = false;
  }
  for (auto& s : host) {
    s.amax = 0.0f;
    s.saturated = 0;
  }
  copy_bytes(buf_.raw(), buf_.device(), host.data(), Device::cpu(), kSlotBytes);
}

}  // namespace fp8t
