// SPDX-License-Identifier: Apache-2.0
// What every backend does alike, written once (weft/transport/net.h).
#include <atomic>

#include "weft/common/log.h"
#include "weft/transport/net.h"

namespace weft {

namespace {
std::atomic<int> gNetTable{0};  // 0: not said (tools that drive a backend directly): the v12 limit
}  // namespace

void setNetTableVersion(int version) noexcept { gNetTable.store(version, std::memory_order_relaxed); }

int maxDevsPerNic() noexcept {
  int v = gNetTable.load(std::memory_order_relaxed);
  return v == 0 || v >= 12 ? kMaxDevsPerNic : kMaxDevsPerNicBeforeV12;
}

bool Backend::validDevice(int dev, const char* op) const {
  if (dev >= 0 && dev < deviceCount()) return true;
  WEFT_WARN("{} on device {}, but there are {} devices", op, dev, deviceCount());
  return false;
}

}  // namespace weft
