// SPDX-License-Identifier: Apache-2.0
// What the provider transports' RMA comms share (rma/provider_comm.h): the pieces that are not templates.
#include "rma/provider_comm.h"

namespace weft::rma {

const char* ringMsgName(uint8_t type) {
  switch (type) {
    case RingMsg::kHello: return "hello";
    case RingMsg::kRecord: return "window record";
    case RingMsg::kSignal: return "signal";
    case RingMsg::kError: return "error";
    default: return "unknown message";
  }
}

}  // namespace weft::rma
