// Host side of the device FP8 scaling state: allocation, scale uploads, statistics collection.
#include "fp8/device_meta.h"

#include <algorithm>
#include <bit>
#include <cstddef>

#include "core/check.h"
#include "core/graph_capture.h"

namespace fp8t {

namespace {
constexpr int64_t kSlotBytes = 3 * static_cast<int64_t>(sizeof(Fp8DeviceSlot));
// The slots are kept in an f32 tensor (8 floats per slot), so that a scale in them can be viewed as a tensor.
constexpr int64_t kSlotFloats = kSlotBytes / static_cast<int64_t>(sizeof(float));
constexpr int64_t kFloatsPerSlot = static_cast<int64_t>(sizeof(Fp8DeviceSlot) / sizeof(float));
static_assert(offsetof(Fp8DeviceSlot, scale_inv) == 0);
}

Fp8DeviceSlot* Fp8DeviceState::slots(Device device, const Fp8Metas& metas) {
  if (!buf_.defined()) {
    buf_ = Tensor::empty({kSlotFloats}, DType::f32, device, MemCategory::fp8_cache);
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

void Fp8DeviceState::mark_pending(Fp8Role role) {
  const auto r = static_cast<size_t>(role);
  const auto mark = [this, r] {
    pending_[r] = true;
    if (arena_) arena_->any_pending_ = true;
  };
  mark();
  on_graph_replay(mark);
}

Tensor Fp8DeviceState::scales_view(Fp8Role role) const {
  FP8T_CHECK(buf_.defined(), "Fp8DeviceState::scales_view before the slots exist (call slots() first)");
  static_assert(offsetof(Fp8DeviceSlot, scale) == sizeof(float));
  return buf_.slice_flat(kFloatsPerSlot * static_cast<int>(role), {2});
}

void Fp8DeviceState::collect(const Fp8Metas& metas) {
  if (arena_) {
    arena_->collect();
    return;
  }
  if (!buf_.defined() || (!pending_[0] && !pending_[1] && !pending_[2])) return;
  std::array<Fp8DeviceSlot, 3> host{};
  copy_bytes(host.data(), Device::cpu(), buf_.raw(), buf_.device(), kSlotBytes);
  for (size_t r = 0; r < 3; ++r) {
    if (!pending_[r]) continue;
    Fp8TensorMeta& m = *metas[r];
    m.record(host[r].amax, static_cast<int64_t>(host[r].saturated));
    m.recipe->take_device_scale(m, host[r].scale, host[r].scale_inv);
    if (m.recipe->scale_from_tensor()) uploaded_scale_[r] = m.scale;  // the device computed it
    pending_[r] = false;
  }
  for (auto& s : host) {
    s.amax = 0.0f;
    s.saturated = 0;
  }
  copy_bytes(buf_.raw(), buf_.device(), host.data(), Device::cpu(), kSlotBytes);
}

void Fp8DeviceArena::init(Device device, std::vector<std::pair<Fp8DeviceState*, Fp8Metas>> states) {
  FP8T_CHECK(!buf_.defined(), "Fp8DeviceArena::init called twice");
  states_ = std::move(states);
  if (states_.empty()) return;
  host_ = std::make_unique<HostStaging>(slots() * sizeof(Fp8DeviceSlot), device);
  std::fill_n(host(), slots(), Fp8DeviceSlot{});
  seen_saturated_.assign(slots(), 0);
  buf_ = Tensor::empty({kSlotFloats * static_cast<int64_t>(states_.size())}, DType::f32, device,
                       MemCategory::fp8_cache);
  for (size_t i = 0; i < states_.size(); ++i) {
    auto& [st, metas] = states_[i];
    FP8T_CHECK(!st->buf_.defined() && !st->arena_, "Fp8DeviceArena: a state already has device slots");
    st->buf_ = buf_.slice_flat(kSlotFloats * static_cast<int64_t>(i), {kSlotFloats});
    st->arena_ = this;
  }
  upload();
}

void Fp8DeviceArena::collect() {
  // Every attached state calls this (Fp8DeviceState::collect): after the first, nothing is pending, in O(1).
  if (!buf_.defined() || !any_pending_) return;
  any_pending_ = false;
  host_->wait();  // the last upload has been made
  copy_bytes(host(), Device::cpu(), buf_.raw(), buf_.device(), slots() * sizeof(Fp8DeviceSlot));
  for (size_t i = 0; i < states_.size(); ++i) {
    auto& [st, metas] = states_[i];
    for (size_t r = 0; r < 3; ++r) {
      Fp8DeviceSlot& slot = host()[3 * i + r];
      if (st->pending_[r]) {
        Fp8TensorMeta& m = *metas[r];
        // The device accumulates until upload(): count only saturations not recorded before.
        m.record(slot.amax, static_cast<int64_t>(slot.saturated - seen_saturated_[3 * i + r]));
        seen_saturated_[3 * i + r] = slot.saturated;
        m.recipe->take_device_scale(m, slot.scale, slot.scale_inv);
        st->pending_[r] = false;
      }
    }
  }
}

void Fp8DeviceArena::upload() {
  if (!buf_.defined()) return;
  collect();  // statistics still on the device are recorded first, never overwritten unseen
  host_->wait();
  for (size_t i = 0; i < states_.size(); ++i) {
    auto& [st, metas] = states_[i];
    for (size_t r = 0; r < 3; ++r) {
      Fp8DeviceSlot& slot = host()[3 * i + r];
      slot.scale = metas[r]->scale;
      slot.scale_inv = metas[r]->scale_inv;
      slot.amax = 0.0f;
      slot.amax_now = 0.0f;
      slot.saturated = 0;
      seen_saturated_[3 * i + r] = 0;
      st->uploaded_scale_[r] = metas[r]->scale;
    }
  }
  // Queued behind the optimizer's kernels: the next step's casts read these scales, in stream order.
  host_->copy_to(buf_.raw(), 0, slots() * sizeof(Fp8DeviceSlot));
}

}  // namespace fp8t
