// SPDX-License-Identifier: Apache-2.0
// The devices a backend offers NCCL, by index: each slot a device and the properties NCCL sees. A slot either owns
// its device or views one another slot owns (NCCL's virtual device of a single member). Slots are appended, never
// changed or removed; the count is published with release ordering, so deviceCount/props/device take no lock.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "weft/transport/net.h"

namespace weft {

template <typename Device>
class DeviceSlots {
 public:
  static constexpr int kMaxDevices = 256;

  int count() const { return count_.load(std::memory_order_acquire); }
  const DeviceProps& props(int i) const { return slots_[i].props; }
  Device& device(int i) const { return *slots_[i].dev; }
  // Devices owned (physical ones and fusions), as opposed to slots.
  size_t owned() const { return devices_.size(); }

  // Slots are added under mutex() (makeVDevice comes from NCCL's threads; discovery runs alone). Each returns the
  // new slot's index, or -1 when every slot is taken.
  std::mutex& mutex() { return mutex_; }
  int add(std::unique_ptr<Device> dev, const DeviceProps& props) {
    const int i = count_.load(std::memory_order_relaxed);
    if (i >= kMaxDevices) return -1;
    slots_[i] = Slot{dev.get(), props};
    devices_.push_back(std::move(dev));
    count_.store(i + 1, std::memory_order_release);
    return i;
  }
  int addView(int of, const DeviceProps& props) {
    const int i = count_.load(std::memory_order_relaxed);
    if (i >= kMaxDevices) return -1;
    slots_[i] = Slot{slots_[of].dev, props};
    count_.store(i + 1, std::memory_order_release);
    return i;
  }
  // NCCL's virtual device of the single member `of`: a view of it whose props name it as the member.
  int addMemberView(int of) {
    DeviceProps p = slots_[of].props;
    p.vdevCount = 1;
    p.vdevs[0] = of;
    return addView(of, p);
  }

 private:
  struct Slot {
    Device* dev = nullptr;
    DeviceProps props;
  };
  std::vector<std::unique_ptr<Device>> devices_;
  std::array<Slot, kMaxDevices> slots_;
  std::atomic<int> count_{0};
  std::mutex mutex_;  // serializes add() and addView()
};

// A backend whose devices are DeviceSlots (native verbs, weft's TCP): the count and properties NCCL asks for come
// from them.
template <typename Device>
class SlottedBackend : public Backend {
 public:
  static constexpr int kMaxDevices = DeviceSlots<Device>::kMaxDevices;
  int deviceCount() const override { return slots_.count(); }
  const DeviceProps& props(int dev) const override { return slots_.props(dev); }

 protected:
  DeviceSlots<Device> slots_;
};

}  // namespace weft
