// SPDX-License-Identifier: Apache-2.0
// How the RMA core reaches a window's memory: memcpy and atomics for host memory, the CUDA driver's copies for GPU
// memory (never a CPU load or store through a device pointer).
#include <cstring>

#include "rma/rma.h"
#include "weft/common/cuda_shim.h"

namespace weft::rma {

bool inRange(uint64_t size, uint64_t off, uint64_t n) { return off <= size && n <= size - off; }

bool writeWindow(Window& w, uint64_t off, const void* src, size_t n, std::string* err) {
  if (n == 0) return true;
  if (!w.cuda) {
    std::memcpy(w.base + off, src, n);
    return true;
  }
  return cuda::copyToDevice(w.base + off, src, n, err);
}

bool readWindow(void* dst, const Window& w, uint64_t off, size_t n, std::string* err) {
  if (n == 0) return true;
  if (!w.cuda) {
    std::memcpy(dst, w.base + off, n);
    return true;
  }
  return cuda::copyFromDevice(dst, w.base + off, n, err);
}

bool applySignal(Window& w, uint64_t off, SignalOp op, uint64_t value, std::string* err) {
  const uint64_t add = op == SignalOp::kInc ? 1 : value;
  if (!w.cuda) {
    // Release: the bytes of the put before it (and of every earlier put) are visible to whoever sees the signal.
    __atomic_fetch_add(reinterpret_cast<uint64_t*>(w.base + off), add, __ATOMIC_RELEASE);
    return true;
  }
  uint64_t next = 0;
  if (!w.shadow.empty()) {
    uint64_t& slot = w.shadow[off / 8];
    slot += add;
    next = slot;
  } else {
    if (!cuda::copyFromDevice(&next, w.base + off, sizeof(next), err)) return false;
    next += add;
  }
  return cuda::copyToDevice(w.base + off, &next, sizeof(next), err);
}

}  // namespace weft::rma
