// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the NCCL handle decoder (what a peer, or garbage, puts in the 128-byte handle NCCL carries).
// Any input: a clean refusal with a reason, or a handle that re-encodes to the same bytes.
#include <cstring>
#include <string>

#include "weft/transport/handle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t in[weft::kHandleSize] = {};
  std::memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
  weft::WireHandle h;
  std::string why;
  if (weft::WireHandle::decode(in, &h, &why) == weft::Status::kOk) {
    if (h.addrLen > weft::WireHandle::kMaxAddr) __builtin_trap();
    uint8_t again[weft::kHandleSize] = {};
    h.encode(again);
    weft::WireHandle h2;
    if (weft::WireHandle::decode(again, &h2, &why) != weft::Status::kOk) __builtin_trap();
    if (h2.token != h.token || h2.addrLen != h.addrLen || std::memcmp(h2.addr.data(), h.addr.data(), h.addrLen) != 0)
      __builtin_trap();
  } else if (why.empty()) {
    __builtin_trap();  // every refusal says why
  }
  return 0;
}
