// SPDX-License-Identifier: Apache-2.0
// What every backend does alike, written once (weft/transport/net.h).
#include "weft/common/log.h"
#include "weft/transport/net.h"

namespace weft {

bool Backend::validDevice(int dev, const char* op) const {
  if (dev >= 0 && dev < deviceCount()) return true;
  WEFT_WARN("{} on device {}, but there are {} devices", op, dev, deviceCount());
  return false;
}

}  // namespace weft
