// SPDX-License-Identifier: Apache-2.0
// The benchmark's reference: the same message patterns written directly against libfabric, with none of weft's
// code in between, on the provider and interface the plugin under test uses. Two flavours:
// - tagged: fi_tsend / fi_trecv with pre-posted receives (what a plain send/receive transport can reach);
// - rma: the receiver sends one small credit (address, key, slot) per receive and the sender RMA-writes with
//   remote completion data (what an RDMA-write transport can reach; the minimum our rdma protocol adds to).
// Manual progress, like the plugin. split: one endpoint (with its completion queue and address vector) per
// direction, the layout a plugin gets from NCCL's separate send and receive comms when it opens one endpoint
// per comm; otherwise one endpoint carries both directions (the best case for ping-pong: one queue to poll).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft::harness {

class Oob;

// One bidirectional connection as the benchmark patterns drive it. Requests are opaque; nullptr from a post
// means "not now, retry" (back-pressure), as an NCCL plugin's NULL request does.
class Link {
 public:
  virtual ~Link() = default;
  virtual void* reg(void* buf, size_t size, bool forSend) = 0;
  virtual void dereg(void* mh, bool forSend) = 0;
  virtual void* postSend(void* data, size_t size, void* mh) = 0;
  virtual void* postRecv(void* data, size_t size, void* mh) = 0;
  // True when done (*size: bytes received or sent). Throws on error.
  virtual bool test(void* req, int* size) = 0;
};

enum class RawMode { kTagged, kRma };
const char* rawModeName(RawMode m);

// Opens `count` raw links to the peer process, exchanging endpoint names over `oob` (both processes call this
// with the same arguments). Throws with the reason on failure.
std::vector<std::unique_ptr<Link>> openRawLinks(Oob& oob, const std::string& provider, const std::string& iface,
                                                RawMode mode, int count, bool split, const std::string& label);

}  // namespace weft::harness
