// SPDX-License-Identifier: Apache-2.0
// Timing of weft's own connections, wrapped around the transport calls by the plugin layer (net_plugin.cc): with
// WEFT_TIMING on, every comm gets a per-connection record (bytes, messages, post-to-completion latency); with
// WEFT_TIMING=net each message is also reported to NCCL's profiler as a net-plugin event (v10+ tables hand us the
// callback and a per-step pHandle), decoded by any profiler through weftProfilerNetDescr_v1_t. What it keeps per
// comm and per request lives in the room the transport interface leaves the layer above (Comm::timingRecord,
// Request::timingSlot): the backends know nothing of it.
#pragma once

#include <cstdint>
#include <string>

#include "weft/nccl/common.h"
#include "weft/transport/net.h"

namespace weft {
namespace rma {
class RmaComm;
}

void setProfilerCallback(ncclProfilerCallback_t cb);
// A comm was made / is closing (its record is written then).
void timingOpen(Comm* c, bool isSend);
void timingClose(Comm* c);
// After a successful post. phandles: one per buffer (NULL entries, or NULL altogether, open no event: NCCL
// dereferences them unchecked, docs/nccl-semantics.md §net-events).
void timingPost(Comm* c, Request* r, uint64_t bytes, int tag, bool isSend, int n, void* const* phandles);
// A registration on the comm: the first of GPU memory names the connection's GPU where its open could not.
void timingRegMr(Comm* c, const void* data, int type);
// The request was posted with timing on and test() has not yet reported it.
bool timingPending(Request* r);
// When test() reported the request done (or failed).
void timingDone(Request* r, const int* sizes);
// A device-API comm connected (rma_plugin.cc): with WEFT_TIMING on, its ledger goes in the dumps (weft inspect,
// stall dumps; docs/hangs.md). The id closes it (0: none), before the comm closes.
uint32_t timingRmaOpen(rma::RmaComm* c, const std::string& device);
void timingRmaClose(uint32_t id);

}  // namespace weft
